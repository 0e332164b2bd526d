"""`python manage.py up` (what `make up` runs): migrate, make a first user and team on a first start,
serve the site (gunicorn on its ASGI worker) and start one worker per queue of `UP_WORKER_QUEUES`,
each with `LAB_TORCH_THREADS` threads; print the URL and stop them all on Ctrl-C or when any exits."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from accounts.models import Membership, Team
from lab.celery import worker_command

STOP_TIMEOUT_S = 15
START_TIMEOUT_S = 90
WEB_WORKERS = 2


def worker_env() -> dict[str, str]:
    """A worker child's environment: its share of the cores for torch, and for OpenMP and MKL,
    which read their thread counts once, when torch loads them."""
    threads = str(settings.LAB_TORCH_THREADS)
    return {
        **os.environ,
        "LAB_TORCH_THREADS": threads,
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
    }


def web_command(host: str, port: int) -> list[str]:
    """The web server: gunicorn's ASGI worker serving `lab.asgi`.

    Each worker reads requests on an asyncio event loop and hands Django only a complete request
    (headers and body), so a client that sends slowly holds a socket, never a thread; up to
    `--worker-connections` sockets per worker. A request's headers must arrive within
    `LAB_HEADER_TIMEOUT_S` (`lab.web`), a request still unanswered after `--timeout` s ends with
    its connection; header lines, their number and size are capped.
    """
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "lab.asgi",
        "--pythonpath",
        str(Path(settings.REPO_DIR, "platform")),
        "--bind",
        f"{host}:{port}",
        "--worker-class",
        "lab.web.ASGIWorker",  # gunicorn's ASGI worker, with a time limit on a request's headers
        "--workers",
        str(WEB_WORKERS),
        "--worker-connections",
        "1000",
        "--timeout",
        "60",
        "--graceful-timeout",
        "5",
        "--keep-alive",
        "5",
        "--limit-request-line",
        "8190",
        "--limit-request-fields",
        "100",
        "--limit-request-field_size",
        "8190",
        "--no-control-socket",
        "--access-logfile",
        "-",
        "--logger-class",
        "lab.web.AccessLog",
    ]


def create_first_user() -> tuple[str, str] | None:
    """An admin user and a team on the first start; (username, password), or None if users exist."""
    users = get_user_model()
    with transaction.atomic():
        if users.objects.exists():
            return None
        password = secrets.token_urlsafe(12)
        user = users.objects.create_superuser("admin", "", password)
        team = Team.objects.create(name="lab")
        Membership.objects.create(team=team, user=user, is_admin=True)
    return "admin", password


class Command(BaseCommand):
    help = "Migrate, create a first user if there is none, then run the web server and the workers."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8000)))

    def handle(self, *args, host: str, port: int, **options):
        call_command("migrate", interactive=False, verbosity=0)
        first = create_first_user()
        if first:
            self.stdout.write(
                f"First start: created user {first[0]!r} with password {first[1]!r} (team 'lab')."
            )
        engine = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
        broker = "redis" if settings.REDIS_URL else f"filesystem broker under {settings.BROKER_DIR}"
        self.stdout.write(f"Database: {engine}; queue: {broker}.")

        repo = settings.REPO_DIR
        children = [
            subprocess.Popen(web_command(host, port), cwd=repo),
            *(
                subprocess.Popen(
                    worker_command(queue, f"{queue}-{os.getpid()}@%h"), cwd=repo, env=worker_env()
                )
                for queue in settings.UP_WORKER_QUEUES
            ),
        ]
        stop = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: stop.append(signum))
        try:
            # Listening on all interfaces still answers on the loopback, which ALLOWED_HOSTS accepts.
            url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/"
            self._wait_until_serving(url, children, stop)
            self.stdout.write(f"Serving on {url} (Ctrl-C stops the web server and the workers)")
            self.stdout.flush()
            while not stop and all(child.poll() is None for child in children):
                time.sleep(0.5)
        finally:
            self._stop(children)
        if not stop:
            raise CommandError("a child process exited on its own; see its output above")

    def _wait_until_serving(self, url: str, children, stop) -> None:
        """Until every web worker process has answered `/health` with 200 (each says its pid):
        the URL is printed only once any request to it is answered by a worker that is ready."""
        deadline = time.monotonic() + START_TIMEOUT_S
        ready: set[int] = set()
        while not stop and time.monotonic() < deadline:
            if any(child.poll() is not None for child in children):
                raise CommandError("the web server or a worker failed to start; see its output above")
            try:
                with urllib.request.urlopen(url + "health", timeout=10) as response:
                    ready.add(json.loads(response.read())["worker"])
            except (OSError, ValueError, KeyError):
                time.sleep(0.2)
                continue
            if len(ready) >= WEB_WORKERS:
                return
        if not stop:
            raise CommandError(
                f"{len(ready)} of the {WEB_WORKERS} web server processes answered at {url} within "
                f"{START_TIMEOUT_S} s"
            )

    def _stop(self, children) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in children:
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
