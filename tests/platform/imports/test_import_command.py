"""`manage.py import` (`imports.service`): a prime-rl file becomes a succeeded, read-only run of the
experiment at the preset, staleness cell and seed given, its names mapped, its own times kept, its
provenance stored; the same file again changes nothing; a malformed, truncated, binary or
oversized file, or a placement the grid refuses, is refused naming the file (and line) or the
field, and nothing is stored."""

from __future__ import annotations

import hashlib
import sqlite3
from datetime import UTC, datetime

import pytest
from django.core.management.base import CommandError
from import_helpers import T0, import_command, prime_rl_file
from sample_experiments import make_finished_experiment
from support import logged

from experiments import series
from experiments.models import MetricChunk, MetricSummary, Run
from imports import service
from imports.formats import ParsedRun
from imports.models import Import

pytestmark = pytest.mark.django_db


@pytest.fixture
def experiment(team, alice):
    return make_finished_experiment(
        team, alice, name="grid", presets=("grpo",), staleness=({}, {"sync_offset": 2}), seeds=(0,)
    )


def stored() -> tuple[int, int, int, int]:
    return (
        Run.objects.count(),
        Import.objects.count(),
        MetricChunk.objects.count(),
        MetricSummary.objects.count(),
    )


def test_a_prime_rl_file_becomes_a_read_only_run_with_its_provenance(tmp_path, experiment, alice):
    path = prime_rl_file(tmp_path / "metrics.jsonl", seed=3, final=0.7)
    printed = import_command(
        path,
        experiment,
        preset="reinforce",
        staleness="sync_offset=2",
        seed=3,
        map=["eval/acc=eval/accuracy"],
    )
    record = Import.objects.get()
    run = record.run
    assert (
        f"imported metrics.jsonl (prime-rl) as run {run.pk}" in printed
        and "eval/acc → eval/accuracy" in printed
    )
    assert (run.experiment, run.status, run.preset, run.staleness, run.seed) == (
        experiment,
        Run.SUCCEEDED,
        "reinforce",
        "sync_offset=2",
        3,
    )
    assert run.is_imported and run.steps == 20 and run.progress == 20 and not run.ended_early
    assert run.config["algorithm"]["preset"] == "reinforce" and run.config["staleness"]["sync_offset"] == 2
    assert (record.tool, record.file_name, record.file_size, record.imported_by) == (
        "prime-rl",
        "metrics.jsonl",
        path.stat().st_size,
        alice,
    )
    assert record.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record.points == 21 * 3 + 5
    assert record.mapping == {
        "reward/mean": "reward/mean",
        "loss/mean": "loss",
        "progress/tokens": "imported/progress/tokens",
        "eval/acc": "eval/accuracy",
    }
    assert (record.first_time, record.last_time) == (
        datetime.fromtimestamp(T0, UTC),
        datetime.fromtimestamp(T0 + 200, UTC),
    )
    assert (run.started, run.finished) == (record.first_time, record.last_time)
    # The points, under the lab's names, with the file's own times.
    assert logged(run, "loss") == [("loss", s, 1.0 / (1 + s)) for s in range(21)]
    assert logged(run, "imported/progress/tokens")[-1] == ("imported/progress/tokens", 20, 20_000.0)
    steps, _, times = series.series(run.pk, "reward/mean")
    assert steps.tolist() == list(range(21))
    assert times.tolist() == [int((T0 + 10 * s) * 1_000_000) for s in range(21)]
    assert run.final_accuracy == pytest.approx(0.7) and run.summary["completed"] == 1.0
    # Read-only: it is never retried nor cancelled, and says why.
    assert "imported from prime-rl (metrics.jsonl) and is read-only" in run.retry_refusal()
    assert not run.cancel()


