"""Comparison dashboard: how fast the comparison JSON answers for a large experiment, and how big it is.

Builds an experiment of `--runs` runs (presets × staleness settings × seeds) in a throwaway
database (Django's test database for `DATABASE_URL`, or a SQLite file under var/bench/), and
writes `--steps` steps × 8 metrics of every run through the real ingestion path: the worker's
`DatabaseSink` (claim, log every step, close, finish). Then, through Django's test client with a
logged-in member (the whole view: auth, queries, aggregation, JSON), it calls the comparison
endpoint `--calls` times per metric and reports the median time and the payload size, and it
times the comparison page until drawn in headless Chromium against a live server. The
reference measured in the same run is the plain ORM read of the metric's points (one
`values_list` query, a tuple per point), which is what the view did before it read one binary
array per run on PostgreSQL; on SQLite the view still reads that way, so there it is a floor. Pinned to 2 cores when the machine has more. The section, one per
database engine, goes into `BENCHMARKS.md`; the exit code is 0 when every metric's median is
within `--target-ms` and its payload within `--max-payload-mb`, else 1.

    .venv/bin/python bench/dashboard.py
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import sys
import time

from django_db import setup_django, test_database, two_cores  # bench/django_db.py, beside this script

SECTION = "## Comparison dashboard JSON on {database} (`bench/dashboard.py`)"
METRICS = (
    "reward/mean",
    "reward/std",
    "accuracy",
    "kl/init",
    "kl/behavior",
    "entropy",
    "response_length/mean",
    "loss",
)
PRESETS = ("reinforce", "grpo", "rec-oneside-nois", "red-drop")
STALENESS = ({}, {"sync_interval": 2}, {"sync_offset": 4}, {"sync_offset": 16}, {"offline": True})
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="a multiple of 20 (4 presets × 5 staleness)")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=7, help="timed calls per metric, after one warm-up")
    parser.add_argument("--target-ms", type=float, default=500.0)
    parser.add_argument("--max-payload-mb", type=float, default=2.0)
    parser.add_argument("--target-page-s", type=float, default=3.0)
    parser.add_argument("--page-loads", type=int, default=3)
    parser.add_argument(
        "--no-write", action="store_true", help="print the section, leave BENCHMARKS.md alone"
    )
    return parser.parse_args()


def ingest(n_runs: int, steps: int):
    """The experiment, its runs' metrics written through `DatabaseSink` like a worker does."""
    import numpy as np
    from django.contrib.auth import get_user_model

    from accounts.models import Membership, Team
    from experiments.models import Run
    from experiments.sweeps import create_experiment, expand
    from workers.sink import DatabaseSink

    user = get_user_model().objects.create_user("bench", password="bench-password-1")
    team = Team.objects.create(name="bench")
    Membership.objects.create(team=team, user=user, is_admin=True)
    seeds = list(range(n_runs // (len(PRESETS) * len(STALENESS))))
    base = {"model": {"tiny": {}}, "steps": steps, "device": "cpu"}
    sweep = expand(base, list(PRESETS), list(STALENESS), seeds)
    experiment = create_experiment(team, user, "bench", "", sweep)
    rng = np.random.default_rng(0)
    for run in experiment.runs.all():
        run.claim("bench", run.attempt)
        sink = DatabaseSink(run, "bench")
        walk = np.cumsum(rng.normal(0, 0.01, size=(steps, len(METRICS))), axis=0)
        for step in range(1, steps + 1):
            sink.log(step, dict(zip(METRICS, walk[step - 1].tolist(), strict=True)))
        sink.close()
        run.finish("bench", {"reward/mean": float(walk[-1, 0])})
    assert Run.objects.filter(experiment=experiment, status=Run.SUCCEEDED).count() == len(sweep.configs)
    return experiment, user


def settle(connection) -> None:
    """Bring the freshly written table to its steady state before timing: what autovacuum does
    shortly after a burst of inserts (statistics, and on PostgreSQL the visibility map that lets
    the covering index answer alone), so it does not compete for the 2 cores during the timings."""
    from experiments.models import MetricPoint

    table = connection.ops.quote_name(MetricPoint._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {table}" if connection.vendor == "postgresql" else f"ANALYZE {table}")


def measure(experiment, user, calls: int) -> list[dict]:
    from django.test import Client
    from django.urls import reverse

    from experiments.models import MetricPoint

    client = Client()
    client.force_login(user)
    url = reverse("experiment-compare-data", args=[experiment.pk])
    run_ids = list(experiment.runs.values_list("pk", flat=True))
    rows = []
    for metric in METRICS:
        client.get(url, {"metric": metric})
        times, orm_read = [], []
        for _ in range(calls):
            started = time.perf_counter()
            response = client.get(url, {"metric": metric})
            times.append(time.perf_counter() - started)
            assert response.status_code == 200, response.content[:500]
            started = time.perf_counter()
            points = list(
                MetricPoint.objects.filter(run_id__in=run_ids, name=metric)
                .order_by("run_id", "step")
                .values_list("run_id", "step", "value")
            )
            orm_read.append(time.perf_counter() - started)
        payload = response.json()
        rows.append(
            {
                "metric": metric,
                "median_ms": statistics.median(times) * 1000,
                "orm_read_ms": statistics.median(orm_read) * 1000,
                "payload_mb": len(response.content) / 1e6,
                "points": len(points),
                "shown": sum(len(g["x"]) for g in payload["groups"]),
                "groups": len(payload["groups"]),
            }
        )
    return rows


def page_seconds(experiment, loads: int) -> list[float]:
    """Seconds from navigating to the comparison page until it has drawn everything, per load, in
    headless Chromium against a live server (the first load also fetches Plotly.js)."""
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.test.testcases import LiveServerThread
    from django.urls import reverse
    from playwright.sync_api import sync_playwright

    server = LiveServerThread("127.0.0.1", StaticFilesHandler, port=0)
    server.daemon = True
    server.start()
    server.is_ready.wait()
    if server.error:
        raise server.error
    base = f"http://127.0.0.1:{server.port}"
    seconds = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(base + reverse("login"))
            page.fill("input[name=username]", "bench")
            page.fill("input[name=password]", "bench-password-1")
            page.click("button[type=submit]")
            page.wait_for_url(base + reverse("experiment-list"))
            for _ in range(loads):
                started = time.perf_counter()
                page.goto(base + reverse("experiment-compare", args=[experiment.pk]))
                page.wait_for_function(
                    "() => document.getElementById('compare').dataset.rendered", timeout=60_000
                )
                seconds.append(time.perf_counter() - started)
            browser.close()
    finally:
        server.terminate()
    return seconds


def report(
    rows: list[dict], page_s: list[float], args: argparse.Namespace, engine: str, ingest_s: float
) -> tuple[str, bool]:
    import numpy

    page_median = statistics.median(page_s)
    ok = page_median <= args.target_page_s and all(
        r["median_ms"] <= args.target_ms and r["payload_mb"] <= args.max_payload_mb for r in rows
    )
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        SECTION.format(database=engine),
        "",
        f"Measured {now} on {len(os.sched_getaffinity(0))} cores ({platform.processor() or platform.machine()}); "
        f"Python {platform.python_version()}, numpy {numpy.__version__}, database {engine}.",
        "",
        f"{args.runs} runs ({len(PRESETS)} presets × {len(STALENESS)} staleness settings × "
        f"{args.runs // (len(PRESETS) * len(STALENESS))} seeds) × {args.steps:,} steps × {len(METRICS)} metrics "
        f"= {args.runs * args.steps * len(METRICS):,} points, written through the worker's `DatabaseSink` "
        f"in {ingest_s:.0f} s, then `VACUUM ANALYZE` (`ANALYZE` on SQLite) of the table, as autovacuum "
        f"would. Each metric: one warm-up call, then the median of {args.calls} calls of "
        "`GET /experiments/<id>/compare/data?metric=…` (defaults: x step, band std, rule last) through "
        'Django\'s test client; "ORM read" is the median time of one `values_list` query of that '
        "metric's points (a Python tuple per point), the reference: on PostgreSQL the view reads one "
        'binary array per run instead, on SQLite it reads exactly this. "shown" is the number of '
        "points sent after downsampling (≤ 1,000 buckets per group).",
        "",
        "| metric | median ms | ORM read ms | view / ORM read | payload MB | points read | points shown "
        "| groups |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['metric']}` | {r['median_ms']:.0f} | {r['orm_read_ms']:.0f} | {r['median_ms'] / r['orm_read_ms']:.1f}× "
            f"| {r['payload_mb']:.2f} | {r['points']:,} | {r['shown']:,} | {r['groups']} |"
        )
    worst = max(rows, key=lambda r: r["median_ms"])
    largest = max(rows, key=lambda r: r["payload_mb"])
    lines += [
        "",
        f"Slowest median {worst['median_ms']:.0f} ms (`{worst['metric']}`), target ≤ {args.target_ms:.0f} ms; "
        f"largest payload {largest['payload_mb']:.2f} MB, target ≤ {args.max_payload_mb:.0f} MB; "
        f"comparison page (default view: {len(STALENESS)} panels, summary, degradation and scatter) drawn "
        f"in headless Chromium in {page_median:.2f} s, median of {len(page_s)} loads (first, fetching "
        f"Plotly.js: {page_s[0]:.2f} s), target ≤ {args.target_page_s:.0f} s: **{'PASS' if ok else 'FAIL'}**.",
        "",
    ]
    if engine != "postgresql":
        lines += [
            "The targets are for PostgreSQL, the team's database; this is the embedded default of "
            "`make up`, which reads every point as a Python tuple.",
            "",
        ]
    return "\n".join(lines), ok


def main() -> int:
    args = parse_args()
    two_cores()
    # Playwright's sync API runs an event loop in this thread; the ORM calls around it stay synchronous.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    setup_django()
    with test_database() as connection:
        started = time.perf_counter()
        experiment, user = ingest(args.runs, args.steps)
        ingest_s = time.perf_counter() - started
        settle(connection)
        rows = measure(experiment, user, args.calls)
        page_s = page_seconds(experiment, args.page_loads)
    section, ok = report(rows, page_s, args, connection.vendor, ingest_s)
    if not args.no_write:
        from bench.report import write_section  # the repository is on sys.path since setup_django

        write_section(section)
    print(section)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
