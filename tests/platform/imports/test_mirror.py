"""Mirroring (docs/imports.md, "Mirroring"): a run's config and metrics also sent to a real MLflow
tracking server started here on 127.0.0.1 (its own virtualenv, `make mlflow`) and written as
TensorBoard event files under the run's folder, through the worker's sink (rlcore never knows).
Read back point by point: from MLflow with its own client (`MlflowClient`, run in the server's
virtualenv), and from the event files with TensorBoard's own reader. The server stopped mid-run:
the run still succeeds, and its notes say how many points were not mirrored. A target that never
answers never blocks the run: its queue is bounded, and what does not fit is dropped and counted."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from support import TINY_CONFIG, queue_sweep, wait_for

from accounts.mirroring import MirrorSettings, settings_for, spec_errors, uri_error
from experiments import series
from experiments.models import Run
from imports import mirror
from imports.mirror import Outlet, flatten

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parents[3]
RUN_TIMEOUT_S = 300


def mlflow_bin() -> Path:
    """The MLflow server's command: `<repo>/.venv-mlflow/bin/mlflow` (`make mlflow`), or
    `LAB_MLFLOW_BIN`. Missing, the test fails, saying how to build it: never skipped."""
    path = Path(os.environ.get("LAB_MLFLOW_BIN") or REPO / ".venv-mlflow" / "bin" / "mlflow")
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"no MLflow server at {path}: run `make mlflow` (it builds .venv-mlflow), or set LAB_MLFLOW_BIN "
            "to an mlflow command"
        )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """`mlflow server` on 127.0.0.1 with a SQLite store in `folder`; stop() kills it, start() brings
    it back on the same port and store."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._log = (folder / "mlflow.log").open("a")

    def start(self) -> None:
        command = mlflow_bin()
        self.proc = subprocess.Popen(
            [
                "timeout",
                "-s",
                "KILL",
                "900",
                str(command),
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
                "--backend-store-uri",
                f"sqlite:///{self.folder / 'mlflow.db'}",
                "--default-artifact-root",
                str(self.folder / "artifacts"),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(
            self._healthy,
            90,
            f"the MLflow server on port {self.port} (log: {self.folder / 'mlflow.log'})",
            0.5,
        )

    def _healthy(self) -> bool:
        import urllib.request

        if self.proc.poll() is not None:
            pytest.fail(f"the MLflow server exited: {(self.folder / 'mlflow.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(30)

    def points_logged(self, run_key: str) -> int:
        """How many metrics the MLflow run tagged `lab.run_key` has logged (0 while there is none),
        asked over MLflow's REST API (quicker than starting its client for each look)."""
        experiments = self._post("experiments/search", {"max_results": 1000})["experiments"]
        runs = self._post(
            "runs/search",
            {
                "experiment_ids": [e["experiment_id"] for e in experiments],
                "filter": f"tags.`lab.run_key` = '{run_key}'",
                "max_results": 1,
            },
        ).get("runs", [])
        return len(runs[0]["data"].get("metrics", [])) if runs else 0

    def _post(self, path: str, body: dict) -> dict:
        import urllib.request

        request = urllib.request.Request(
            f"{self.uri}/api/2.0/mlflow/{path}",
            json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def read(self, run_key: str) -> dict:
        """The MLflow run tagged `lab.run_key` as MLflow's own client reads it: status, params,
        tags and every metric's history [[step, value, timestamp], …] in the order logged."""
        script = """
import json, sys
from mlflow.tracking import MlflowClient
client = MlflowClient(sys.argv[1])
experiments = [e.experiment_id for e in client.search_experiments()]
runs = client.search_runs(experiments, filter_string="tags.`lab.run_key` = '%s'" % sys.argv[2])
out = []
for run in runs:
    metrics = {
        name: [[m.step, m.value, m.timestamp] for m in client.get_metric_history(run.info.run_id, name)]
        for name in run.data.metrics
    }
    experiment = client.get_experiment(run.info.experiment_id).name
    out.append({"id": run.info.run_id, "status": run.info.status, "experiment": experiment,
                "name": run.info.run_name, "params": run.data.params, "tags": run.data.tags, "metrics": metrics})
print(json.dumps(out))
"""
        python = mlflow_bin().parent / "python"
        done = subprocess.run(
            [str(python), "-c", script, self.uri, run_key], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs = json.loads(done.stdout)
        assert len(runs) == 1, f"one MLflow run per lab run, found {len(runs)}"
        return runs[0]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """One MLflow server for the module (it takes 10–25 s to start)."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    server.start()
    yield server
    server.stop()


def stored_points(run: Run) -> dict[str, list[tuple[int, float, int]]]:
    """Every point the database keeps of the run: {name: [(step, value, wall time µs)]}."""
    return {
        name: list(zip(steps.tolist(), values.tolist(), times.tolist(), strict=True))
        for name, (steps, values, times) in series.points_of(run.pk)
    }


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def ended(run: Run) -> Run:
    wait_for(
        lambda: Run.objects.get(pk=run.pk).status not in Run.ACTIVE, RUN_TIMEOUT_S, f"run {run.pk} to end"
    )
    run.refresh_from_db()
    return run


def test_a_run_is_mirrored_to_mlflow_and_tensorboard_point_by_point(mlflow_server, worker, team, alice):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    team.mirror_mlflow_uri = mlflow_server.uri
    team.mirror_tensorboard = True
    team.save()
    run = queue_sweep(team, alice, "mirrored").runs.get()
    run = ended(run)
    assert run.status == Run.SUCCEEDED, run.error

    stored = stored_points(run)
    total = sum(map(len, stored.values()))
    assert {"reward/mean", "kl/init", "eval/accuracy", "loss"} <= set(stored)
    assert total > 6 * 20
    notes = [note["text"] for note in run.notes]
    mirrored = mlflow_server.read(str(run.key))
    assert (
        f"Mirrored to MLflow at {mlflow_server.uri} (experiment 'team-a/mirrored', run {mirrored['id']}): all {total} points."
        in notes
    )
    [file] = run.tensorboard_dir.iterdir()
    # The note names the file under the runs' folder, as notes name paths (`public_error`).
    assert (
        f"Mirrored to TensorBoard event file runs/{run.key}/tensorboard/{file.name}: all {total} points."
        in notes
    )

    # MLflow: every point with its step, its value and the wall time the database stored (in ms).
    assert mirrored["status"] == "FINISHED"
    assert mirrored["experiment"] == "team-a/mirrored"
    assert mirrored["tags"]["lab.run"] == str(run.pk) and mirrored["tags"]["lab.preset"] == "grpo"
    assert mirrored["params"] == flatten(run.config)
    assert (
        mirrored["params"]["model.tiny.hidden_size"] == "32"
        and mirrored["params"]["algorithm.preset"] == "grpo"
    )
    assert set(mirrored["metrics"]) == set(stored)
    for name, points in stored.items():
        got = sorted(mirrored["metrics"][name])
        assert [step for step, _, _ in got] == [step for step, _, _ in points], name
        for (step, value, us), (_, got_value, got_ms) in zip(points, got, strict=True):
            assert same(got_value, value), (name, step, got_value, value)
            assert got_ms == us // 1000, (name, step)

    # TensorBoard: the same points in the run's folder, read by TensorBoard's own reader (float32).
    assert file.name.startswith("events.out.tfevents.")
    events = EventAccumulator(str(run.tensorboard_dir), size_guidance={"scalars": 0})
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(stored)
    for name, points in stored.items():
        got = sorted(events.Scalars(name), key=lambda e: e.step)
        assert [e.step for e in got] == [step for step, _, _ in points], name
        for (step, value, us), event in zip(points, got, strict=True):
            assert same(event.value, float(np.float32(value))), (name, step)
            assert abs(event.wall_time - us / 1e6) < 1e-6, (name, step)
    assert not run.checkpoint_dir.exists(), "the run succeeded: its checkpoints went, its event files stayed"


def test_a_later_attempt_logs_into_the_same_mlflow_run(mlflow_server):
    from django.utils import timezone

    params = flatten({"optimizer": {"lr": 1e-6}, "steps": 3})

    def attempt(steps: range) -> str:
        target = mirror.MlflowTarget(
            mlflow_server.uri, "team-b/resumed", "run 7", "key-7", {"lab.run": 7}, params
        )
        outlet = Outlet(target)
        for step in steps:
            outlet.put([("reward/mean", step, step / 10, mirror.packing.micros(timezone.now()))])
        outlet.close(succeeded=True)
        assert outlet.report().startswith(f"Mirrored to MLflow at {mlflow_server.uri}"), outlet.report()
        return target.run_id

    first = attempt(range(0, 2))
    assert attempt(range(2, 4)) == first
    mirrored = mlflow_server.read("key-7")
    assert mirrored["id"] == first and mirrored["status"] == "FINISHED"
    assert mirrored["params"] == {"optimizer.lr": "1e-06", "steps": "3"}
    assert [(step, value) for step, value, _ in mirrored["metrics"]["reward/mean"]] == [
        (0, 0.0),
        (1, 0.1),
        (2, 0.2),
        (3, 0.3),
    ]


def test_the_mlflow_server_stopped_mid_run_leaves_the_run_succeeded_and_its_notes_say_what_was_not_mirrored(
    mlflow_server, worker, team, alice
):
    # Mirrored by its sweep's setting; the team's is off.
    steps = 80
    config = {**TINY_CONFIG, "steps": steps, "eval_every": 40, "checkpoint_every": 40}
    experiment = queue_sweep(team, alice, "cut off", config=config, mirror={"mlflow_uri": mlflow_server.uri})
    assert experiment.spec["mirror"] == {"mlflow_uri": mlflow_server.uri}
    run = experiment.runs.get()
    # Stopped once MLflow holds some of the run's points, while it still trains.
    wait_for(
        lambda: mlflow_server.points_logged(str(run.key)) > 0, RUN_TIMEOUT_S, "MLflow to get points", 0.5
    )
    mlflow_server.stop()
    stopped_at = Run.objects.get(pk=run.pk).progress
    run = ended(run)
    assert run.status == Run.SUCCEEDED, run.error
    assert stopped_at < run.progress == steps, "it trained on after the server stopped"

    total = sum(map(len, stored_points(run).values()))
    [note] = [note["text"] for note in run.notes if "MLflow" in note["text"]]
    match = re.fullmatch(
        rf"Mirroring to MLflow at {re.escape(mlflow_server.uri)} \(experiment 'team-a/cut off', run (\w+)\) "
        r"incomplete: (\d+) of (\d+) points sent, (\d+) not mirrored \((.*)\)\. Last error: (.*)",
        note,
    )
    assert match, note
    sent, offered, missing = map(int, match.group(2, 3, 4))
    assert offered == total and sent + missing == total and 0 < sent < total
    assert "given up after 4 tries" in match.group(5) or "still unsent when the run ended" in match.group(5)
    assert "Connection refused" in match.group(6)

    # What the note says was sent is what MLflow has.
    mlflow_server.start()
    mirrored = mlflow_server.read(str(run.key))
    assert sum(map(len, mirrored["metrics"].values())) == sent
    assert mirrored["id"] == match.group(1) and mirrored["status"] == "RUNNING"


class Silent:
    """A TCP server on 127.0.0.1 that accepts connections and never answers."""

    def __init__(self):
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.uri = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.socket.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        for conn in self.held:
            conn.close()
        self.socket.close()


def test_a_target_that_never_answers_never_blocks_the_run_and_what_does_not_fit_is_dropped(monkeypatch):
    monkeypatch.setattr(mirror, "REQUEST_TIMEOUT_S", 1.0)
    silent = Silent()
    try:
        target = mirror.MlflowTarget(silent.uri, "team/exp", "run 1", "key-1", {}, {"a": "1"})
        outlet = Outlet(target, capacity=500)
        started = time.monotonic()
        for step in range(100):  # 100 steps of 40 metrics: 4000 points
            outlet.put([(f"m{i}", step, float(i), 0) for i in range(40)])
        assert time.monotonic() - started < 0.5, "putting never waits for the target"
        outlet.close(succeeded=True, within_s=2)
        assert time.monotonic() - started < 2 + 2 * 1.0 + 1, "closing waits at most its time and one request"
        text = outlet.report()
    finally:
        silent.close()
    assert outlet.sent == 0 and outlet.offered == 4000
    assert outlet.dropped == 4000 - 500, "the queue held 500 points; the rest were dropped"
    assert text.startswith(
        f"Mirroring to MLflow at {silent.uri} (experiment 'team/exp', run not created) incomplete: 0 of 4000 points sent, 4000 not mirrored (3500 dropped while its queue was full (500 points)"
    )
    assert "TimeoutError" in text or "timed out" in text


def test_settings_validate_and_a_sweep_overrides_its_team(team):
    assert not settings_for(team, {}).on, "off by default"
    team.mirror_tensorboard = True
    team.mirror_mlflow_uri = "https://mlflow.example.org"
    assert settings_for(team, {}) == MirrorSettings("https://mlflow.example.org", True)
    assert settings_for(team, {"mirror": {"mlflow_uri": ""}}) == MirrorSettings("", True)
    assert settings_for(team, {"mirror": {"tensorboard": False}}) == MirrorSettings(
        "https://mlflow.example.org", False
    )

    assert uri_error("http://127.0.0.1:5000") == ""
    assert (
        uri_error("ftp://host")
        == "'ftp://host' is not an http(s) address of an MLflow tracking server (e.g. http://mlflow.example.org:5000)"
    )
    assert uri_error("https://mlflow.example.org:8443/tracking") == ""
    assert uri_error("http://") != "" and uri_error("http://a b") != "" and uri_error("http://h/?x=1") != ""
    assert uri_error("http://me:secret@mlflow.example.org").startswith(
        "the MLflow tracking URI has a user name or password"
    )
    assert uri_error("http://h:99999") == "'http://h:99999' has a port that is not a number from 1 to 65535"
    assert uri_error("http://" + "h" * 500).startswith("the MLflow tracking URI is 507 characters long")
    assert spec_errors({"mlflow_uri": "file:///tmp", "tensorboard": "yes", "wandb": 1}) == [
        ("mirror.wandb", "mirror has no field 'wandb'; its fields are mlflow_uri, tensorboard"),
        (
            "mirror.mlflow_uri",
            "'file:///tmp' is not an http(s) address of an MLflow tracking server (e.g. http://mlflow.example.org:5000)",
        ),
        ("mirror.tensorboard", "mirror.tensorboard is true or false"),
    ]


def test_the_api_refuses_a_mirror_that_is_not_http_naming_the_field(client, token):
    body = {
        "name": "bad mirror",
        "team": "team-a",
        "config": TINY_CONFIG,
        "presets": ["grpo"],
        "mirror": {"mlflow_uri": "mlflow.example.org"},
    }
    response = client.post(
        "/api/sweeps",
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 422, response.content
    assert "mirror.mlflow_uri" in response.content.decode()
    assert "is not an http(s) address of an MLflow tracking server" in response.content.decode()
    assert not Run.objects.exists()


def test_a_team_admin_sets_mirroring_on_the_team_page_and_a_bad_address_is_shown(alice_client, team):
    page = alice_client.get(f"/teams/{team.pk}/").content.decode()
    assert 'id="mirror"' in page and 'name="mirror_mlflow_uri"' in page
    url = f"/teams/{team.pk}/mirror/"
    response = alice_client.post(url, {"mirror_mlflow_uri": "localhost:5000", "mirror_tensorboard": "on"})
    assert response.status_code == 400
    assert "is not an http(s) address of an MLflow tracking server" in response.content.decode()
    team.refresh_from_db()
    assert (team.mirror_mlflow_uri, team.mirror_tensorboard) == ("", False)
    response = alice_client.post(
        url, {"mirror_mlflow_uri": "http://127.0.0.1:5000", "mirror_tensorboard": "on"}
    )
    assert response.status_code == 302
    team.refresh_from_db()
    assert (team.mirror_mlflow_uri, team.mirror_tensorboard) == ("http://127.0.0.1:5000", True)


def test_the_new_sweep_form_sets_a_sweeps_mirror_and_shows_a_bad_address_under_its_field(alice_client, team):
    from django.urls import reverse
    from support import sweep_form

    from experiments.models import Experiment

    small = {"steps": "3", "rollout.prompts_per_step": "2", "rollout.group_size": "2", "eval_size": "4"}
    bad = sweep_form(team, "bad", fields={**small, "mirror_mlflow_uri": "file:///tmp/mlruns"})
    response = alice_client.post(reverse("submit-sweep"), bad)
    assert response.status_code == 422
    assert response.context["form"].errors["mirror_mlflow_uri"] == [
        "'file:///tmp/mlruns' is not an http(s) address of an MLflow tracking server (e.g. http://mlflow.example.org:5000)"
    ]
    assert not Experiment.objects.exists()

    good = sweep_form(
        team,
        "good",
        fields={**small, "mirror_mlflow_uri": "http://127.0.0.1:5000", "mirror_tensorboard": "off"},
    )
    response = alice_client.post(reverse("submit-sweep"), good)
    assert response.status_code == 302, response.context["form"].errors
    experiment = Experiment.objects.get(name="good")
    assert experiment.spec["mirror"] == {"mlflow_uri": "http://127.0.0.1:5000", "tensorboard": False}
    team.mirror_tensorboard = True
    assert settings_for(team, experiment.spec) == MirrorSettings("http://127.0.0.1:5000", False)

    # A copy of the sweep starts with its mirror on the form.
    page = alice_client.get(reverse("submit-sweep") + f"?clone={experiment.pk}")
    form = page.context["form"]
    assert (form.initial["mirror_mlflow_uri"], form.initial["mirror_tensorboard"]) == (
        "http://127.0.0.1:5000",
        "off",
    )


def test_a_run_of_two_trainer_ranks_is_mirrored_by_rank_zero(start_worker, team, alice):
    """`execution.train_processes: 2`: rank 0 reports (`workers.ranks`), and mirrors as one process does."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    team.mirror_tensorboard = True
    team.save()
    start_worker()
    run = queue_sweep(
        team, alice, "ranks", config={**TINY_CONFIG, "execution": {"train_processes": 2}}
    ).runs.get()
    run = ended(run)
    assert run.status == Run.SUCCEEDED, run.error
    stored = stored_points(run)
    total = sum(map(len, stored.values()))
    [file] = run.tensorboard_dir.iterdir()
    assert [note["text"] for note in run.notes] == [
        f"Mirrored to TensorBoard event file runs/{run.key}/tensorboard/{file.name}: all {total} points."
    ]
    events = EventAccumulator(str(run.tensorboard_dir), size_guidance={"scalars": 0})
    events.Reload()
    assert {name: [e.step for e in events.Scalars(name)] for name in events.Tags()["scalars"]} == {
        name: [step for step, _, _ in points] for name, points in stored.items()
    }
