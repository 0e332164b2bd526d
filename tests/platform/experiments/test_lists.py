"""The lists say how each run executes and how long things took: a Mode column and filter on the
Runs list and the experiment's runs, and wall-clock (started, finished, duration; "so far" while a
run is going) on the run, experiment and list pages; the run page's CSV works with the session."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from support import TINY_CONFIG, log_points

from experiments.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def runs(make_run):
    simulated = make_run("sim")
    distributed = make_run("dist", config={**TINY_CONFIG, "execution": {"mode": "distributed"}})
    now = timezone.now()
    Run.objects.filter(pk=simulated.pk).update(
        status=Run.SUCCEEDED, started=now - timedelta(minutes=3, seconds=20), finished=now
    )
    Run.objects.filter(pk=distributed.pk).update(status=Run.RUNNING, started=now - timedelta(seconds=30))
    return Run.objects.get(pk=simulated.pk), Run.objects.get(pk=distributed.pk)


def test_the_runs_list_has_a_mode_column_and_filter(alice_client, runs):
    simulated, distributed = runs
    html = alice_client.get(reverse("run-list")).content.decode()
    assert '<td class="mode">distributed</td>' in html and '<td class="mode">simulated</td>' in html
    only = alice_client.get(reverse("run-list"), {"mode": "distributed"}).context["page"]
    assert [run.pk for run in only] == [distributed.pk]
    # Runs stored before execution modes existed have none in their config: simulated.
    Run.objects.filter(pk=simulated.pk).update(
        config={k: v for k, v in simulated.config.items() if k != "execution"}
    )
    assert [
        run.pk for run in alice_client.get(reverse("run-list"), {"mode": "simulated"}).context["page"]
    ] == [simulated.pk]
    bad = alice_client.get(reverse("run-list"), {"mode": "fast"}).content.decode()
    assert (
        "mode must be one of simulated, distributed, async, imported (got &#x27;fast&#x27;); not filtered"
        in bad
    )


def test_wall_clock_is_on_the_run_experiment_and_list_pages(alice_client, runs):
    simulated, distributed = runs
    listing = alice_client.get(reverse("run-list")).content.decode()
    assert '<td class="took">3 min 20 s</td>' in listing
    # Started 30 s before the fixture's `now`, so 30 s and more: a busy machine may take seconds to
    # get here (under a minute, which shows as "1 min 0 s").
    assert re.search(r'<td class="took">(3\d|[45]\d)\.\d\d s so far</td>', listing), (
        "a running run: how long so far"
    )
    page = alice_client.get(reverse("run-detail", args=[simulated.pk])).content.decode()
    assert (
        f"Started {timezone.localtime(simulated.started):%Y-%m-%d %H:%M:%S}" in page
        and "took 3 min 20 s" in page
    )
    running = alice_client.get(reverse("run-detail", args=[distributed.pk])).content.decode()
    assert "running for 3" in running  # 30-something seconds
    experiment = alice_client.get(
        reverse("experiment-detail", args=[simulated.experiment_id])
    ).content.decode()
    assert "took 3 min 20 s" in experiment
    experiments = alice_client.get(reverse("experiment-list")).content.decode()
    assert '<td class="took">3 min 20 s</td>' in experiments and "so far</td>" in experiments


def test_the_run_pages_csv_works_with_the_session(alice_client, runs):
    simulated, _ = runs
    log_points(simulated, [("loss", 1, 0.5, timezone.now()), ("loss", 2, float("nan"), timezone.now())])
    page = alice_client.get(reverse("run-detail", args=[simulated.pk])).content.decode()
    url = reverse("run-metrics-csv", args=[simulated.pk])
    assert f'href="{url}"' in page
    response = alice_client.get(url)
    assert response.status_code == 200 and response["Content-Type"] == "text/csv"
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [(r["name"], r["step"], r["value"]) for r in rows] == [("loss", "1", "0.5"), ("loss", "2", "")]
    assert Client().get(url).status_code == 302, "anonymous users log in first"


def test_the_runs_list_orders_by_duration_and_marks_measured_alone_and_contended_runs(
    alice_client, runs, make_run
):
    simulated, distributed = runs  # took 200 s; running for 30 s so far
    queued = make_run("queued")  # not started: last either way
    Run.objects.filter(pk=simulated.pk).update(
        serial=True, summary={"machine/contended": 1.0, "machine/others_cores": 1.2}
    )

    def order(sort: str) -> list[int]:
        return [run.pk for run in alice_client.get(reverse("run-list"), {"sort": sort}).context["page"]]

    assert order("longest") == [simulated.pk, distributed.pk, queued.pk]
    assert order("shortest") == [distributed.pk, simulated.pk, queued.pk]
    assert order("oldest") == sorted(order("newest"))
    response = alice_client.get(reverse("run-list"), {"sort": "fastest"})
    assert (
        "sort must be one of newest, oldest, longest, shortest, accurate, least-accurate (got &#x27;fastest&#x27;)"
        in response.content.decode()
    )
    html = alice_client.get(reverse("run-list")).content.decode()
    row = re.search(rf'aria-label="run {simulated.pk}".*?</tr>', html, re.S).group(0)
    assert "measured alone" in row and "contended" in row and "1.2 cores" in row


def test_the_runs_list_orders_by_last_held_out_accuracy_from_the_summaries(alice_client, runs, make_run):
    simulated, distributed = runs
    never = make_run("never evaluated")
    now = timezone.now()
    log_points(simulated, [("eval/accuracy", 0, 0.9, now), ("eval/accuracy", 20, 0.25, now)])
    log_points(distributed, [("eval/accuracy", 0, 0.1, now), ("eval/accuracy", 20, 0.5, now)])
    log_points(distributed, [("eval/accuracy", 30, float("nan"), now)])  # the last finite one counts

    def order(sort: str) -> list[int]:
        return [run.pk for run in alice_client.get(reverse("run-list"), {"sort": sort}).context["page"]]

    assert order("accurate") == [distributed.pk, simulated.pk, never.pk]
    assert order("least-accurate") == [simulated.pk, distributed.pk, never.pk], "no accuracy: last either way"
    with CaptureQueriesContext(connection) as queries:
        order("accurate")
    assert not [q for q in queries if "experiments_metricchunk" in q["sql"]], "summaries only"
    html = alice_client.get(reverse("run-list"), {"sort": "accurate"}).content.decode()
    assert '<option value="accurate" selected>highest last held-out accuracy first</option>' in html


def test_the_run_page_says_where_its_time_went(alice_client, runs):
    simulated, _ = runs
    summary = {
        "time/startup_s": 2.0,
        "time/warm_start_s": 30.0,
        "time/first_step_s": 1.0,
        "time/steady_s": 60.0,
        "time/eval_s": 5.0,
        "time/checkpoint_s": 2.0,
        "time/attempt_s": 100.0,
        "steps/steady": 149.0,
        "cpu/trainer_s": 90.0,
        "cpu/rollout_s": 0.0,
        "threads/trainer": 1.0,
        "machine/cores": 2.0,
        "machine/others_cores": 0.05,
        "machine/contended": 0.0,
    }
    Run.objects.filter(pk=simulated.pk).update(summary=summary)
    html = alice_client.get(reverse("run-detail", args=[simulated.pk])).content.decode()
    table = re.search(r'<table id="measurement">.*?</table>', html, re.S).group(0)
    text = " ".join(re.sub(r"<[^>]+>", " ", table).split())
    assert "θ0 warm start 30.00 s" in text and "the whole attempt 1 min 40 s" in text, text
    assert "steady steps (149) 1 min 0 s" in text and "0.05 · not contended" in text, text
    assert "its rollout jobs 1 min 30 s / 0 s" in text, text