def test_the_same_file_again_changes_nothing(tmp_path, experiment):
    path = prime_rl_file(tmp_path / "metrics.jsonl")
    import_command(path, experiment, preset="grpo", staleness="on-policy", seed=1)
    before = stored()
    run = Import.objects.get().run
    again = import_command(path, experiment, preset="reinforce", staleness="offline", seed=7)
    assert again.startswith(f"metrics.jsonl was imported already, as run {run.pk}: nothing changed")
    assert stored() == before
    run.refresh_from_db()
    assert (run.preset, run.staleness, run.seed) == ("grpo", "on-policy", 1)
    # The same file under another name is the same file.
    renamed = tmp_path / "copy.jsonl"
    renamed.write_bytes(path.read_bytes())
    assert "imported already" in import_command(
        renamed, experiment, preset="grpo", staleness="on-policy", seed=1
    )
    assert stored() == before


def _truncated(path):
    prime_rl_file(path)
    path.write_bytes(path.read_bytes()[:-25])


def _malformed(path):
    prime_rl_file(path)
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = '{"step": 2, "time": 1, "loss/mean": 0.5,,}\n'
    path.write_text("".join(lines))


def _binary(path):
    prime_rl_file(path)
    path.write_bytes(path.read_bytes() + b"\x00\x9f\x92\x96 binary tail\n")


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (_truncated, "metrics.jsonl, line 21: not JSON"),
        (_malformed, "metrics.jsonl, line 3: not JSON"),
        (_binary, "metrics.jsonl, line 22: binary data"),
    ],
)
def test_a_damaged_file_is_refused_naming_the_file_and_line_and_nothing_is_stored(
    tmp_path, experiment, damage, words
):
    path = tmp_path / "metrics.jsonl"
    damage(path)
    before = stored()
    with pytest.raises(CommandError) as refused:
        import_command(path, experiment, preset="grpo", staleness="on-policy", seed=0)
    assert "not imported" in str(refused.value) and f"file: {words}" in str(refused.value), str(refused.value)
    assert stored() == before


def test_an_oversized_file_is_refused_before_it_is_read(tmp_path, experiment, settings):
    path = prime_rl_file(tmp_path / "metrics.jsonl")
    settings.LAB_IMPORT_MAX_BYTES = path.stat().st_size - 1
    before = stored()
    with pytest.raises(CommandError) as refused:
        import_command(path, experiment, preset="grpo", staleness="on-policy", seed=0)
    assert (
        f"file: metrics.jsonl is {path.stat().st_size:,} bytes, more than the {path.stat().st_size - 1:,} "
        "an import may be (LAB_IMPORT_MAX_BYTES)"
    ) in str(refused.value)
    assert stored() == before


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"preset": "nope", "staleness": "on-policy", "seed": 0}, "preset: unknown preset 'nope'"),
        (
            {"preset": "grpo", "staleness": "sideways", "seed": 0},
            "staleness: 'sideways' is not a staleness cell",
        ),
        (
            {"preset": "grpo", "staleness": "on-policy"},
            "seed: give the seed: the file's config does not say it",
        ),
        (
            {"preset": "grpo", "staleness": "on-policy", "seed": -1},
            "seed: Input should be greater than or equal to 0",
        ),
        (
            {"tool": "nope", "preset": "grpo", "staleness": "on-policy", "seed": 0},
            "tool: tool must be one of prime-rl",
        ),
        (
            {"preset": "grpo", "staleness": "on-policy", "seed": 0, "map": ["loss/mean"]},
            "mapping: entry 1 ('loss/mean') must be source_name=lab_name",
        ),
        (
            {"preset": "grpo", "staleness": "on-policy", "seed": 0, "map": ["loss/mean=reward/mean"]},
            "mapping: 'reward/mean' and 'loss/mean' both map to 'reward/mean' at step 0",
        ),
    ],
)
def test_a_placement_or_mapping_the_lab_refuses_names_the_field(tmp_path, experiment, options, words):
    path = prime_rl_file(tmp_path / "metrics.jsonl")
    before = stored()
    with pytest.raises(CommandError) as refused:
        import_command(path, experiment, **options)
    assert words in str(refused.value), str(refused.value)
    assert stored() == before


