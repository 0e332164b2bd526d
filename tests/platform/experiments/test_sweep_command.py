"""`manage.py sweep FILE --user NAME`: the sweep API from the command line, axes included; bad
input names every field and rule, exits 2 and queues nothing."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from support import TINY_CONFIG

from experiments.models import Experiment, Run

pytestmark = pytest.mark.django_db


def sweep_file(tmp_path, **fields):
    body = {"name": "from the shell", "team": "team-a", "config": TINY_CONFIG, "presets": ["m2po"], **fields}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(body))
    return path


def test_a_sweep_file_is_queued_with_its_axes(tmp_path, team, capsys):
    path = sweep_file(tmp_path, seeds=[0, 1], axes={"algorithm.params.m2po_tau": [0.01, 0.04]})
    call_command("sweep", str(path), "--user", "alice")
    experiment = Experiment.objects.get(name="from the shell")
    assert f"experiment {experiment.pk} (from the shell): 4 runs queued" in capsys.readouterr().out
    assert sorted(r.config["algorithm"]["params"]["m2po_tau"] for r in experiment.runs.all()) == [
        0.01,
        0.01,
        0.04,
        0.04,
    ]


@pytest.mark.parametrize(
    ("fields", "shown"),
    [
        (
            {"config": {**TINY_CONFIG, "algorithm": {"params": {"m2po_tau": 0}}}},
            "algorithm.params.m2po_tau: m2po_tau must be > 0",
        ),
        (
            {"config": {**TINY_CONFIG, "optimizer": {"epochs": 12}}},
            "optimizer.epochs: Input should be less than or equal to 8",
        ),
        (
            {"axes": {"optimizer.minibatches": [1, 5]}},
            "axes.optimizer.minibatches: optimizer.minibatches = 5",
        ),
        ({"seeds": "zero"}, "seeds: Input should be a valid list"),
    ],
)
def test_bad_input_names_the_field_and_queues_nothing(tmp_path, team, fields, shown):
    before = Run.objects.count()
    with pytest.raises(CommandError) as caught:
        call_command("sweep", str(sweep_file(tmp_path, **fields)), "--user", "alice")
    assert shown in str(caught.value) and caught.value.returncode == 2
    assert Run.objects.count() == before
