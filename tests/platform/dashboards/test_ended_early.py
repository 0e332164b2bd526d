"""Runs that failed, were cancelled or were lost before their last step (`Run.ended_early`) are no
finished seeds: the summary table, the statistics, the throughput, the speed-up readout, the
findings and the claims leave them out and say how many they left out, as cells with runs still
going say they are partial. A run that stored every step counts whatever its status.

The setting is the operator's probe (research/probe-turn4.md, N11): a serial sweep, grpo × seeds
0–1 × {sync_offset 1, async ≤ 1}, 40 steps, held-out accuracy every 10, with the seed-1 async run
ended at step 22: its last evaluation is step 20's 0.35, against 0.45 at step 40."""

from __future__ import annotations

import json

import pytest
from dashboard_helpers import ASYNC, SCHEDULE, async_run, configured_for, end_at
from dashboard_helpers import probe_measured as measured
from django.urls import reverse

from experiments.models import Run

pytestmark = pytest.mark.django_db

ENDED = (Run.CANCELLED, Run.FAILED, Run.LOST)


def payload(client, experiment, **params) -> dict:
    params.setdefault("metric", "eval/accuracy")
    response = client.get(reverse("experiment-compare-data", args=[experiment.pk]), params)
    assert response.status_code == 200, response.content
    return response.json()


def row(rows, staleness):
    return next(r for r in rows if r["staleness"] == staleness)


