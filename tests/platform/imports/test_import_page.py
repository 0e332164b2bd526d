"""The import page of an experiment: the form with each tool's mapping shown, an upload that becomes
a run (and the same file again, nothing new), a damaged file or a bad mapping line shown beside its
field with nothing stored, an oversized upload cut off (413), another team's experiment a 404."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from import_helpers import T0, prime_rl_file
from sample_experiments import make_finished_experiment
from support import new_team_member

from experiments.models import Run
from experiments.progress import sweep_progress
from imports.models import Import

pytestmark = pytest.mark.django_db


@pytest.fixture
def experiment(team, alice):
    return make_finished_experiment(
        team, alice, name="grid", presets=("grpo",), staleness=({}, {"sync_offset": 2}), seeds=(0,)
    )


def post(client, experiment, path, **fields):
    with path.open("rb") as stream:
        return client.post(
            f"/experiments/{experiment.pk}/import/", {"file": stream, "tool": "prime-rl", **fields}
        )


def test_the_form_shows_the_cells_and_the_mappings(alice_client, experiment):
    page = alice_client.get(f"/experiments/{experiment.pk}/").content.decode()
    assert f'href="/experiments/{experiment.pk}/import/"' in page
    form = alice_client.get(f"/experiments/{experiment.pk}/import/")
    html = form.content.decode()
    assert form.status_code == 200 and 'enctype="multipart/form-data"' in html
    assert '<option value="on-policy">' in html and '<option value="sync_offset=2">' in html
    assert "<code>loss/mean</code></td><td><code>loss</code>" in html


CELL = {"preset": "grpo", "staleness": "on-policy", "seed": "3"}


def test_the_sweeps_start_and_length_are_its_own_runs_not_the_files_times(alice_client, experiment, tmp_path):
    start = datetime(2026, 11, 1, 12, tzinfo=UTC)
    experiment.runs.update(started=start, finished=start + timedelta(seconds=90))
    answer = post(alice_client, experiment, prime_rl_file(tmp_path / "metrics.jsonl"), **CELL)
    assert answer.status_code == 302 and Import.objects.get().first_time.year == 2025
    sweep = sweep_progress(experiment)
    assert (sweep["started"], sweep["finished"], sweep["duration_s"]) == (
        start,
        start + timedelta(seconds=90),
        90.0,
    )
    experiment.runs.filter(imported__isnull=True).delete()  # only the imported run: its times, as logged
    sweep = sweep_progress(experiment)
    assert (sweep["started"].timestamp(), sweep["duration_s"]) == (T0, 200.0)


def test_an_upload_becomes_a_run_once(alice_client, experiment, tmp_path):
    path = prime_rl_file(tmp_path / "metrics.jsonl", seed=2)
    fields = {
        "preset": "reinforce",
        "staleness": "sync_offset=2",
        "seed": "2",
        "mapping": "eval/acc=eval/accuracy\n",
    }
    answer = post(alice_client, experiment, path, **fields)
    record = Import.objects.get()
    assert answer.status_code == 302 and answer["Location"] == f"/runs/{record.run_id}/"
    assert (record.run.preset, record.run.staleness, record.run.seed) == ("reinforce", "sync_offset=2", 2)
    assert record.mapping["eval/acc"] == "eval/accuracy"
    again = post(alice_client, experiment, path, **{**fields, "seed": "5"})
    assert again["Location"] == f"/runs/{record.run_id}/" and Import.objects.count() == 1
    page = alice_client.get(again["Location"]).content.decode()
    assert "metrics.jsonl was imported already, as run" in page and 'id="imported-from"' in page
    # the file names no version or run id of its own; no worker ran it, so no "execution simulated"
    assert "written by prime-rl\n  (the file names no version of it and no run id);" in page
    assert "imported from prime-rl" in page and "execution simulated" not in page
    assert "No worker ran it: its provenance is the file it was read from" in page
    listed = alice_client.get(f"/experiments/{experiment.pk}/").content.decode()
    assert listed.count('<td class="mode"><span title="read from prime-rl') == 1
    by_mode = {
        mode: {run.pk for run in alice_client.get("/runs/", {"mode": mode}).context["page"]}
        for mode in ("imported", "simulated")
    }
    assert by_mode["imported"] == {record.run_id} and record.run_id not in by_mode["simulated"]
    assert len(by_mode["simulated"]) == experiment.runs.count() - 1


@pytest.mark.parametrize(
    ("damage", "fields", "words"),
    [
        (b"{oops\n", {}, "metrics.jsonl, line 22: not JSON"),
        (b"", {"mapping": "loss/mean\n"}, "entry 1 (&#x27;loss/mean&#x27;) must be source_name=lab_name"),
        (b"", {"staleness": "sync_offset=many"}, "is not a staleness cell"),
    ],
)
def test_a_refusal_is_shown_beside_its_field_and_nothing_is_stored(
    alice_client, experiment, tmp_path, damage, fields, words
):
    path = prime_rl_file(tmp_path / "metrics.jsonl")
    path.write_bytes(path.read_bytes() + damage)
    runs = Run.objects.count()
    answer = post(
        alice_client, experiment, path, **{"preset": "grpo", "staleness": "on-policy", "seed": "0", **fields}
    )
    assert answer.status_code == 422
    assert words in answer.content.decode()
    assert Run.objects.count() == runs and not Import.objects.exists()


def test_an_oversized_upload_is_cut_off(alice_client, experiment, tmp_path, settings):
    settings.LAB_IMPORT_MAX_BYTES = 500
    answer = post(
        alice_client,
        experiment,
        prime_rl_file(tmp_path / "big.jsonl"),
        preset="grpo",
        staleness="on-policy",
        seed="0",
    )
    assert answer.status_code == 413
    assert (
        "big.jsonl is more than 500 bytes, the most an import may be (LAB_IMPORT_MAX_BYTES)"
        in answer.content.decode()
    )
    assert not Import.objects.exists() and list(settings.FILE_UPLOAD_TEMP_DIR.iterdir()) == []


def test_another_teams_experiment_is_a_404(client, experiment, tmp_path):
    client.force_login(new_team_member("bob", "team-b"))
    assert client.get(f"/experiments/{experiment.pk}/import/").status_code == 404
    answer = post(
        client,
        experiment,
        prime_rl_file(tmp_path / "metrics.jsonl"),
        preset="grpo",
        staleness="on-policy",
        seed="0",
    )
    assert answer.status_code == 404 and not Import.objects.exists()


def test_a_value_the_tool_dropped_breaks_the_run_page_s_curve(alice_client, experiment, tmp_path):
    """prime-rl drops a NaN: the step is missing from the file. The run page's chart data has a null
    there (a break in the line, as the recent-metrics table shows "–"), not a line drawn across it;
    `eval/acc`, logged every 5 steps, gets no null between its points."""
    path = prime_rl_file(tmp_path / "metrics.jsonl", steps=10)
    lines = path.read_text().splitlines()
    dropped = json.loads(lines[3])
    del dropped["reward/mean"]
    lines[3] = json.dumps(dropped)
    path.write_text("\n".join(lines) + "\n")
    post(alice_client, experiment, path, preset="reinforce", staleness="on-policy", seed="3")
    run = Import.objects.get().run
    curves = alice_client.get(f"/runs/{run.pk}/curves").json()["metrics"]
    reward = dict(zip(curves["reward/mean"]["x"], curves["reward/mean"]["y"], strict=True))
    assert sorted(reward) == list(range(11)) and reward[3] is None
    assert all(reward[step] is not None for step in range(11) if step != 3)
    accuracy = curves["imported/eval/acc"]
    assert accuracy["x"] == [0, 5, 10] and None not in accuracy["y"]
