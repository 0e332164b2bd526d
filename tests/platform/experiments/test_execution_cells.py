"""A sweep's staleness axis takes execution cells: schedules run simulated or distributed (per
sweep, or per cell through the API and templates) and async cells with their bound (the form's
"Async bounds"); bad cells are refused naming the field and the rule."""

from __future__ import annotations

import pytest
from django.urls import reverse
from support import TINY_CONFIG, sweep_form

from experiments import sweeps
from experiments.forms import initial_from_spec
from experiments.models import Experiment

pytestmark = pytest.mark.django_db

DISTRIBUTED = {**TINY_CONFIG, "execution": {"mode": "distributed", "rollout_workers": 2}}


def labels(grid: sweeps.Sweep) -> list[tuple[str, str, int | None, int]]:
    return [
        (c.staleness_label, c.execution.mode, c.execution.max_staleness, c.execution.rollout_workers)
        for c in grid.configs
    ]


def test_async_cells_sit_beside_schedules_and_each_cell_may_set_its_mode():
    grid = sweeps.expand(
        DISTRIBUTED,
        ["grpo"],
        [
            {},
            {"sync_offset": 2},
            {"sync_offset": 2, "mode": "simulated"},
            {"mode": "async", "max_staleness": 4},
        ],
        [0],
    )
    assert labels(grid) == [
        ("on-policy (distributed)", "distributed", None, 2),
        ("sync_offset=2 (distributed)", "distributed", None, 2),
        ("sync_offset=2", "simulated", None, 1),  # a simulated cell has no rollout workers
        ("async ≤ 4", "async", 4, 2),
    ]
    assert [c.staleness.label for c in grid.configs] == [
        "on-policy",
        "sync_offset=2",
        "sync_offset=2",
        "on-policy",
    ]
    # An async cell's bound defaults to 1, and a sweep in async mode still works as before.
    assert labels(sweeps.expand(TINY_CONFIG, ["grpo"], [{"mode": "async"}], [0])) == [
        ("async ≤ 1", "async", 1, 1)
    ]
    legacy = {**TINY_CONFIG, "execution": {"mode": "async", "max_staleness": 3}}
    assert labels(sweeps.expand(legacy, ["grpo"], [{}], [0])) == [("async ≤ 3", "async", 3, 1)]


@pytest.mark.parametrize(
    ("cells", "field", "message"),
    [
        (
            [{"mode": "async", "sync_offset": 2}],
            "staleness.async",
            "an async cell measures its own staleness",
        ),
        ([{"max_staleness": 2}], "staleness.async", "max_staleness is the bound of an async cell"),
        (
            [{"mode": "async", "max_staleness": -1}],
            "staleness.async",
            "max_staleness: Input should be greater",
        ),
        (
            [{"mode": "fast"}],
            "staleness",
            "mode: Input should be 'simulated', 'distributed' or 'async'",
        ),
        ([{"mode": "fast", "sync_offset": 2}], "staleness.sync_offset", "mode: Input should be"),
        (
            [{"mode": "async"}, {"mode": "async", "max_staleness": 1}],
            "staleness.async",
            "is the same setting",
        ),
        ([{}, {"mode": "simulated"}], "staleness", "is the same setting as on-policy (on-policy)"),
        ([{"sync_offset": -2}], "staleness.sync_offset", "greater than or equal to 0"),
        ([{"sync_offset": 2, "speed": 1}], "staleness.speed", "Extra inputs are not permitted"),
    ],
)
def test_bad_cells_name_their_field_and_rule(cells, field, message):
    with pytest.raises(sweeps.SweepError) as caught:
        sweeps.expand(TINY_CONFIG, ["grpo"], cells, [0])
    assert any(name == field and message in text for name, text in caught.value.errors), caught.value.errors


def test_the_same_schedule_in_both_modes_is_two_cells():
    grid = sweeps.expand(
        TINY_CONFIG, ["grpo"], [{"sync_offset": 2}, {"sync_offset": 2, "mode": "distributed"}], [0]
    )
    assert [c.staleness_label for c in grid.configs] == ["sync_offset=2", "sync_offset=2 (distributed)"]


def test_the_form_adds_async_cells_and_counts_them(alice_client, team):
    form = sweep_form(
        team,
        "axis",
        presets=["grpo", "reinforce"],
        seeds="0, 1",
        fields={
            "sync_offsets": "2",
            "async_bounds": "2, 4",
            "steps": "6",
            "rollout.group_size": "4",
        },
    )
    preview = alice_client.post(reverse("submit-sweep"), {**form, "preview": "1"})
    assert "This sweep makes 16 runs" in preview.content.decode()
    response = alice_client.post(reverse("submit-sweep"), form)
    assert response.status_code == 302, response.context["form"].errors
    experiment = Experiment.objects.get(name="axis")
    assert sorted({r.staleness for r in experiment.runs.all()}) == [
        "async ≤ 2",
        "async ≤ 4",
        "on-policy",
        "sync_offset=2",
    ]
    # "Clone this experiment" fills the form with the same cells.
    initial, warnings = initial_from_spec(experiment.spec)
    assert (initial["async_bounds"], initial["sync_offsets"], initial["on_policy"], warnings) == (
        "2, 4",
        "2",
        True,
        [],
    )

    bad = alice_client.post(reverse("submit-sweep"), {**form, "async_bounds": "two"})
    assert "async bounds must be whole numbers" in bad.context["form"].errors["async_bounds"][0]


def test_a_cell_in_another_mode_than_the_sweeps_is_kept_by_the_api_and_named_on_the_form():
    spec = {
        "config": {},
        "presets": ["grpo"],
        "staleness": [{}, {"sync_offset": 2, "mode": "distributed"}],
        "seeds": [0],
    }
    initial, warnings = initial_from_spec(spec)
    assert initial["on_policy"] is True and initial["sync_offsets"] == ""
    assert warnings == [
        "the staleness cell {'sync_offset': 2, 'mode': 'distributed'} runs distributed, and the form runs "
        "every schedule cell in the sweep's mode (simulated); submit it through the API"
    ]


def test_the_form_runs_each_schedule_in_both_modes_on_request(alice_client, team):
    form = sweep_form(
        team,
        "both",
        fields={
            "sync_offsets": "2",
            "both_modes": "on",
            "async_bounds": "2",
            "steps": "6",
            "rollout.group_size": "4",
        },
    )
    response = alice_client.post(reverse("submit-sweep"), form)
    assert response.status_code == 302, response.context["form"].errors
    experiment = Experiment.objects.get(name="both")
    assert sorted(r.staleness for r in experiment.runs.all()) == [
        "async ≤ 2",
        "on-policy",
        "on-policy (distributed)",
        "sync_offset=2",
        "sync_offset=2 (distributed)",
    ]
    initial, warnings = initial_from_spec(experiment.spec)
    assert (
        initial["both_modes"],
        initial["on_policy"],
        initial["sync_offsets"],
        initial["async_bounds"],
    ) == (
        True,
        True,
        "2",
        "2",
    )
    assert warnings == []
