"""Runs query language: how fast `GET /api/runs?q=…` answers over 10,000 runs when the query filters
by a summary of a logged metric (`last(eval/accuracy) > 0.6`), against the same call filtering by a
plain column (`preset = grpo`), measured in the same run.

Builds `--runs` runs (in experiments of 200) in a throwaway database (Django's test database for
`DATABASE_URL`: PostgreSQL is what the acceptance line is about), each with `--evals` points of
`eval/accuracy` and `--steps` points of `kl/init` (one `experiments.series.Writer` write per run: this
measures reading, not ingestion), some tags, then `VACUUM ANALYZE`. Each query: one warm-up call, then the median of
`--calls` calls through Django's test client with an API token (the whole view: auth, parsing,
the count and the first page of 100). "Python filter" is the reference a client without a query
language has: one query for every run's last `eval/accuracy`, then filtering in Python. Pinned to
2 cores when the machine has more. Writes its section into BENCHMARKS.md; the exit code is 0 when
every summary query's median is under `--target-s`.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/test .venv/bin/python bench/run_query.py
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

from django_db import ROOT, setup_django, test_database, two_cores  # bench/django_db.py, beside this script

SECTION = "## Runs query over 10,000 runs (`bench/run_query.py`)"
QUERIES = (
    ("plain column (reference)", "preset = grpo"),
    ("summary", "last(eval/accuracy) > 0.6"),
    ("summary and config", "max(kl/init) < 0.5 and algorithm.preset = grpo"),
    ("tags, config, not", "(tag = look or staleness.sync_offset >= 8) and not status = failed"),
    ("two summaries, or", "last(eval/accuracy) > 0.7 or mean(kl/init) > 0.9"),
)
PRESETS = ("reinforce", "grpo", "rec-oneside-nois", "m2po")
STALENESS = ({}, {"sync_offset": 4}, {"sync_offset": 8}, {"sync_offset": 16}, {"offline": True})


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000, help="a multiple of 200")
    parser.add_argument("--evals", type=int, default=11)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--calls", type=int, default=7)
    parser.add_argument("--target-s", type=float, default=1.0)
    parser.add_argument(
        "--no-write", action="store_true", help="print the section, leave BENCHMARKS.md alone"
    )
    return parser.parse_args()


def build(n_runs: int, evals: int, steps: int):
    """Experiments of 200 runs (4 presets × 5 staleness settings × 10 seeds) with their points."""
    import numpy as np
    from django.contrib.auth import get_user_model
    from django.db import transaction
    from django.utils import timezone
    from support import TINY_CONFIG

    from accounts.models import ApiToken, Membership, Team
    from experiments.models import Experiment, Run, RunTag
    from experiments.series import Writer
    from experiments.sweeps import expand

    user = get_user_model().objects.create_user("bench", password="bench-password-1")
    team = Team.objects.create(name="bench")
    Membership.objects.create(team=team, user=user, is_admin=True)
    sweep = expand({**TINY_CONFIG, "steps": steps}, list(PRESETS), list(STALENESS), list(range(10)))
    rng = np.random.default_rng(0)
    now = timezone.now()
    for e in range(n_runs // len(sweep.configs)):
        experiment = Experiment.objects.create(team=team, owner=user, name=f"grid {e}", spec=sweep.as_spec())
        runs = Run.objects.bulk_create(
            [
                Run(
                    experiment=experiment,
                    config=config.model_dump(mode="json"),
                    preset=config.algorithm.preset,
                    staleness=config.staleness_label,
                    seed=config.seed,
                    status=Run.FAILED if i % 50 == 0 else Run.SUCCEEDED,
                    progress=steps,
                )
                for i, config in enumerate(sweep.configs)
            ]
        )
        for run in runs:
            accuracy = 0.3 + 0.5 * rng.random()
            points = [
                ("eval/accuracy", s * (steps // (evals - 1)), accuracy * s / (evals - 1), now)
                for s in range(evals)
            ]
            points += [("kl/init", s, float(rng.random()) * s / steps, now) for s in range(steps + 1)]
            with transaction.atomic():
                Writer(run.pk).write(points)
        RunTag.objects.bulk_create([RunTag(run=run, name="look") for run in runs[::7]])
    return user, ApiToken.issue(user)


def settle(connection) -> None:
    with connection.cursor() as cursor:
        for table in ("experiments_metricsummary", "experiments_run", "experiments_runtag"):
            cursor.execute(
                f"VACUUM ANALYZE {table}" if connection.vendor == "postgresql" else f"ANALYZE {table}"
            )


def measure(token: str, calls: int) -> list[dict]:
    from django.test import Client

    client = Client()
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    rows = []
    for label, q in QUERIES:
        first = client.get("/api/runs", {"q": q}, **headers)
        assert first.status_code == 200, first.content
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            client.get("/api/runs", {"q": q}, **headers)
            times.append(time.perf_counter() - started)
        rows.append(
            {"label": label, "q": q, "median_s": statistics.median(times), "matched": first.json()["count"]}
        )
    return rows


def python_filter(calls: int) -> tuple[float, int]:
    """The reference without a query language: every run's last accuracy in one query, filtered here."""
    from experiments.models import Run
    from experiments.series import summary

    def once() -> int:
        values = Run.objects.annotate(last=summary("last_finite", "eval/accuracy")).values_list("pk", "last")
        return sum(1 for _, v in values if v is not None and v > 0.6)

    once()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        matched = once()
        times.append(time.perf_counter() - started)
    return statistics.median(times), matched