def test_another_teams_experiment_is_not_there(tmp_path, experiment):
    from support import new_team_member

    new_team_member("bob", "team-b")
    with pytest.raises(CommandError, match=f"bob has no experiment {experiment.pk} in their teams"):
        import_command(
            prime_rl_file(tmp_path / "metrics.jsonl"),
            experiment,
            user="bob",
            preset="grpo",
            staleness="on-policy",
            seed=0,
        )
    assert not Import.objects.exists()


def trackio_project(path):
    """A Trackio project database holding two runs, a and b (`metrics` as Trackio keeps it)."""
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE metrics (id INTEGER PRIMARY KEY, run_id TEXT, timestamp TEXT, run_name TEXT, "
            "step INTEGER, metrics TEXT)"
        )
        for row, (name, step, loss) in enumerate([("a", 0, 0.5), ("a", 1, 0.25), ("b", 0, 0.75)], start=1):
            db.execute(
                "INSERT INTO metrics VALUES (?, ?, '2026-12-04T09:39:33+00:00', ?, ?, ?)",
                (row, f"id-{name}", name, step, f'{{"train/loss": {loss}}}'),
            )
    return path


def test_each_run_of_a_file_of_several_is_its_own_import(tmp_path, experiment):
    path = trackio_project(tmp_path / "proj.db")
    placed = {"tool": "trackio", "preset": "grpo", "staleness": "on-policy"}
    with pytest.raises(CommandError, match=r"file: proj.db: holds 2 runs \(a, b\); name the one to import"):
        import_command(path, experiment, seed=0, **placed)
    import_command(path, experiment, seed=0, run="a", **placed)
    import_command(path, experiment, seed=1, run="b", **placed)
    again = import_command(path, experiment, seed=5, run="a", **placed)
    assert "imported already" in again
    records = {r.run_name: r for r in Import.objects.all()}
    assert set(records) == {"a", "b"} and records["a"].sha256 == records["b"].sha256
    assert (records["a"].original_run_id, records["b"].original_run_id) == ("id-a", "id-b")
    assert logged(records["a"].run) == [("loss", 0, 0.5), ("loss", 1, 0.25)]
    assert logged(records["b"].run) == [("loss", 0, 0.75)]


def test_a_number_past_a_float_is_refused_naming_the_file(tmp_path, experiment):
    path = prime_rl_file(tmp_path / "metrics.jsonl")
    path.write_text(path.read_text() + '{"step": 21, "time": 1.0, "loss/mean": 1' + "0" * 400 + "}\n")
    before = stored()
    with pytest.raises(CommandError, match="file: metrics.jsonl: cannot be read as prime-rl writes it"):
        import_command(path, experiment, preset="grpo", staleness="on-policy", seed=0)
    assert stored() == before


def test_the_files_config_places_the_run_where_nothing_is_given(experiment):
    parsed = ParsedRun("mlflow", config={"preset": "reinforce", "staleness": "sync_offset=2", "seed": "7"})
    assert service.placement_of(parsed, service.Placement()) == ("reinforce", "sync_offset=2", 7)
    assert service.placement_of(parsed, service.Placement("grpo", None, 0)) == ("grpo", "sync_offset=2", 0)
    with pytest.raises(service.ImportRefused, match="give the staleness"):
        service.placement_of(ParsedRun("mlflow", config={"seed": True}), service.Placement("grpo"))


def test_what_postgresql_cannot_store_is_refused_or_kept_as_text(tmp_path, experiment):
    path = prime_rl_file(tmp_path / "metrics.jsonl")
    path.write_text(path.read_text() + '{"step": 21, "time": 1.0, "a\\u0000b": 1.0}\n')
    with pytest.raises(
        CommandError, match="file: the metric name 'a\\\\x00b' holds characters the lab cannot store"
    ):
        import_command(path, experiment, preset="grpo", staleness="on-policy", seed=0)
    assert service.storable({"lr": float("nan"), "x\x00": ["\ud800", float("-inf"), 3]}) == {
        "x\ufffd": ["?", "-inf", 3],
        "lr": "nan",
    }
