"""Summaries of ended runs and the `collapsed` flag.

The rule of `experiments.collapse` on explicit sequences (the first three are the held-out
accuracies that real runs of the built-in tiny model logged at lr 1, 3e-5 and 5e-4); then with a
real worker: a run at lr 1 collapses and one at the default lr does not, a succeeded run's
summary is exactly what its points give, and a run that fails at its first checkpoint (its
checkpoint folder cannot be created) gets a summary of the points it logged, shown on its page
and in the API; the comparison page, in a real headless Chromium, lists the collapsed runs.
"""

from __future__ import annotations

import csv
import io
import shutil
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from django.urls import reverse
from support import TINY_CONFIG, log_points, logged, queue_sweep, wait_for

from experiments.collapse import Collapse, find_collapse
from experiments.models import Run
from experiments.sweeps import create_experiment, expand

RUN_TIMEOUT_S = 240

LR_1 = [(0, 0.5), (2, 0.0), (4, 0.0), (6, 0.0), (8, 0.0), (10, 0.0)]
LR_3E_5 = [(0, 0.5), (2, 0.45), (4, 0.45), (6, 0.5), (8, 0.5), (10, 0.5)]
LR_5E_4 = [(0, 0.5), (2, 0.05), (4, 0.0), (6, 0.0), (8, 0.0), (10, 0.0)]

# The shipped θ0 of the built-in tiny model (held-out accuracy 0.5 on these 20 prompts), small batches.
SHIPPED_TINY = {
    "rollout": {"group_size": 4, "prompts_per_step": 4},
    "steps": 8,
    "eval_every": 2,
    "eval_size": 20,
    "checkpoint_every": 0,
    "samples_per_step": 0,
    "device": "cpu",
}


def test_the_collapse_rule_on_measured_and_edge_sequences():
    assert find_collapse(LR_1) == Collapse(best=0.5, best_step=0, step=2, last_step=10, last=0.0)
    assert find_collapse(LR_3E_5) is None
    # 0.05 is exactly a tenth of the best: near zero.
    assert find_collapse(LR_5E_4) == Collapse(best=0.5, best_step=0, step=2, last_step=10, last=0.0)
    # Just above a tenth, then zero only at the last evaluation: one reading is not "stayed".
    assert find_collapse([(0, 0.5), (2, 0.06), (4, 0.0)]) is None
    # Never learned: nothing to collapse from.
    assert find_collapse([(0, 0.0), (2, 0.0), (4, 0.0), (6, 0.0)]) is None
    # A dip that recovers.
    assert find_collapse([(0, 0.5), (2, 0.0), (4, 0.0), (6, 0.4)]) is None
    # Relative to the best before the fall, wherever it was; order of the input does not matter.
    assert find_collapse([(6, 0.0), (0, 0.3), (4, 0.05), (2, 0.6)]) == Collapse(
        best=0.6, best_step=2, step=4, last_step=6, last=0.0
    )
    # Missing values (logged NaN) are left out.
    assert find_collapse([(0, 0.5), (2, None), (4, 0.0), (6, 0.0)]).step == 4
    assert find_collapse([(0, 0.5), (2, 0.0)]) is None


def _ended(run: Run) -> Run:
    def ended():
        run.refresh_from_db()
        return not run.is_active

    wait_for(ended, RUN_TIMEOUT_S, f"{run} to end")
    return run


