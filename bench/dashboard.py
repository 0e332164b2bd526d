"""Comparison dashboard and metric storage: how fast the comparison JSON answers for a large
experiment, how big it is, what a stored point costs on disk and how fast the sink stores them.

Builds an experiment of `--runs` runs (presets × staleness settings × seeds) in a throwaway
database (Django's test database for `DATABASE_URL`, or a SQLite file under var/bench/), and
writes `--steps` steps × 8 metrics of every run through the real ingestion path: the worker's
`DatabaseSink` (claim, log every step, close, finish), which stores them in chunks
(`experiments.series`). The reference, measured in the same run, is the row-per-point storage the
lab had before: every flush's points are also upserted into a table of one row per point with
its unique (run, name, step) index (covering value and wall time on PostgreSQL), and each
metric is read back from it the way the comparison read it (on PostgreSQL one binary array per
run, on SQLite a Python tuple per point). Reported: the flush rate of both (points per second
spent storing them), bytes per point on disk (table, TOAST and indexes), and per metric, through
Django's test client with a logged-in member (the whole view: auth, queries, aggregation, JSON),
the first call of the comparison endpoint (computed) and the median of `--calls` more (as a
polled dashboard asks: kept while no run changes, `dashboards.comparison.payloads`), the read of the
metric's points from the chunks and from the reference table, and the payload size. The
comparison page is timed until drawn in headless Chromium against a live server. Pinned to 2
cores when the machine has more. The section, one per database engine, goes into
`BENCHMARKS.md`; the exit code is 0 when every target holds.

`--grid team` measures a team's whole history instead: `--team-runs` runs (experiments of 200) ×
`--team-steps` steps × `--team-metrics` metrics, `--sink-runs` of them written flush by flush
through `series.Writer` (the ingest rate of a worker's sink), the rest loaded whole (chunks packed
at once); then bytes per point, the first and kept comparison of one experiment, and the Runs page
sorted by last(eval/accuracy) over all runs (read from the summaries). Its own section.

    .venv/bin/python bench/dashboard.py
    .venv/bin/python bench/dashboard.py --grid team
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

SECTION = "## Comparison dashboard JSON and metric storage on {database} (`bench/dashboard.py`)"
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
    parser.add_argument("--flush-every", type=int, default=5, help="steps logged between the sink's flushes")
    parser.add_argument("--calls", type=int, default=7, help="timed calls per metric, after one warm-up")
    parser.add_argument("--target-ms", type=float, default=100.0)
    parser.add_argument("--max-bytes-per-point", type=float, default=12.0)
    parser.add_argument("--max-payload-mb", type=float, default=2.0)
    parser.add_argument("--target-page-s", type=float, default=3.0)
    parser.add_argument("--page-loads", type=int, default=3)
    parser.add_argument(
        "--grid",
        choices=("experiment", "team"),
        default="experiment",
        help="experiment: the --runs × --steps comparison; team: --team-runs runs' whole history",
    )
    parser.add_argument(
        "--team-runs", type=int, default=1000, help="a multiple of 200 (experiments of 200 runs)"
    )
    parser.add_argument("--team-steps", type=int, default=10_000)
    parser.add_argument("--team-metrics", type=int, default=20)
    parser.add_argument(
        "--sink-runs", type=int, default=2, help="team runs written flush by flush as a sink does"
    )
    parser.add_argument("--team-compare-s", type=float, default=1.0)
    parser.add_argument("--team-list-ms", type=float, default=200.0)
    parser.add_argument(
        "--no-write", action="store_true", help="print the section, leave BENCHMARKS.md alone"
    )
    return parser.parse_args()


REFERENCE = "bench_metricpoint"  # the row-per-point table of before, the reference


def create_reference(connection) -> None:
    """The row-per-point table the lab stored metrics in before chunks, with its one index."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"CREATE TABLE {REFERENCE} (id bigserial PRIMARY KEY, run_id integer NOT NULL, "
                "name varchar(100) NOT NULL, step integer NOT NULL, value double precision NULL, "
                "wall_time timestamptz NOT NULL, UNIQUE (run_id, name, step) INCLUDE (value, wall_time))"
            )
        else:
            cursor.execute(
                f"CREATE TABLE {REFERENCE} (id integer PRIMARY KEY AUTOINCREMENT, run_id integer NOT NULL, "
                "name varchar(100) NOT NULL, step integer NOT NULL, value real NULL, "
                "wall_time datetime NOT NULL, UNIQUE (run_id, name, step))"
            )