@pytest.mark.parametrize("status", ENDED)
@pytest.mark.parametrize("params", [{}, {"x": "time"}], ids=["from-summaries", "from-points"])
def test_a_run_that_ended_early_is_no_finished_seed_of_the_summary_or_the_statistics(
    alice_client, token, probe, status, params
):
    ended = async_run(probe)
    end_at(ended, status, 22)
    data = payload(alice_client, probe, **params)

    # Not 0.400 from two seeds (0.45 with step 20's 0.35): seed 0's 0.45 alone, one left out.
    cell = row(data["summary"], ASYNC)
    assert (cell["n_seeds"], cell["value"]) == (1, 0.45)
    assert (cell["n_active"], cell["n_ended_early"]) == (0, 1)
    assert (cell["n_runs"], cell["interval"]) == (2, None)
    schedule = row(data["summary"], SCHEDULE)
    assert (schedule["n_seeds"], schedule["value"], schedule["n_ended_early"]) == (2, 0.50, 0)
    assert data["n_ended_early"] == 1

    shown = next(r for r in data["runs"] if r["id"] == ended.pk)
    assert (shown["ended_early"], shown["status"]) == (True, status)
    assert (shown["progress"], shown["steps"]) == (22, 40)
    assert shown["final"] is None, "an earlier step's value is no final value"
    assert not any(r["ended_early"] for r in data["runs"] if r["id"] != ended.pk)

    stats = next(c for c in data["statistics"]["cells"] if c["staleness"] == ASYNC and c["line"] == "grpo")
    assert (stats["n"], stats["n_ended_early"], stats["mean"]["value"]) == (1, 1, 0.45)
    assert row(data["statistics"]["cells"], SCHEDULE)["n_ended_early"] == 0

    # Its curve is drawn up to where it ended: both seeds to step 20, seed 0 alone after.
    if not params:
        curve = row(data["groups"], ASYNC)
        assert curve["n_seeds"] == 2 and curve["x"] == [0, 10, 20, 30, 40]
        assert curve["n"] == [2, 2, 2, 1, 1] and curve["mean"][2] == pytest.approx((0.35 + 0.35) / 2)

    # The summary table alone, and the API, say the same.
    asked = {"metric": "eval/accuracy", **params}
    table = alice_client.get(reverse("experiment-compare-summary", args=[probe.pk]), asked)
    assert {k: table.json()[k] for k in ("summary", "throughput")} == {
        "summary": data["summary"],
        "throughput": data["throughput"],
    }
    api = alice_client.get(
        f"/api/experiments/{probe.pk}/compare", asked, HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert api.status_code == 200, api.content
    assert row(api.json()["summary"], ASYNC) == cell and api.json()["n_ended_early"] == 1
    assert next(r for r in api.json()["runs"] if r["id"] == ended.pk)["ended_early"] is True


@pytest.mark.parametrize("status", ENDED)
def test_the_speedup_readout_and_the_throughput_leave_out_a_run_that_ended_early(alice_client, probe, status):
    end_at(async_run(probe), status, 22)
    data = payload(alice_client, probe)

    # Seed 0 alone: 2 s against 1 s a step, and 0.45 against 0.50 (not seed 1's 4× and −0.15).
    (readout,) = data["speedups"]
    assert (readout["staleness"], readout["reference"]) == (ASYNC, SCHEDULE)
    assert readout["speedup"]["value"] == pytest.approx(2.0) and readout["speedup"]["n_pairs"] == 1
    assert (readout["accuracy_change"]["value"], readout["accuracy_change"]["n_pairs"]) == (-0.05, 1)
    assert (readout["n_pairs"], readout["n_left_out"], readout["n_ended_early"]) == (1, 1, 1)
    assert readout["n_active"] == 0
    rates = row(data["throughput"], ASYNC)
    assert (rates["n_seeds"], rates["n_ended_early"], rates["n_active"]) == (1, 1, 0)
    assert rates["steps_per_hour"] == pytest.approx(3600 / 0.75), "seed 0's 1 s a step, 0.75 s of it steady"
    assert row(data["throughput"], SCHEDULE)["n_ended_early"] == 0


def test_with_contended_runs_left_out_a_cell_does_not_rest_on_a_run_that_ended_early(alice_client, probe):
    """The probe's async cell: seed 0 ran contended, seed 1 was cancelled at step 22. Its
    throughput rested on the cancelled run alone; now on no run, and it says why."""
    contended = async_run(probe, seed=0)
    contended.summary = measured(1.0, contended=True)
    contended.save(update_fields=["summary"])
    end_at(async_run(probe), Run.CANCELLED, 22)
    data = payload(alice_client, probe)
    rates = row(data["throughput"], ASYNC)
    assert (rates["n_seeds"], rates["steps_per_hour"]) == (0, None)
    assert (rates["n_contended"], rates["n_ended_early"]) == (1, 1)
    (readout,) = data["speedups"]
    assert (readout["n_pairs"], readout["n_left_out"], readout["n_ended_early"]) == (0, 2, 1)
    assert readout["speedup"]["value"] is None
    counted = payload(alice_client, probe, contended="1")
    assert row(counted["throughput"], ASYNC)["n_seeds"] == 1 and counted["speedups"][0]["n_pairs"] == 1


def test_a_run_that_stored_every_step_counts_whatever_its_status(alice_client, probe):
    """Failed after its last step was stored (e.g. while storing its measurement): its final values
    are a complete run's, so it counts as a finished seed; its status shows in the runs table."""
    failed = async_run(probe)
    Run.objects.filter(pk=failed.pk).update(status=Run.FAILED, error="storing the summary failed")
    data = payload(alice_client, probe)
    cell = row(data["summary"], ASYNC)
    assert (cell["n_seeds"], cell["value"], cell["n_ended_early"]) == (2, 0.45, 0)
    assert data["n_ended_early"] == 0 and data["speedups"][0]["n_pairs"] == 2
    shown = next(r for r in data["runs"] if r["id"] == failed.pk)
    assert (shown["status"], shown["ended_early"], shown["final"]) == (Run.FAILED, False, 0.45)


def test_a_run_still_going_is_partial_not_ended_early(alice_client, probe):
    going = async_run(probe)
    Run.objects.filter(pk=going.pk).update(status=Run.RUNNING, progress=22)
    cell = row(payload(alice_client, probe)["summary"], ASYNC)
    assert (cell["n_seeds"], cell["n_active"], cell["n_ended_early"]) == (2, 1, 0)


def test_a_claim_leaves_out_a_run_that_ended_early_and_says_so(alice_client, token, demo):
    """grpo stays within δ of on-policy at sync_offset=2: −0.005 from three seed pairs; with seed
    2's run cancelled at step 10 of 20 (0.49 then, not 0.735), from the two that finished."""
    configured_for(demo, 20)
    end_at(demo.runs.get(preset="grpo", staleness="sync_offset=2", seed=2), Run.CANCELLED, 10)
    body = {"experiment": demo.pk, "parts": [{"kind": "holds", "x": "grpo"}], "settings": ["sync_offset=2"]}
    response = alice_client.post(
        "/api/claims", json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert response.status_code == 201, response.content
    claim = response.json()
    (test,) = claim["by_setting"][0]["parts"]
    assert (test["estimate"], test["n"], test["paired"]) == (-0.005, 2, True)
    assert (claim["runs_ended_early"], claim["runs_total"], claim["runs_active"]) == (1, 5, 0)
    page = alice_client.get(f"/claims/{claim['id']}/").content.decode()
    assert "1 run of its cells ended early, left out" in page

    # The findings and drops on the comparison page rest on the same two seeds.
    data = payload(alice_client, demo)
    drop = next(d for d in data["drops"] if (d["preset"], d["staleness"]) == ("grpo", "sync_offset=2"))
    assert (drop["n_seeds"], drop["value"]) == (2, -0.005)
    assert data["n_ended_early"] == 1