@pytest.mark.django_db(transaction=True)
def test_a_run_at_lr_1_collapses_and_one_at_the_default_lr_does_not(worker, team, alice, alice_client, token):
    runs = {
        lr: queue_sweep(team, alice, f"lr {lr}", config={**SHIPPED_TINY, "optimizer": {"lr": lr}}).runs.get()
        for lr in (1.0, 3e-5)
    }
    collapsed, healthy = (_ended(runs[lr]) for lr in (1.0, 3e-5))
    assert (collapsed.status, healthy.status) == (Run.SUCCEEDED, Run.SUCCEEDED), [
        collapsed.error,
        healthy.error,
    ]
    accuracy = {step: value for _, step, value in logged(collapsed, "eval/accuracy")}
    assert accuracy[0] >= 0.3 and max(accuracy[s] for s in (4, 6, 8)) <= 0.1 * accuracy[0], accuracy
    assert collapsed.collapsed is True and collapsed.summary["collapsed"] == 1.0
    assert collapsed.summary["collapsed_step"] == collapsed.collapse().step <= 4
    assert healthy.collapsed is False and healthy.summary["collapsed"] == 0.0 and healthy.collapse() is None

    page = alice_client.get(reverse("run-detail", args=[collapsed.pk])).content.decode()
    assert (
        'id="collapsed"' in page and "Collapsed:" in page and f"at step {collapsed.collapse().step}" in page
    )
    assert 'id="collapsed"' not in alice_client.get(reverse("run-detail", args=[healthy.pk])).content.decode()
    listing = alice_client.get(reverse("run-list")).content.decode()
    assert listing.count('class="collapsed"') == 1

    data = alice_client.get(
        reverse("runs-compare-data"), {"runs": f"{collapsed.pk},{healthy.pk}", "metric": "eval/accuracy"}
    ).json()
    assert {r["id"]: (r["collapsed"], r["collapsed_step"]) for r in data["runs"]} == {
        collapsed.pk: (True, collapsed.summary["collapsed_step"]),
        healthy.pk: (False, None),
    }
    assert sorted(row["n_collapsed"] for row in data["summary"]) == [0, 1]
    table = alice_client.get(
        reverse("runs-compare-summary"),
        {"runs": f"{collapsed.pk},{healthy.pk}", "metric": "eval/accuracy", "format": "csv"},
    ).content.decode()
    assert sorted(row["n_collapsed"] for row in csv.DictReader(io.StringIO(table))) == ["0", "1"]
    detail = alice_client.get(f"/api/runs/{collapsed.pk}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert detail["collapsed"] is True


@pytest.mark.django_db(transaction=True)
def test_a_succeeded_runs_summary_is_exactly_what_its_points_give(worker, team, alice):
    run = _ended(queue_sweep(team, alice, "ok").runs.get())
    assert run.status == Run.SUCCEEDED, run.error
    logged = {
        "steps",
        "completed",
        "eval/accuracy_initial",
        "eval/accuracy",
        "reward/mean",
        "kl/init",
        "collapsed",
    }
    # What its worker measured of it (workers.measure): no point holds those.
    measured = {
        *(
            f"time/{part}_s"
            for part in ("startup", "warm_start", "first_step", "steady", "eval", "checkpoint")
        ),
        *("time/eval_steady_s", "time/checkpoint_steady_s", "time/attempt_s", "steps/steady"),
        *("tokens/total", "tokens/steady", "cpu/trainer_s", "cpu/trainer_steady_s", "cpu/rollout_s"),
        *(
            "cpu/rollout_steady_s",
            "threads/trainer",
            "machine/cores",
            "machine/others_cores",
            "machine/contended",
        ),
    }
    assert set(run.summary) == logged | measured
    assert run.summary_from_points() == {name: run.summary[name] for name in logged}


@pytest.mark.django_db(transaction=True)
def test_a_run_that_fails_mid_way_has_a_summary_of_what_it_logged(worker, team, alice, alice_client, token):
    config = {**TINY_CONFIG, "steps": 40, "eval_every": 5, "checkpoint_every": 20}
    with transaction.atomic():  # the worker hears of the run only once the file is in place
        run = queue_sweep(team, alice, "fails", config=config).runs.get()
        # Where its first checkpoint goes, a file: writing the checkpoint of step 20 fails.
        run.checkpoint_dir.parent.mkdir(parents=True)
        run.checkpoint_dir.write_text("not a folder")
    try:
        _ended(run)
    finally:
        shutil.rmtree(run.checkpoint_dir.parent)
    assert run.status == Run.FAILED and "FileExistsError" in run.error, run.error
    points = {(name, step): value for name, step, value in logged(run)}
    assert max(step for _, step in points) == 20

    def value(name: str, step: int) -> float | None:
        return points[name, step]

    assert run.summary == {
        "steps": 20.0,
        "completed": 0.0,
        "eval/accuracy_initial": value("eval/accuracy", 0),
        "eval/accuracy": value("eval/accuracy", 20),
        "reward/mean": value("reward/mean", 20),
        "kl/init": value("kl/init", 20),
        "collapsed": 0.0,
    }
    assert None not in run.summary.values()

    page = alice_client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert "<h2>Summary</h2>" in page and "<td>kl/init</td>" in page
    detail = alice_client.get(f"/api/runs/{run.pk}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert detail["summary"] == run.summary and detail["collapsed"] is False


@pytest.mark.django_db
def test_a_new_attempt_starts_without_the_last_attempts_summary(team, alice):
    run = queue_sweep(team, alice, "again").runs.get()
    assert run.claim("w1", 1)
    log_points(run, [("reward/mean", 0, 0.25, run.started)])
    assert run.fail("w1", "RuntimeError: boom") and run.summary["reward/mean"] == 0.25
    assert run.retry() and run.summary["reward/mean"] == 0.25  # shown until a worker takes the new attempt
    assert run.claim("w2", 2) and run.summary == {}


@pytest.mark.django_db(transaction=True)
def test_the_comparison_page_lists_collapsed_runs(page, live_server, team, alice):
    """Runs of two experiments (lr 1 and lr 3e-5) ended with the held-out accuracies real runs logged."""
    ended = []
    for lr, accuracies in ((1.0, LR_1), (3e-5, LR_3E_5)):
        grid = expand({**SHIPPED_TINY, "steps": 10, "optimizer": {"lr": lr}}, ["grpo"], [{}], [0])
        # Claimed in the transaction that creates it: the module's real worker, alive after the
        # tests above, must not take it first when the message is sent on commit.
        with transaction.atomic():
            run = create_experiment(team, alice, f"lr {lr}", "", grid).runs.get()
            assert run.claim("w", 1)
        log_points(run, [("eval/accuracy", step, value, datetime.now(UTC)) for step, value in accuracies])
        assert run.finish("w", run.summary_from_points())
        ended.append(run)
    collapsed, healthy = ended
    assert (collapsed.collapsed, healthy.collapsed) == (True, False)

    page.goto(f"{live_server.url}{reverse('runs-compare')}?runs={collapsed.pk},{healthy.pk}")
    page.wait_for_selector("#compare[data-rendered]", state="attached")
    box = page.locator("#collapsed-runs")
    # The rule sits behind its disclosure ("How this is decided"), as every method paragraph does.
    assert box.is_visible() and "at most 0.1 of its own earlier best" in " ".join(box.text_content().split())
    assert box.locator("details.method summary").inner_text() == "How this is decided"
    items = box.locator("li")
    assert items.count() == 1 and items.first.get_attribute("data-run") == str(collapsed.pk)
    assert "collapsed at step 2, ended succeeded" in items.first.inner_text()
    cells = page.locator("#summary td[data-staleness]").all_inner_texts()
    assert sum("1 collapsed" in text for text in cells) == 1
    items.first.locator("a").click()
    page.wait_for_selector("#collapsed")
    assert "fell from its best, 0.5 at step 0" in page.locator("#collapsed").inner_text()


@pytest.mark.django_db
def test_a_run_reaped_with_a_cancel_pending_keeps_a_summary_of_its_points(team, alice):
    run = queue_sweep(team, alice, "gone").runs.get()
    assert run.claim("w1", 1)
    log_points(
        run,
        [
            (name, step, value, run.started)
            for name, step, value in [
                ("eval/accuracy", 0, 0.25),
                ("reward/mean", 1, 0.5),
                ("reward/mean", 2, 0.75),
            ]
        ],
    )
    assert run.cancel()
    Run.objects.filter(pk=run.pk).update(heartbeat=run.started - timedelta(hours=1))
    assert Run.reap() == [run]
    run.refresh_from_db()
    assert run.status == Run.CANCELLED
    assert run.summary == {
        "steps": 2.0,
        "completed": 0.0,
        "eval/accuracy_initial": 0.25,
        "eval/accuracy": 0.25,
        "reward/mean": 0.75,
        "collapsed": 0.0,
    }