def reference_upsert(connection, run_id: int, points: list[tuple]) -> None:
    """What the sink's flush did before: one INSERT … ON CONFLICT per point, NaN and ±inf as null."""
    import math

    ops = connection.ops
    sql = (
        f"INSERT INTO {REFERENCE} (run_id, name, step, value, wall_time) VALUES (%s, %s, %s, %s, %s) "
        "ON CONFLICT (run_id, name, step) DO UPDATE SET value = excluded.value, wall_time = excluded.wall_time"
    )
    rows = [
        (run_id, name, step, value if math.isfinite(value) else None, ops.adapt_datetimefield_value(wall))
        for name, step, value, wall in points
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


class TimedFlushes:
    """Around `experiments.series.Writer.write` as the sink calls it: times it, then stores the
    same points the row-per-point way and times that (the reference), flush by flush."""

    def __init__(self, connection):
        from experiments import series

        self.connection, self.writer = connection, series.Writer
        self.write = series.Writer.write
        self.seconds = self.reference_seconds = 0.0
        self.points = self.flushes = 0

    def __enter__(self):
        timed = self

        def write(writer, points):
            points = list(points)
            started = time.perf_counter()
            timed.write(writer, points)
            timed.seconds += time.perf_counter() - started
            started = time.perf_counter()
            reference_upsert(timed.connection, writer.run_id, points)
            timed.reference_seconds += time.perf_counter() - started
            timed.points += len(points)
            timed.flushes += 1

        self.writer.write = write
        return self

    def __exit__(self, *exc):
        self.writer.write = self.write


def ingest(n_runs: int, steps: int, flush_every: int):
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
            if step % flush_every == 0:
                sink.flush()  # as often as a trainer's sink flushes (every 0.5 s, a few steps)
        sink.close()
        run.finish("bench", {"reward/mean": float(walk[-1, 0])})
    assert Run.objects.filter(experiment=experiment, status=Run.SUCCEEDED).count() == len(sweep.configs)
    return experiment, user


def tables(connection, reference: bool = True) -> dict[str, str]:
    """The tables measured: the chunks, the summaries and (grid experiment) the reference."""
    from experiments.models import MetricChunk, MetricSummary

    measured = {"chunks": MetricChunk._meta.db_table, "summaries": MetricSummary._meta.db_table}
    return measured | ({"reference": REFERENCE} if reference else {})


def settle(connection, reference: bool = True) -> None:
    """Bring the freshly written tables to their steady state before measuring: their live rows
    only (PostgreSQL's `VACUUM FULL`, SQLite's `VACUUM`: the row versions a growing chunk's parts
    and the summaries' updates leave behind are space autovacuum hands back for reuse in a
    table being written, not what the points take), and statistics, so neither competes for the
    2 cores during the timings."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            for table in tables(connection, reference).values():
                cursor.execute(f"VACUUM (FULL, ANALYZE) {table}")
        else:
            cursor.execute("VACUUM")
            cursor.execute("ANALYZE")


def disk_bytes(connection, table: str) -> int:
    """A table's bytes on disk with its indexes (and TOAST on PostgreSQL; SQLite: its pages)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_total_relation_size(%s)", [table])
            return int(cursor.fetchone()[0])
        cursor.execute(
            "SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name IN "
            "(SELECT name FROM sqlite_master WHERE tbl_name = %s)",
            [table],
        )
        return int(cursor.fetchone()[0])


def reference_read(connection, run_ids: list[int], name: str) -> int:
    """A metric of the runs from the row-per-point table as the comparison read it before: on
    PostgreSQL one binary array per run of the covering index's columns, decoded by numpy; on
    SQLite a tuple per point into numpy. Returns the points read."""
    import numpy as np

    if connection.vendor != "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT run_id, step, value FROM {REFERENCE} WHERE name = %s AND run_id IN "
                f"({', '.join(['%s'] * len(run_ids))}) ORDER BY run_id, step",
                [name, *run_ids],
            )
            rows = cursor.fetchall()
        table = np.fromiter(rows, dtype=[("run", "i8"), ("step", "f8"), ("value", "f8")], count=len(rows))
        return len(table)
    import psycopg

    sql = (
        "SELECT run_id, array_send(array_agg(step)), array_send(array_agg(coalesce(value, 'NaN'))) "
        f"FROM {REFERENCE} WHERE name = %s AND run_id = ANY(%s) GROUP BY run_id"
    )
    connection.ensure_connection()
    n = 0
    with psycopg.Cursor(connection.connection) as cursor:
        for _, steps, values in cursor.execute(sql, [name, run_ids], binary=True).fetchall():
            for data, element in ((steps, ">i4"), (values, ">f8")):
                length = int(np.frombuffer(data, dtype=">i4", count=5)[3])
                pairs = np.frombuffer(
                    data, dtype=[("size", ">i4"), ("value", element)], offset=20, count=length
                )
                column = pairs["value"].astype(element[1:])
            n += len(column)
    return n


