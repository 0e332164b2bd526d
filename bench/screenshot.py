"""The README's picture: the comparison page of the sample sweep, saved as docs/images/compare.png.

Builds the sweep `bench/pages.py` times (4 presets × 3 staleness settings × 3 seeds, 150 steps: the
test suite's `sample_experiments`, whose curves follow formulas, not training) in a throwaway
database (Django's test database for `DATABASE_URL`, or a SQLite file under var/bench/), serves it
with the web server `make up` starts, opens its comparison page in headless Chromium (Debian's, never
a downloaded one) 1,280 px wide, waits until its tables are filled and its charts drawn, and saves the
top of the page (at most `--height` px) as a PNG. Run it again whenever the page's layout changes:

    .venv/bin/python bench/screenshot.py
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
from pathlib import Path

from django_db import ROOT, setup_django, test_database  # bench/django_db.py, beside this script
from pages import CHROMIUM_ARGS, PRESETS, STALENESS, free_port, serve

NAME = "sample sweep (synthetic curves)"
WIDTH = 1280


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "compare.png")
    parser.add_argument("--height", type=int, default=1600, help="the most of the page kept, px")
    return parser.parse_args()


def build():
    """The user and the finished 36-run sample experiment."""
    sys.path.insert(0, str(ROOT / "tests" / "platform"))
    from sample_experiments import make_finished_experiment
    from support import new_team_member

    from accounts.models import Team

    user = new_team_member("bench", "bench-team")
    return make_finished_experiment(
        Team.objects.get(name="bench-team"),
        user,
        name=NAME,
        presets=PRESETS,
        staleness=STALENESS,
        seeds=(0, 1, 2),
        steps=150,
        eval_every=15,
    )


def shoot(base: str, path: str, out: Path, height: int) -> tuple[int, int]:
    """Log in, open `path` once its tables are filled and charts drawn, save the top `height` px;
    the page's full height and the height kept."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        page.goto(base + "/login/")
        page.fill("input[name=username]", "bench")
        page.fill("input[name=password]", "bench-password-1")
        page.click("button[type=submit]")
        page.wait_for_load_state("load")
        page.goto(base + path)
        page.wait_for_function("() => document.getElementById('compare').dataset.filled", timeout=120_000)
        page.wait_for_function("() => document.getElementById('compare').dataset.rendered", timeout=120_000)
        page.wait_for_load_state("networkidle")
        full = page.evaluate("() => document.documentElement.scrollHeight")
        kept = min(full, height)
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out), full_page=True, clip={"x": 0, "y": 0, "width": WIDTH, "height": kept})
        browser.close()
    return full, kept


def main() -> int:
    args = parse_args()
    setup_django()
    from django.urls import reverse

    with test_database():
        experiment = build()
        server = serve(port := free_port())
        try:
            full, kept = shoot(
                f"http://127.0.0.1:{port}",
                reverse("experiment-compare", args=[experiment.pk]),
                args.out,
                args.height,
            )
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
    out = args.out.resolve()
    shown = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    print(f"{shown}: {WIDTH} × {kept} px of a {full} px page, {out.stat().st_size / 1e3:.0f} kB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
