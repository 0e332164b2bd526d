"""Page weight: how long the comparison page of 36 finished runs takes in headless Chromium until
its tables are filled and until its charts are drawn, and how big a report's HTML export is.

Builds the sweep a new user compares (4 presets × 3 staleness settings × 3 seeds, 150 steps, the
test suite's `sample_experiments`) in a throwaway database (Django's test database for
`DATABASE_URL`, or a SQLite file under var/bench/) and serves it with the web server `make up`
starts (gunicorn's ASGI worker, whitenoise compressing the static files). The reference, measured
in the same run, is the experiment page of the same runs (a table, no chart): the comparison's
times are also given as ratios to it, so a loaded machine shows as slow references, not as a
slow comparison. Every load is a fresh browser context (nothing cached, Plotly fetched each time).
Reported: the median of `--loads` loads, the bytes each transferred, and the export's size beside
the Plotly bundle it inlines. The section goes into `BENCHMARKS.md`; the exit code is 0 when the
median time until filled is within `--target-s` (1.5 s).

    .venv/bin/python bench/pages.py
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

from django_db import ROOT, setup_django, test_database, two_cores  # bench/django_db.py, beside this script

SECTION = "## Page weight: the comparison page of 36 runs and a report's export (`bench/pages.py`)"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
PRESETS = ("reinforce", "grpo", "rec-oneside-nois", "rec-oneside-nois-wide")
STALENESS = ({}, {"sync_offset": 2}, {"offline": True})  # sample runs have 6 configured steps


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", type=int, default=5, help="timed loads of each page")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument(
        "--target-s", type=float, default=1.5, help="median seconds until the tables are filled"
    )
    parser.add_argument(
        "--no-write", action="store_true", help="print the section, leave BENCHMARKS.md alone"
    )
    return parser.parse_args()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build(steps: int):
    """The user and the finished 36-run experiment, and a published report charting it."""
    sys.path.insert(0, str(ROOT / "tests" / "platform"))
    from sample_experiments import make_finished_experiment
    from support import new_team_member

    from accounts.models import Team
    from dashboards.models import Report
    from dashboards.reports import service

    user = new_team_member("bench", "bench-team")
    experiment = make_finished_experiment(
        Team.objects.get(name="bench-team"),
        user,
        presets=PRESETS,
        staleness=STALENESS,
        seeds=(0, 1, 2),
        steps=steps,
        eval_every=15,
    )
    link = f"/experiments/{experiment.pk}/compare/?metric=eval/accuracy"
    report = Report.objects.create(
        team=experiment.team,
        author=user,
        title="bench",
        source=f"{{{{ chart {link} }}}}\n\n{{{{ table {link} }}}}",
    )
    service.publish(report, user)
    return experiment, report


def database_url() -> str:
    from django.db import connection

    settings = connection.settings_dict
    if settings["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{settings['NAME']}"
    from urllib.parse import urlsplit, urlunsplit

    return urlunsplit(urlsplit(os.environ["DATABASE_URL"])._replace(path="/" + settings["NAME"]))


def serve(port: int) -> subprocess.Popen:
    from lab.management.commands.up import web_command

    env = {**os.environ, "DATABASE_URL": database_url()}
    proc = subprocess.Popen(
        web_command("127.0.0.1", port),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc
        except OSError:
            time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError("the web server did not answer /health within 60 s")


def timed_loads(base: str, path: str, ready: list[str], loads: int) -> list[tuple[list[float], int]]:
    """Per load, in a fresh logged-in context: seconds from navigation until each of the `ready`
    JavaScript conditions held, and the bytes transferred (encoded, as sent)."""
    from playwright.sync_api import sync_playwright

    out = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        for _ in range(loads):
            context = browser.new_context(viewport={"width": 1280, "height": 1000})
            page = context.new_page()
            page.goto(base + "/login/")
            page.fill("input[name=username]", "bench")
            page.fill("input[name=password]", "bench-password-1")
            page.click("button[type=submit]")
            page.wait_for_load_state("load")
            transferred = []
            page.on("requestfinished", lambda request, sizes=transferred: sizes.append(request.sizes()))
            started = time.perf_counter()
            page.goto(base + path)
            marks = []
            for condition in ready:
                page.wait_for_function(condition, timeout=120_000)
                marks.append(time.perf_counter() - started)
            page.wait_for_load_state("networkidle")
            out.append((marks, sum(s["responseBodySize"] + s["responseHeadersSize"] for s in transferred)))
            context.close()
        browser.close()
    return out


def main() -> int:
    args = parse_args()
    two_cores()
    setup_django()
    from django.test import Client
    from django.urls import reverse

    with test_database():
        experiment, report = build(args.steps)
        port = free_port()
        server = serve(port)
        try:
            base = f"http://127.0.0.1:{port}"
            compare = timed_loads(
                base,
                reverse("experiment-compare", args=[experiment.pk]),
                [
                    "() => document.getElementById('compare').dataset.filled",
                    "() => document.getElementById('compare').dataset.rendered",
                ],
                args.loads,
            )
            reference = timed_loads(
                base,
                reverse("experiment-detail", args=[experiment.pk]),
                ["() => document.querySelectorAll('#runs tr').length > 36"],
                args.loads,
            )
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
        client = Client()
        client.force_login(report.author)
        export = client.get(reverse("report-export-html", args=[report.pk])).content
    bundle = (ROOT / "platform" / "lab" / "plotly" / "plotly-cartesian.min.js").stat().st_size
    filled = statistics.median(m[0] for m, _ in compare)
    drawn = statistics.median(m[1] for m, _ in compare)
    ref = statistics.median(m[0] for m, _ in reference)
    ok = filled <= args.target_s
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        SECTION,
        "",
        f"Measured {now} on {platform.node()} ({len(os.sched_getaffinity(0))} cores), "
        f"{os.environ.get('DATABASE_URL', 'SQLite').split('@')[-1] if os.environ.get('DATABASE_URL') else 'SQLite'}; "
        f"{args.loads} loads each in a fresh Chromium context (nothing cached), medians.",
        "",
        "| page | until filled | until charts drawn | bytes transferred | vs the experiment page |",
        "|---|---|---|---|---|",
        f"| comparison of 36 runs × {args.steps} steps | {filled:.2f} s | {drawn:.2f} s | "
        f"{statistics.median(b for _, b in compare) / 1e6:.2f} MB | {filled / ref:.2f}× (filled), {drawn / ref:.2f}× (drawn) |",
        f"| experiment page (reference: its runs table) | {ref:.2f} s | — | "
        f"{statistics.median(b for _, b in reference) / 1e6:.2f} MB | 1 |",
        "",
        f"Report export (a chart and a table of the 36 runs): {len(export) / 1e6:.2f} MB, of which Plotly's "
        f"cartesian bundle {bundle / 1e6:.2f} MB (the full bundle was 4.8 MB).",
        "",
        f"Target: the comparison's tables filled within {args.target_s:g} s: **{'PASS' if ok else 'FAIL'}**.",
        "",
    ]
    section = "\n".join(lines)
    print(section)
    if not args.no_write:
        from report import write_section  # bench/report.py

        write_section(section)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