def report(rows, reference, args, vendor: str, build_s: float) -> tuple[str, bool]:
    import django

    plain = rows[0]["median_s"]
    summaries = rows[1:]
    ok = all(r["median_s"] < args.target_s for r in summaries) and vendor == "postgresql"
    lines = [
        SECTION,
        "",
        f"Measured {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC on {len(os.sched_getaffinity(0))} cores "
        f"({platform.machine()}); Python {platform.python_version()}, Django {django.get_version()}, database {vendor}.",
        "",
        f"{args.runs:,} runs ({args.runs // 200} experiments of 4 presets × 5 staleness settings × 10 seeds), each with "
        f"{args.evals} points of `eval/accuracy` and {args.steps + 1} of `kl/init` "
        f"({args.runs * (args.evals + args.steps + 1):,} points), every 7th run tagged `look`, built in {build_s:.0f} s, "
        f"then `VACUUM ANALYZE`. Each query: one warm-up, then the median of {args.calls} calls of "
        "`GET /api/runs?q=…` (auth, parsing, the count and the first page of 100 runs) through Django's test client. "
        "The reference is the same call filtering by a plain column.",
        "",
        "| query | `q` | runs matched | median ms | × the plain column |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | `{r['q']}` | {r['matched']:,} | {r['median_s'] * 1000:.0f} | {r['median_s'] / plain:.1f}× |"
        )
    ref_s, ref_matched = reference
    slowest = max(summaries, key=lambda r: r["median_s"])
    lines += [
        "",
        f"Without the query language, reading every run's last `eval/accuracy` and filtering in Python takes "
        f"{ref_s * 1000:.0f} ms for the same {ref_matched:,} runs (and sends all {args.runs:,}). Slowest summary query "
        f"{slowest['median_s'] * 1000:.0f} ms (`{slowest['q']}`), target < {args.target_s:g} s on PostgreSQL: "
        f"**{'PASS' if ok else 'FAIL'}**.",
        "",
    ]
    return "\n".join(lines), ok


def main() -> int:
    args = parse_args()
    two_cores()
    sys.path.insert(0, str(ROOT / "tests" / "platform"))  # support.TINY_CONFIG
    setup_django()
    with test_database() as connection:
        started = time.perf_counter()
        _, token = build(args.runs, args.evals, args.steps)
        build_s = time.perf_counter() - started
        settle(connection)
        rows = measure(token, args.calls)
        reference = python_filter(args.calls)
    section, ok = report(rows, reference, args, connection.vendor, build_s)
    from bench.report import publish  # the repository is on sys.path since setup_django

    return publish(section, ok, write=not args.no_write)


if __name__ == "__main__":
    sys.exit(main())
