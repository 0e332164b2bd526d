"""The read side of the API with a token from `manage.py create_token`: experiments, runs,
metrics as JSON and CSV, cancel and retry, and the OpenAPI docs."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

import pytest
from django.core.management import CommandError, call_command
from support import TINY_CONFIG, log_points, new_team_member, queue_sweep

from experiments.models import RolloutJob, Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(make_run):
    run = make_run("read me", seed=3)
    now = datetime.now(UTC)
    log_points(
        run,
        [
            (name, step, value, now)
            for name, step, value in [
                ("loss", 1, 0.5),
                ("loss", 2, 0.25),
                ("reward/mean", 1, 0.125),
                ("kl/init", 1, float("inf")),  # not finite: null in JSON
            ]
        ],
    )
    return run


def test_create_token_prints_a_token_stored_only_as_a_hash(token, alice):
    assert len(token) >= 40
    assert not alice.api_tokens.filter(digest=token).exists() and alice.api_tokens.count() == 1
    with pytest.raises(CommandError, match="no user is called 'nobody'"):
        call_command("create_token", "nobody")


def test_reading_experiments_runs_and_metrics(client, token, run):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    experiments = client.get("/api/experiments", **auth).json()["items"]
    assert [(e["id"], e["team"], e["runs"], e["active"]) for e in experiments] == [
        (run.experiment_id, "team-a", 1, 1)
    ]
    runs = client.get(f"/api/experiments/{run.experiment_id}/runs", **auth).json()["items"]
    assert [(r["id"], r["preset"], r["staleness"], r["seed"], r["status"]) for r in runs] == [
        (run.pk, "grpo", "on-policy", 3, "queued")
    ]
    detail = client.get(f"/api/runs/{run.pk}", **auth).json()
    assert detail["config"]["rollout"]["group_size"] == 4 and detail["steps"] == TINY_CONFIG["steps"]
    assert detail["execution_mode"] == "simulated" and set(detail["rollout_jobs"].values()) == {0}

    metrics = client.get(f"/api/runs/{run.pk}/metrics", **auth).json()
    assert metrics == {
        "run": run.pk,
        "metrics": {"kl/init": [[1, None]], "loss": [[1, 0.5], [2, 0.25]], "reward/mean": [[1, 0.125]]},
        "damaged": {},
    }
    response = client.get(f"/api/runs/{run.pk}/metrics?format=csv&name=loss", **auth)
    assert response["Content-Type"] == "text/csv"
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert [row[:3] for row in rows] == [
        ["name", "step", "value"],
        ["loss", "1", "0.5"],
        ["loss", "2", "0.25"],
    ]
    assert client.get(f"/api/runs/{run.pk}/metrics?format=xml", **auth).status_code == 422


def test_a_distributed_run_has_its_execution_mode_and_rollout_job_counts(client, token, team, alice):
    config = {**TINY_CONFIG, "execution": {"mode": "distributed", "rollout_workers": 2}}
    run = queue_sweep(team, alice, "split", config=config).runs.get()
    statuses = [RolloutJob.DONE, RolloutJob.DONE, RolloutJob.DONE, RolloutJob.RUNNING, RolloutJob.LOST]
    RolloutJob.objects.bulk_create(
        RolloutJob(run=run, step=1 + i // 2, part=i % 2, groups_start=0, groups_stop=2, status=status)
        for i, status in enumerate(statuses)
    )
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    detail = client.get(f"/api/runs/{run.pk}", **auth).json()
    assert detail["execution_mode"] == "distributed"
    assert detail["rollout_jobs"] == {
        "queued": 0,
        "running": 1,
        "done": 3,
        "failed": 0,
        "cancelled": 0,
        "lost": 1,
    }
    [listed] = client.get(f"/api/experiments/{run.experiment_id}/runs", **auth).json()["items"]
    assert listed["execution_mode"] == "distributed" and "rollout_jobs" not in listed
    cancelled = client.post(f"/api/runs/{run.pk}/cancel", **auth).json()
    assert cancelled["status"] == Run.CANCELLED and cancelled["rollout_jobs"]["cancelled"] == 1


def test_cancel_then_retry_through_the_api(client, token, run):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    assert client.post(f"/api/runs/{run.pk}/cancel", **auth).json()["status"] == Run.CANCELLED
    response = client.post(f"/api/runs/{run.pk}/cancel", **auth)
    assert response.status_code == 409 and "only queued or running runs" in response.json()["detail"]
    retried = client.post(f"/api/runs/{run.pk}/retry", **auth).json()
    assert (retried["status"], retried["attempt"]) == (Run.QUEUED, 2)


def test_openapi_docs_are_served(client):
    assert client.get("/api/docs").status_code == 200
    schema = client.get("/api/openapi.json").json()
    assert "/api/sweeps" in schema["paths"] and "/api/runs/{run_id}/metrics" in schema["paths"]


def test_comparisons_through_the_api_match_the_dashboard(client, alice_client, token, team, alice):
    """`/api/experiments/<id>/compare` and `/api/compare?runs=…` give the dashboard's payload with
    a token (no session), validate like it, and keep other teams' runs out."""
    from django.urls import reverse
    from sample_experiments import make_finished_experiment

    experiment = make_finished_experiment(team, alice)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    params = {"metric": "kl/init", "x": "samples", "band": "ci", "rule": "auc"}
    api = client.get(f"/api/experiments/{experiment.pk}/compare", params, **auth)
    page = alice_client.get(reverse("experiment-compare-data", args=[experiment.pk]), params)
    assert api.status_code == page.status_code == 200 and api.json() == page.json()
    assert client.get(f"/api/experiments/{experiment.pk}/compare").status_code == 401

    ids = list(experiment.runs.filter(seed=0).values_list("pk", flat=True))
    picked = client.get("/api/compare", {"runs": ",".join(map(str, ids))}, **auth).json()
    assert sorted(r["id"] for r in picked["runs"]) == sorted(ids) and all(
        g["n_seeds"] == 1 for g in picked["groups"]
    )

    bad = client.get(f"/api/experiments/{experiment.pk}/compare", {"band": "sem"}, **auth)
    assert bad.status_code == 422
    assert bad.json()["detail"] == [
        {
            "loc": ["query", "band"],
            "field": "band",
            "msg": "band must be one of std, minmax, ci, none (got 'sem')",
        }
    ]
    assert client.get("/api/compare", {"runs": "x"}, **auth).json()["detail"][0]["field"] == "runs"
    bad_delta = client.get(f"/api/experiments/{experiment.pk}/compare", {"delta": "-1"}, **auth)
    assert bad_delta.status_code == 422 and bad_delta.json()["detail"][0]["field"] == "delta"

    new_team_member("bob", "team-b", is_admin=False)
    out = io.StringIO()
    call_command("create_token", "bob", stdout=out)
    bob_auth = {"HTTP_AUTHORIZATION": f"Bearer {out.getvalue().strip()}"}
    assert client.get(f"/api/experiments/{experiment.pk}/compare", **bob_auth).status_code == 404
    foreign = client.get("/api/compare", {"runs": str(ids[0])}, **bob_auth)
    assert (
        foreign.status_code == 422 and foreign.json()["detail"][0]["msg"] == f"no run {ids[0]} in your teams"
    )
    assert "/api/compare" in client.get("/api/openapi.json").content.decode()


def test_a_nul_in_the_metric_name_is_422_not_500(client, token, run):
    response = client.get(
        f"/api/runs/{run.pk}/metrics", {"name": "loss\x00"}, HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert response.status_code == 422
    assert "name" in response.content.decode()
