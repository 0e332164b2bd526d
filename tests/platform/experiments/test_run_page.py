"""The run page: its curves as JSON (every metric it logged, downsampled on the server with spikes
kept, null for missing values, team-scoped), the completions other runs of the experiment gave
to the same prompts, side by side and escaped, from a number of queries that does not grow with runs,
and for distributed and async runs the execution mode, the rollout jobs (latest first, bounded, with
counts per status, escaped) and what the run reported about its execution, in units people read."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from sample_experiments import START, make_finished_experiment, reward
from support import TINY_CONFIG, log_points, new_team_member, queue_sweep

from experiments.models import Completion, RolloutJob, Run

pytestmark = pytest.mark.django_db

SCRIPT = "<script>alert(1)</script>"


@pytest.fixture
def bob(django_user_model):
    bob = new_team_member("bob", "team-b")
    return bob


def curves(client, run) -> dict:
    response = client.get(reverse("run-curves", args=[run.pk]))
    assert response.status_code == 200, response.content
    return response.json()


def add_points(run, name: str, values: list[float | None]) -> None:
    log_points(
        run, [(name, step, value, START + timedelta(seconds=step)) for step, value in enumerate(values)]
    )


def test_the_curves_json_has_every_metric_the_run_logged(alice_client, team, alice):
    experiment = make_finished_experiment(team, alice, seeds=(0,), steps=4)
    run = experiment.runs.get(preset="grpo", staleness="sync_offset=2")
    payload = curves(alice_client, run)
    assert payload["run"] == run.pk and payload["active"] is False
    metrics = payload["metrics"]
    assert set(metrics) == {
        "reward/mean",
        "eval/accuracy",
        "kl/init",
        "response_length/mean",
        "time/step_s",
        "tokens_per_s",
    }
    assert metrics["kl/init"]["x"] == [0, 1, 2, 3, 4]
    assert metrics["kl/init"]["y"] == pytest.approx([0.0, 0.02, 0.04, 0.06, 0.08])
    assert metrics["reward/mean"]["y"] == pytest.approx([reward(s, 4, 1, 1, 0) for s in range(5)])
    assert metrics["response_length/mean"] == {"x": [0, 1, 2, 3, 4], "y": [10, 10, 10, 10, 10]}
    assert metrics["time/step_s"]["x"] == [1, 2, 3, 4], "no step time at step 0"
    assert metrics["time/step_s"]["y"] == pytest.approx([1.2, 1.8, 1.2, 1.8])

    Run.objects.filter(pk=run.pk).update(status=Run.RUNNING)
    assert curves(alice_client, run)["active"] is True


def test_a_long_metric_is_downsampled_keeping_its_spike_first_and_last_points(alice_client, team, alice):
    experiment = make_finished_experiment(
        team, alice, presets=("grpo",), staleness=({},), seeds=(0,), steps=2
    )
    run = experiment.runs.get()
    values = [step / 5000 for step in range(5000)]
    values[2345] = 10.0
    values[3001] = -7.0
    add_points(run, "loss", values)
    with CaptureQueriesContext(connection) as queries:
        loss = curves(alice_client, run)["metrics"]["loss"]
    assert len([q for q in queries if "experiments_metricchunk" in q["sql"]]) == 1, "one query for all points"
    assert 1000 < len(loss["x"]) <= 3001 and len(loss["y"]) == len(loss["x"])
    assert loss["x"] == sorted(set(loss["x"]))
    assert (loss["x"][0], loss["x"][-1]) == (0, 4999)
    shown = dict(zip(loss["x"], loss["y"], strict=True))
    assert shown[2345] == 10.0 and shown[3001] == -7.0 and shown[4999] == pytest.approx(0.9998)
    assert all(shown[x] == pytest.approx(values[x], abs=1e-5) for x in loss["x"])


def test_missing_values_come_back_as_null(alice_client, team, alice):
    experiment = make_finished_experiment(
        team, alice, presets=("grpo",), staleness=({},), seeds=(0,), steps=2
    )
    run = experiment.runs.get()
    add_points(run, "grad_norm", [0.5, float("nan"), 0.75])  # logged as they came: NaN, ±infinity
    add_points(run, "entropy", [float("inf"), float("-inf")])
    metrics = curves(alice_client, run)["metrics"]
    assert metrics["grad_norm"] == {"x": [0, 1, 2], "y": [0.5, None, 0.75]}
    assert metrics["entropy"] == {"x": [0, 1], "y": [None, None]}


def test_the_recent_metrics_tell_a_logged_nan_or_inf_from_a_gap(alice_client, team, alice):
    experiment = make_finished_experiment(
        team, alice, presets=("grpo",), staleness=({},), seeds=(0,), steps=2
    )
    run = experiment.runs.get()
    add_points(run, "grad_norm", [0.5, float("nan"), 0.75])
    add_points(run, "entropy", [float("inf"), float("-inf")])  # nothing at step 2
    page = alice_client.get(reverse("run-detail", args=[run.pk])).content.decode()
    rows = dict(re.findall(r"<tr><td>(grad_norm|entropy)</td>(.*?)</tr>", page))
    assert re.findall(r"<td>(.*?)</td>", rows["grad_norm"]) == ["0.5", "NaN", "0.75"]
    assert re.findall(r"<td>(.*?)</td>", rows["entropy"]) == ["inf", "-inf", "–"]


def test_the_curves_of_another_teams_run_are_404_and_anonymous_users_log_in(client, team, alice, bob):
    run = make_finished_experiment(team, alice, presets=("grpo",), staleness=({},), seeds=(0,)).runs.get()
    url = reverse("run-curves", args=[run.pk])
    response = client.get(url)
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    client.force_login(bob)
    assert client.get(url).status_code == 404
    assert client.get(reverse("run-curves", args=[run.pk + 1000])).status_code == 404


def complete(run, step: int, prompt: str, completion: str, reward: float | None = 1.0) -> None:
    Completion.objects.create(run=run, step=step, prompt=prompt, completion=completion, reward=reward)


def side_by_side(page: str) -> list[tuple[str, list[list[str]]]]:
    """The tables of "Same prompts in other runs": (prompt, rows of cell texts) per prompt."""
    section = page.split('<div id="same-prompts">', 1)[1]
    tables = []
    for prompt, table in re.findall(
        r"<h3>Prompt <code>(.*?)</code></h3>\s*<table.*?>(.*?)</table>", section, re.S
    ):
        rows = []
        for row in re.findall(r"<tr data-run.*?>(.*?)</tr>", table, re.S):
            cells = re.findall(r"<td>(.*?)</td>", row, re.S)
            rows.append([html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in cells])
        tables.append((html.unescape(prompt), rows))
    return tables


def test_other_runs_completions_of_the_same_prompts_are_side_by_side_and_escaped(alice_client, team, alice):
    experiment = make_finished_experiment(team, alice, seeds=(0, 1), steps=2)
    runs = {(r.preset, r.staleness, r.seed): r for r in experiment.runs.all()}
    this = runs["reinforce", "on-policy", 0]
    complete(this, 1, "11+11=", "22")
    complete(this, 2, "12+34=", "46", 1.0)
    # Same seed, same prompts at the same steps.
    complete(runs["grpo", "on-policy", 0], 2, "12+34=", SCRIPT, 0.0)
    complete(runs["grpo", "on-policy", 0], 1, "11+11=", "23", 0.0)
    # The same prompt at another step too: the one at this run's step is shown.
    complete(runs["reinforce", "sync_offset=2", 0], 2, "12+34=", "46", 1.0)
    complete(runs["reinforce", "sync_offset=2", 0], 1, "12+34=", "44", 0.0)
    # Never at this run's step: its latest one is shown.
    complete(runs["grpo", "sync_offset=2", 0], 0, "12+34=", "40", 0.0)
    complete(runs["grpo", "sync_offset=2", 0], 1, "12+34=", "45", 0.0)
    # Another seed met one of the prompts at step 0; and a prompt of no one else.
    complete(runs["reinforce", "on-policy", 1], 0, "11+11=", "2", None)
    complete(runs["grpo", "on-policy", 1], 2, "99+1=", "100")
    # Another experiment with the same prompt does not count.
    elsewhere = make_finished_experiment(
        team, alice, name="other", presets=("grpo",), staleness=({},), seeds=(0,)
    )
    complete(elsewhere.runs.get(), 2, "12+34=", "other experiment")

    response = alice_client.get(reverse("run-detail", args=[this.pk]))
    page = response.content.decode()

    def row(key, step: int, text: str, reward: str) -> list[str]:
        run = runs[key]
        name = f"run {run.pk} (this run)" if run == this else f"run {run.pk}"
        return [name, run.preset, run.staleness, str(run.seed), str(step), text, reward]

    def in_run_order(*rows: list[str]) -> list[list[str]]:
        return sorted(rows, key=lambda r: int(r[0].split()[1]))

    assert side_by_side(page) == [
        (
            "12+34=",
            [
                row(("reinforce", "on-policy", 0), 2, "46", "1.00"),
                *in_run_order(
                    row(("grpo", "on-policy", 0), 2, SCRIPT, "0.00"),
                    row(("reinforce", "sync_offset=2", 0), 2, "46", "1.00"),
                    row(("grpo", "sync_offset=2", 0), 1, "45", "0.00"),
                ),
            ],
        ),
        (
            "11+11=",
            [
                row(("reinforce", "on-policy", 0), 1, "22", "1.00"),
                *in_run_order(
                    row(("grpo", "on-policy", 0), 1, "23", "0.00"),
                    row(("reinforce", "on-policy", 1), 0, "2", ""),
                ),
            ],
        ),
    ]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and SCRIPT not in page
    assert f'href="{reverse("run-detail", args=[runs["grpo", "on-policy", 0].pk])}"' in page
    assert 'class="this-run"' in page
    # The live fragment renders the same tables.
    live = alice_client.get(reverse("run-live", args=[this.pk])).content.decode()
    assert side_by_side(live) == side_by_side(page)


def test_the_side_by_side_tables_are_bounded(alice_client, team, alice):
    experiment = make_finished_experiment(
        team, alice, presets=("reinforce", "grpo"), staleness=({},), seeds=tuple(range(7)), steps=2
    )
    this, *others = experiment.runs.order_by("pk")
    assert len(others) == 13
    for step in range(1, 8):
        complete(this, step, f"q{step}", "a")
    for i, run in enumerate(others):
        # Every other run met the latest prompt, the odd ones at this run's step: those are kept first.
        complete(run, 7 if i % 2 else 3, "q7", f"b{i}")
        complete(run, 1, "q1", "c")
    page = alice_client.get(reverse("run-detail", args=[this.pk])).content.decode()
    tables = side_by_side(page)
    assert [prompt for prompt, _ in tables] == ["q7"], "q1 is not among the 5 latest prompts"
    rows = tables[0][1]
    assert len(rows) == 1 + 12 and "this run" in rows[0][0]
    kept = {row[0] for row in rows[1:]}
    assert {f"run {r.pk}" for i, r in enumerate(others) if i % 2} <= kept
    assert f"run {others[-1].pk}" not in kept, "the last run met q7 at another step and is the one left out"
    assert [int(row[0].split()[1]) for row in rows[1:]] == sorted(int(row[0].split()[1]) for row in rows[1:])


def test_the_run_page_queries_do_not_grow_with_the_number_of_runs(alice_client, team, alice):
    def queries(seeds: int) -> int:
        experiment = make_finished_experiment(
            team,
            alice,
            name=f"{seeds}",
            presets=("reinforce", "grpo"),
            staleness=({},),
            seeds=tuple(range(seeds)),
        )
        for run in experiment.runs.all():
            for step in range(3):
                complete(run, step, f"{step}+{step}=", f"{run.pk}")
        this = experiment.runs.first()
        with CaptureQueriesContext(connection) as captured:
            response = alice_client.get(reverse("run-detail", args=[this.pk]))
        assert response.status_code == 200
        assert len(side_by_side(response.content.decode())[0][1]) == 2 * seeds
        return len(captured)

    assert queries(1) == queries(3)


def distributed_run(team, alice, mode: str = "distributed") -> Run:
    config = {**TINY_CONFIG, "execution": {"mode": mode, "rollout_workers": 2}}
    experiment = queue_sweep(team, alice, mode, config=config)
    return experiment.runs.get()


def add_job(run, step: int, part: int, status: str, **fields) -> RolloutJob:
    return RolloutJob.objects.create(
        run=run,
        step=step,
        part=part,
        groups_start=2 * part,
        groups_stop=2 * part + 2,
        status=status,
        **fields,
    )


def rollout_jobs(page: str) -> list[list[str]]:
    """The cell texts of every row of the rollout jobs table."""
    table = page.split('<table id="rollout-jobs">', 1)[1].split("</table>", 1)[0]
    return [
        [
            html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
            for c in re.findall(r"<td.*?>(.*?)</td>", row, re.S)
        ]
        for row in re.findall(r"<tr data-job.*?>(.*?)</tr>", table, re.S)
    ]


def text_of(page: str, element_id: str) -> str:
    """The text of the element with id `element_id`, tags dropped and white space collapsed."""
    tag, rest = re.search(rf'<(\w+) id="{element_id}">(.*)', page, re.S).groups()
    inner = rest.split(f"</{tag}>", 1)[0]
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", inner)).split())


def test_a_distributed_runs_page_shows_its_rollout_jobs_latest_first_and_escaped(alice_client, team, alice):
    run = distributed_run(team, alice)
    Run.objects.filter(pk=run.pk).update(status=Run.RUNNING, worker="trainer@a")
    for step in (1, 2):
        for part in (0, 1):
            add_job(
                run,
                step,
                part,
                RolloutJob.DONE,
                version=step - 1,
                worker=f"rollout{part}@b",
                started=START,
                finished=START + timedelta(seconds=1.5 if part else 0.25),
            )
    add_job(run, 3, 0, RolloutJob.RUNNING, version=2, worker=SCRIPT, attempt=2, started=START)
    add_job(run, 3, 1, RolloutJob.FAILED, version=2, worker="rollout1@b", attempt=3, error=SCRIPT)
    add_job(run, 4, 0, RolloutJob.QUEUED)

    add_job(run, 2, 0, RolloutJob.QUEUED, kind=RolloutJob.EVAL, version=2)
    page = alice_client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert "execution distributed" in page
    assert rollout_jobs(page) == [
        ["4", "batch", "0", "queued", "–", "–", "1", "–"],
        ["3", "batch", "0", "running", "2", SCRIPT, "2", "–"],
        ["3", "batch", "1", "failed", "2", "rollout1@b", "3", "–"],
        ["2", "batch", "0", "done", "1", "rollout0@b", "1", "250.0 ms"],
        ["2", "batch", "1", "done", "1", "rollout1@b", "1", "1.50 s"],
        ["2", "eval", "0", "queued", "2", "–", "1", "–"],
        ["1", "batch", "0", "done", "0", "rollout0@b", "1", "250.0 ms"],
        ["1", "batch", "1", "done", "0", "rollout1@b", "1", "1.50 s"],
    ]
    assert text_of(page, "rollout-job-counts") == "8 jobs: 2 queued · 1 running · 4 done · 1 failed"
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and SCRIPT not in page
    assert 'title="&lt;script&gt;alert(1)&lt;/script&gt;"' in page, "a failed job's error, escaped"
    assert 'id="execution-report"' not in page, "nothing to report before the run finishes"

    # The live fragment, re-fetched while the run is active, carries the table.
    live = alice_client.get(reverse("run-live", args=[run.pk])).content.decode()
    assert 'data-active="true"' in live and rollout_jobs(live) == rollout_jobs(page)


def test_a_finished_async_runs_execution_report_is_in_units_people_read(alice_client, team, alice):
    run = distributed_run(team, alice, mode="async")
    assert run.staleness == "async ≤ 1"
    summary = {
        "reward/mean": 0.5,
        "weights/publish_s_mean": 0.0123,
        "weights/publish_bytes": 4.5 * 1024**2,
        "idle/trainer_frac": 0.25,
        "idle/rollout_frac": 0.4,
    }
    Run.objects.filter(pk=run.pk).update(status=Run.SUCCEEDED, summary=summary)
    add_job(
        run,
        1,
        0,
        RolloutJob.DONE,
        version=0,
        worker="w",
        started=START,
        finished=START + timedelta(seconds=75),
    )
    page = alice_client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert "execution async" in page
    assert text_of(page, "execution-report") == (
        "weights publish time, mean 12.3 ms weights published, in all 4.5 MB "
        "trainer idle, waiting for batches 25.0% rollout workers idle 40.0%"
    )
    assert rollout_jobs(page) == [["1", "batch", "0", "done", "0", "w", "1", "1 min 15 s"]]
    assert 'data-active="false"' in page


def test_the_rollout_jobs_table_is_bounded_and_a_simulated_run_has_none(alice_client, team, alice):
    run = distributed_run(team, alice)
    RolloutJob.objects.bulk_create(
        RolloutJob(run=run, step=step, part=part, groups_start=0, groups_stop=1, status=RolloutJob.DONE)
        for step in range(1, 31)
        for part in (0, 1)
    )
    page = alice_client.get(reverse("run-detail", args=[run.pk])).content.decode()
    rows = rollout_jobs(page)
    assert len(rows) == 50
    assert [row[:3] for row in (rows[0], rows[1], rows[-1])] == [
        ["30", "batch", "0"],
        ["30", "batch", "1"],
        ["6", "batch", "1"],
    ]
    assert text_of(page, "rollout-job-counts") == "60 jobs: 60 done · the latest 50 shown"

    simulated = make_finished_experiment(team, alice, presets=("grpo",), staleness=({},), seeds=(0,))
    page = alice_client.get(reverse("run-detail", args=[simulated.runs.get().pk])).content.decode()
    assert "execution simulated" in page
    assert (
        'id="rollout-jobs"' not in page and "Rollout jobs" not in page and 'id="execution-report"' not in page
    )


def test_a_run_whose_stored_config_todays_bounds_refuse_still_has_its_page(alice_client, team, alice):
    """A config stored before a bound existed (here: more steps than allowed now) must not turn
    the run's page, its row and the experiment page into a 500; the run fails with the reason
    when a worker starts it."""
    experiment = make_finished_experiment(team, alice, seeds=(0,), steps=4)
    run = experiment.runs.first()
    Run.objects.filter(pk=run.pk).update(status=Run.QUEUED, config={**run.config, "steps": 10**9})
    for url in (
        reverse("run-detail", args=[run.pk]),
        reverse("experiment-detail", args=[experiment.pk]),
    ):
        response = alice_client.get(url)
        assert response.status_code == 200, (url, response.status_code)