def measure(experiment, user, calls: int) -> list[dict]:
    from django.db import connection
    from django.test import Client
    from django.urls import reverse

    from dashboards.comparison import payloads
    from experiments import series

    client = Client()
    client.force_login(user)
    url = reverse("experiment-compare-data", args=[experiment.pk])
    run_ids = list(experiment.runs.values_list("pk", flat=True))
    rows = []
    for metric in METRICS:
        started = time.perf_counter()
        response = client.get(url, {"metric": metric})
        first = time.perf_counter() - started
        assert response.status_code == 200, response.content[:500]
        times, computed, reads, reference = [], [], [], []
        for _ in range(calls):
            started = time.perf_counter()
            response = client.get(url, {"metric": metric})
            times.append(time.perf_counter() - started)
            assert response.status_code == 200, response.content[:500]
            payloads.forget()  # nothing kept of this comparison (JSON nor statistics): computed again
            started = time.perf_counter()
            assert client.get(url, {"metric": metric}).status_code == 200
            computed.append(time.perf_counter() - started)
            started = time.perf_counter()
            points = series.by_run(run_ids, metric)
            reads.append(time.perf_counter() - started)
            started = time.perf_counter()
            n_reference = reference_read(connection, run_ids, metric)
            reference.append(time.perf_counter() - started)
        payload = response.json()
        n_points = sum(len(steps) for steps, _, _ in points.values())
        assert n_points == n_reference, (metric, n_points, n_reference)
        rows.append(
            {
                "metric": metric,
                "first_ms": first * 1000,
                "median_ms": statistics.median(times) * 1000,
                "computed_ms": statistics.median(computed) * 1000,
                "read_ms": statistics.median(reads) * 1000,
                "reference_ms": statistics.median(reference) * 1000,
                "payload_mb": len(response.content) / 1e6,
                "points": n_points,
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
    rows, page_s, args, engine: str, ingest_s: float, flushes, disk: dict[str, int]
) -> tuple[str, bool]:
    import numpy

    n_points = args.runs * args.steps * len(METRICS)
    page_median = statistics.median(page_s)
    rate, reference_rate = flushes.points / flushes.seconds, flushes.points / flushes.reference_seconds
    per_point = disk["chunks"] / n_points
    ok = (
        page_median <= args.target_page_s
        and per_point <= args.max_bytes_per_point
        and rate >= reference_rate
        and all(r["median_ms"] <= args.target_ms and r["payload_mb"] <= args.max_payload_mb for r in rows)
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
        f"= {n_points:,} points, written through the worker's `DatabaseSink` (its `series.Writer`) in {ingest_s:.0f} s "
        f"({flushes.flushes:,} flushes, one every {args.flush_every} steps or sooner; each flush's points also upserted a row each into the reference "
        "table), then `VACUUM (FULL, ANALYZE)` of the tables (`VACUUM` and `ANALYZE` on SQLite): bytes are "
        "the live rows' (table, TOAST and indexes).",
        "",
        "| storage | points per second of flush | bytes per point on disk |",
        "|---|---|---|",
        f"| chunks (`MetricChunk`) | {rate:,.0f} ({rate / reference_rate:.1f}× the reference) "
        f"| {per_point:.1f} (+ {disk['summaries'] / n_points:.2f} for the summaries) |",
        f"| a row per point (reference) | {reference_rate:,.0f} | {disk['reference'] / n_points:.1f} |",
        "",
        "Each metric: the first call of `GET /experiments/<id>/compare/data?metric=…` (defaults: x step, "
        "band std, rule last; the comparison computed), then the median of "
        f"{args.calls} calls (as a polled dashboard asks: the answer kept while no run changes) and the "
        f'median of {args.calls} "computed" calls (the kept JSON and statistics panel forgotten before '
        "each, as for a new metric, experiment or run state; the fixed-seed bootstrap tables stay drawn, "
        "as in any process past its first comparison) through "
        'Django\'s test client; "read" is the median time of reading that metric of all runs from the '
        'chunks (`experiments.series.by_run`), "row read" from the reference table as the view read it '
        'before (PostgreSQL: one binary array per run; SQLite: a tuple per point). "shown" is the '
        "number of points sent after downsampling (≤ 1,000 buckets per group).",
        "",
        "| metric | first call ms | median ms | computed median ms | read ms | row read ms | median / row read "
        "| payload MB | points read | points shown | groups |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['metric']}` | {r['first_ms']:.0f} | {r['median_ms']:.0f} | {r['computed_ms']:.0f} | {r['read_ms']:.0f} "
            f"| {r['reference_ms']:.0f} | {r['median_ms'] / r['reference_ms']:.2f}× "
            f"| {r['payload_mb']:.2f} | {r['points']:,} | {r['shown']:,} | {r['groups']} |"
        )
    worst = max(rows, key=lambda r: r["median_ms"])
    slowest_first = max(rows, key=lambda r: r["first_ms"])
    slowest_computed = max(rows, key=lambda r: r["computed_ms"])
    largest = max(rows, key=lambda r: r["payload_mb"])
    lines += [
        "",
        f"Slowest median {worst['median_ms']:.0f} ms (`{worst['metric']}`), target ≤ {args.target_ms:.0f} ms; "
        f"slowest first call {slowest_first['first_ms']:.0f} ms (`{slowest_first['metric']}`, no target); "
        f"slowest computed median {slowest_computed['computed_ms']:.0f} ms (`{slowest_computed['metric']}`, no target); "
        f"{per_point:.1f} bytes per point, target ≤ {args.max_bytes_per_point:g}; flush rate "
        f"{rate / reference_rate:.1f}× the reference, target ≥ 1; "
        f"largest payload {largest['payload_mb']:.2f} MB, target ≤ {args.max_payload_mb:.0f} MB; "
        f"comparison page (default view: {len(STALENESS)} panels, summary, degradation and scatter) drawn "
        f"in headless Chromium in {page_median:.2f} s, median of {len(page_s)} loads (first, fetching "
        f"Plotly.js: {page_s[0]:.2f} s), target ≤ {args.target_page_s:.0f} s: **{'PASS' if ok else 'FAIL'}**.",
        "",
    ]
    return "\n".join(lines), ok


TEAM_SECTION = "## Metric storage at a team's size on {database} (`bench/dashboard.py --grid team`)"
ACCURACY = "eval/accuracy"


def team_points(rng, steps: int, n_metrics: int, start_us: int):
    """One run's history: `ACCURACY` in [0, 1] and random walks, one point per step each, half a
    second apart with a jitter of up to 50 ms (in µs)."""
    import numpy as np

    names = [ACCURACY] + [f"metric/{i:02d}" for i in range(1, n_metrics)]
    walks = np.cumsum(rng.normal(0, 0.01, size=(n_metrics, steps)), axis=1)
    walks[0] = np.clip(0.3 + walks[0] * 0.5 + np.linspace(0, 0.4, steps), 0, 1).round(4)
    times = start_us + np.arange(steps, dtype=np.int64) * 500_000 + rng.integers(0, 50_000, size=steps)
    return names, np.arange(1, steps + 1, dtype=np.int64), walks, times


def load_run(run_id: int, names, steps, values, times) -> None:
    """A finished run's whole history at once: its chunks packed, its summaries (bulk load)."""
    from experiments import packing
    from experiments.models import MetricChunk
    from experiments.series import write

    chunks, summaries = [], {}
    for name, row in zip(names, values, strict=True):
        for chunk, part in packing.split(steps):
            data = packing.encode(chunk, steps[part], row[part], times[part], packed=True)
            chunks.append((run_id, name, chunk, 0, part.stop - part.start, True, *data))
        summaries[name] = packing.summarise(steps, row)
    write._upsert(MetricChunk, write.CHUNK_KEY, write.CHUNK_COLUMNS, chunks)
    write._upsert_summaries(run_id, summaries)


def team_grid(args) -> tuple[str, bool]:
    """1,000 runs' whole history: ingest (flush by flush through `series.Writer` for `--sink-runs`
    runs, then bulk), bytes per point, one experiment's comparison, the Runs list by accuracy."""
    import numpy as np
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.test import Client
    from django.urls import reverse

    from accounts.models import Membership, Team
    from experiments import packing, series
    from experiments.models import Run
    from experiments.sweeps import create_experiment, expand
    from rlcore.config import MAX_STEPS

    user = get_user_model().objects.create_user("bench", password="bench-password-1")
    team = Team.objects.create(name="bench")
    Membership.objects.create(team=team, user=user, is_admin=True)
    base = {"model": {"tiny": {}}, "steps": min(args.team_steps, MAX_STEPS), "device": "cpu"}
    sweep = expand(base, list(PRESETS), list(STALENESS), list(range(10)))
    experiments = [
        create_experiment(team, user, f"team {e}", "", sweep) for e in range(args.team_runs // 200)
    ]
    runs = list(Run.objects.filter(experiment__in=experiments).order_by("pk"))
    rng = np.random.default_rng(0)
    start_us = packing.micros(datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))
    sink_s = bulk_s = 0.0
    sink_points = bulk_points = 0
    for i, run in enumerate(runs):
        names, steps, values, times = team_points(rng, args.team_steps, args.team_metrics, start_us)
        started = time.perf_counter()
        if i < args.sink_runs:
            writer = series.Writer(run.pk)
            for lo in range(0, len(steps), args.flush_every):
                points = [
                    (name, int(steps[j]), float(values[m, j]), packing.wall_time(times[j]))
                    for j in range(lo, min(lo + args.flush_every, len(steps)))
                    for m, name in enumerate(names)
                ]
                with transaction.atomic():
                    writer.write(points)
                writer.committed()
            series.seal(run.pk)
            sink_s += time.perf_counter() - started
            sink_points += values.size
        else:
            with transaction.atomic():
                load_run(run.pk, names, steps, values, times)
            bulk_s += time.perf_counter() - started
            bulk_points += values.size
    Run.objects.filter(pk__in=[r.pk for r in runs]).update(status=Run.SUCCEEDED, progress=args.team_steps)
    settle(connection, reference=False)
    n_points = len(runs) * args.team_steps * args.team_metrics
    disk = {key: disk_bytes(connection, table) for key, table in tables(connection, reference=False).items()}

    client = Client()
    client.force_login(user)
    url = reverse("experiment-compare-data", args=[experiments[0].pk])
    started = time.perf_counter()
    response = client.get(url, {"metric": ACCURACY})
    compare_first = time.perf_counter() - started
    assert response.status_code == 200, response.content[:500]
    other = None  # another experiment's first call: computed too, in a process past its first request
    if len(experiments) > 1:
        started = time.perf_counter()
        assert (
            client.get(
                reverse("experiment-compare-data", args=[experiments[1].pk]), {"metric": ACCURACY}
            ).status_code
            == 200
        )
        other = time.perf_counter() - started
    compare_kept = []
    for _ in range(args.calls):
        started = time.perf_counter()
        client.get(url, {"metric": ACCURACY})
        compare_kept.append(time.perf_counter() - started)
    listing = []
    client.get(reverse("run-list"), {"sort": "accurate"})
    for _ in range(args.calls):
        started = time.perf_counter()
        page = client.get(reverse("run-list"), {"sort": "accurate"})
        listing.append(time.perf_counter() - started)
    assert page.status_code == 200
    shown = [run.pk for run in page.context["page"]]
    best = (
        Run.objects.annotate(a=series.summary("last_finite", ACCURACY))
        .order_by("-a", "-pk")
        .values_list("pk", flat=True)
    )
    assert shown == list(best[: len(shown)]), "the page's order is the summaries' order"

    per_point = disk["chunks"] / n_points
    list_ms = statistics.median(listing) * 1000
    ok = (
        compare_first <= args.team_compare_s
        and list_ms <= args.team_list_ms
        and per_point <= args.max_bytes_per_point
    )
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        TEAM_SECTION.format(database=connection.vendor),
        "",
        f"Measured {now} on {len(os.sched_getaffinity(0))} cores ({platform.processor() or platform.machine()}); "
        f"Python {platform.python_version()}, numpy {np.__version__}, database {connection.vendor}.",
        "",
        f"{len(runs):,} runs ({len(experiments)} experiments of 200: {len(PRESETS)} presets × {len(STALENESS)} "
        f"staleness settings × 10 seeds) × {args.team_steps:,} steps × {args.team_metrics} metrics = "
        f"{n_points:,} points (`{ACCURACY}` and random walks, a point per step, wall times 0.5 s apart with "
        f"jitter). {args.sink_runs} runs written flush by flush ({args.flush_every} steps a flush) through "
        f"`series.Writer`, as a worker's sink does: {sink_points / sink_s:,.0f} points/s; the other "
        f"{len(runs) - args.sink_runs:,} loaded whole (`load_run`: chunks packed at once, summaries): "
        f"{bulk_points / bulk_s:,.0f} points/s. Then `VACUUM (FULL, ANALYZE)` (SQLite: `VACUUM`, `ANALYZE`).",
        "",
        "| measure | value | target |",
        "|---|---|---|",
        f"| bytes per point on disk (chunks: table, TOAST, indexes) | {per_point:.2f} (+ "
        f"{disk['summaries'] / n_points:.3f} for the summaries) | ≤ {args.max_bytes_per_point:g} |",
        f"| comparison of one experiment (200 runs × {args.team_steps:,} steps of `{ACCURACY}`), the process's first "
        f"call (computed) | {compare_first:.2f} s | ≤ {args.team_compare_s:g} s |",
        *(
            [
                f"| another experiment's first call (computed; the process past its first request) | {other:.2f} s | |"
            ]
            if other is not None
            else []
        ),
        f"| the first experiment again, median of {args.calls} more (kept) | {statistics.median(compare_kept) * 1000:.0f} ms | |",
        f"| Runs page sorted by last(`{ACCURACY}`) over all {len(runs):,} runs (`?sort=accurate`, first page of "
        f"100, the whole view), median of {args.calls} | {list_ms:.0f} ms | ≤ {args.team_list_ms:g} ms |",
        "",
        f"**{'PASS' if ok else 'FAIL'}**.",
        "",
    ]
    return "\n".join(lines), ok


def main() -> int:
    args = parse_args()
    two_cores()
    # Playwright's sync API runs an event loop in this thread; the ORM calls around it stay synchronous.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    setup_django()
    if args.grid == "team":
        with test_database():
            section, ok = team_grid(args)
        if not args.no_write:
            from bench.report import write_section

            write_section(section)
        print(section)
        return 0 if ok else 1
    with test_database() as connection:
        create_reference(connection)
        started = time.perf_counter()
        with TimedFlushes(connection) as flushes:
            experiment, user = ingest(args.runs, args.steps, args.flush_every)
        ingest_s = time.perf_counter() - started
        settle(connection)
        disk = {key: disk_bytes(connection, table) for key, table in tables(connection).items()}
        rows = measure(experiment, user, args.calls)
        page_s = page_seconds(experiment, args.page_loads)
    section, ok = report(rows, page_s, args, connection.vendor, ingest_s, flushes, disk)
    from bench.report import publish  # the repository is on sys.path since setup_django

    return publish(section, ok, write=not args.no_write)


if __name__ == "__main__":
    sys.exit(main())
