"""`make up` on a machine with no PostgreSQL and no Redis, started the way the README says:
it prints a first user and a URL, serves the site, runs a simulated and an async sweep to
completion (a training worker and a rollout worker), and Ctrl-C stops every process it started."""

from __future__ import annotations

import http.cookiejar
import json
import os
import platform
import re
import signal
import subprocess
import urllib.request
from urllib.parse import urlencode

import pytest
from django.conf import settings
from support import REPO, TEST_VAR, TINY_CONFIG, free_port, stop_group, wait_for

from lab.settings import default_torch_threads, usable_cores

UP_LIMIT_S = 300


def csrf_token(html: str) -> str:
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)


@pytest.fixture
def make_up(tmp_path):
    """`make up` in its own process group, with no DATABASE_URL or REDIS_URL in its environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "LAB_"))}
    env.update(
        LAB_VAR_DIR=str(tmp_path / "var"), LAB_CACHE_DIR=str(TEST_VAR / "cache"), PORT=str(free_port())
    )
    log_path = tmp_path / "make-up.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            ["timeout", "-s", "KILL", str(UP_LIMIT_S), "make", "up"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    yield proc, log_path, tmp_path / "var"
    stop_group(proc, signal.SIGKILL, timeout_s=10)


def test_make_up_serves_the_site_and_runs_a_sweep_on_embedded_defaults(make_up):
    proc, log_path, var = make_up
    url = wait_for(
        lambda: re.search(r"Serving on (\S+)", log_path.read_text()), 120, "make up to serve"
    ).group(1)
    # Announced once every web server process answers: from then on no request waits on a start.
    answered = set()
    for _ in range(40):
        with urllib.request.urlopen(url + "health", timeout=5) as response:
            answered.add(json.loads(response.read())["worker"])
        assert urllib.request.urlopen(url, timeout=5).status == 200
    assert len(answered) >= 1
    output = log_path.read_text()
    before = output[: output.index("Serving on")]
    assert before.count("ASGI server listening") == 2, "both web server processes were up"
    assert "GET /health" not in output, "the readiness checks are not logged"
    assert urllib.request.urlopen(url + "login/", timeout=5).status == 200
    wait_for(lambda: "GET /login/" in log_path.read_text(), 30, "the access log to show a page request")
    username, password = re.search(r"created user '(\S+)' with password '(\S+)'", output).groups()
    assert "Database: sqlite3; queue: filesystem broker" in output
    assert (var / "db.sqlite3").exists()

    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    login = browser.open(url + "login/").read().decode()
    browser.open(
        url + "login/",
        urlencode(
            {"username": username, "password": password, "csrfmiddlewaretoken": csrf_token(login)}
        ).encode(),
    )
    form = browser.open(url + "experiments/new/").read().decode()
    team = re.search(r'<select name="team"[^>]*>\s*<option value="(\d+)"', form).group(1)
    tiny = TINY_CONFIG["model"]["tiny"]
    fields = {
        "csrfmiddlewaretoken": csrf_token(form),
        "name": "first sweep",
        "team": team,
        "presets": "rec-oneside-nois",
        "on_policy": "on",
        "seeds": "0",
        "device": "cpu",
        "steps": "4",
        "eval_every": "2",
        "eval_size": "20",
        **{f"model.tiny.{k}": v for k, v in tiny.items()},
        **{f"rollout.{k}": v for k, v in TINY_CONFIG["rollout"].items()},
    }
    # The training worker runs the simulated sweep alone; the async one needs the rollout worker too.
    experiment_urls = []
    for mode in ("simulated", "async"):
        submitted = browser.open(
            url + "experiments/new/", urlencode({**fields, "execution.mode": mode}).encode()
        )
        experiment_urls.append(submitted.geturl())
        assert re.fullmatch(re.escape(url) + r"experiments/\d+/", experiment_urls[-1]), experiment_urls[-1]

    def finished() -> bool:
        for experiment_url in experiment_urls:
            html = browser.open(experiment_url + "live/").read().decode()
            assert "status-failed" not in html and "status-lost" not in html, html
            if 'class="status-succeeded">succeeded<' not in html:
                return False
        return True

    wait_for(finished, 240, "both sweeps to run to completion", interval_s=1)
    health = json.loads(browser.open(url + "health").read())
    assert health["system"] == platform.system()
    # One worker per queue it is meant to start, each with its share of the cores, never more.
    threads = re.findall(r"worker \S+ ready on \S+ .*, torch threads (\d+)", log_path.read_text())
    workers = len(settings.UP_WORKER_QUEUES)
    assert threads == [str(default_torch_threads(usable_cores(), workers))] * workers

    leftover = stop_group(proc, signal.SIGINT, timeout_s=60)  # SIGINT to the group is what Ctrl-C does
    assert not leftover, f"Ctrl-C left these running:\n{leftover}\n{log_path.read_text()[-3000:]}"
