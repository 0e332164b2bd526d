"""Execution as a sweep axis: one sweep of presets × {on-policy, sync_offset: 2, async ≤ 2} × 2
seeds on real workers, and the staleness answer (drops, tolerance, rank, findings, the degradation
plot's axis) with the async cell against the same on-policy runs, at the lag its runs logged."""

from __future__ import annotations

import numpy as np
import pytest
from django.urls import reverse
from support import TINY_CONFIG, logged, queue_sweep, wait_for

from experiments.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

CELLS = [{}, {"sync_offset": 2}, {"mode": "async", "max_staleness": 2}]
PRESETS = ["reinforce", "grpo"]


def final_accuracy(run: Run) -> float:
    return logged(run, "eval/accuracy")[-1][2]


def test_an_async_cell_is_compared_with_the_same_on_policy_runs(start_worker, team, alice, alice_client):
    config = {**TINY_CONFIG, "steps": 8, "eval_every": 4}
    experiment = queue_sweep(
        team, alice, "axis", config=config, presets=PRESETS, staleness=CELLS, seeds=[0, 1]
    )
    runs = list(experiment.runs.all())
    assert len(runs) == 12
    assert {r.staleness for r in runs} == {"on-policy", "sync_offset=2", "async ≤ 2"}
    assert {r.staleness: r.execution_mode for r in runs} == {
        "on-policy": "simulated",
        "sync_offset=2": "simulated",
        "async ≤ 2": "async",
    }
    start_worker()
    start_worker(queue="rollout")
    ids = [r.pk for r in runs]
    wait_for(
        lambda: not Run.objects.filter(pk__in=ids, status__in=Run.ACTIVE).exists(),
        600,
        "the sweep to end",
        0.5,
    )
    runs = list(experiment.runs.all())
    assert all(r.status == Run.SUCCEEDED for r in runs), [(r.pk, r.error) for r in runs]

    response = alice_client.get(reverse("experiment-compare-data", args=[experiment.pk]))
    assert response.status_code == 200
    payload = response.json()

    # The measured lag is what the async runs logged: the mean over their steps of `staleness/mean`.
    async_runs = [r for r in runs if r.staleness == "async ≤ 2"]
    run_lags = [np.mean([value for _, _, value in logged(r, "staleness/mean")]) for r in async_runs]
    lag = payload["lags"]["async ≤ 2"]
    assert lag["measured"] and lag["bound"] == 2
    assert lag["mean_lag"] == pytest.approx(float(np.mean(run_lags)), abs=1e-9)
    assert 0 <= lag["mean_lag"] <= 2
    # sync_offset=2 over 8 steps: v(t) = max(0, t − 3), lags t − 1 − v(t) = 0, 1, 2, 2, 2, 2, 2, 2.
    assert payload["lags"]["sync_offset=2"] == {"mean_lag": 13 / 8, "measured": False, "bound": None}
    assert payload["staleness"][0] == "on-policy"
    assert set(payload["staleness"]) == {"on-policy", "sync_offset=2", "async ≤ 2"}
    order = [payload["lags"][s]["mean_lag"] for s in payload["staleness"]]
    assert order == sorted(order), "the staleness axis runs from on-policy to the stalest by mean lag"

    # The drop of the async cell is its final value minus the same preset's on-policy runs', by seed.
    digits = payload["digits"]
    for preset in PRESETS:
        on_policy = {
            r.seed: final_accuracy(r) for r in runs if (r.preset, r.staleness) == (preset, "on-policy")
        }
        stale = {r.seed: final_accuracy(r) for r in runs if (r.preset, r.staleness) == (preset, "async ≤ 2")}
        drop = next(d for d in payload["drops"] if (d["preset"], d["staleness"]) == (preset, "async ≤ 2"))
        assert drop["baseline"] == {"staleness": "on-policy", "experiment": experiment.pk}
        assert drop["n_seeds"] == 2 and drop["interval"] == "min–max"
        expected = np.mean([stale[s] - on_policy[s] for s in (0, 1)])
        assert drop["value"] == pytest.approx(round(float(expected), digits), abs=10**-digits)
        row = next(r for r in payload["robustness"] if r["preset"] == preset)
        assert row["settings"] == [s for s in payload["staleness"] if s != "on-policy"]
        assert row["tolerance"] in payload["staleness"]
        assert row["rank"] in (1, 2), "both lines tested every cell, so both are ranked"

    # The degradation plot's rows (the final value per cell) include the async cell of each line.
    assert {(r["preset"], r["staleness"]) for r in payload["summary"]} == {
        (p, s) for p in PRESETS for s in ("on-policy", "sync_offset=2", "async ≤ 2")
    }
    # The finding about staleness is decided at the async cell too, and names it.
    degrades = next(f for f in payload["findings"] if f["claim"].startswith("Under staleness"))
    assert any(reason.startswith("at async ≤ 2:") for reason in degrades["reasons"]), degrades
    assert any(reason.startswith("at sync_offset=2:") for reason in degrades["reasons"]), degrades
