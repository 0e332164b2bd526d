"""Fixtures of the alert tests: a real HTTP receiver on 127.0.0.1 (`receiver`) that answers with
the statuses a test scripts and records every request, and settings for deliveries to it
(`loopback_allowed`: LAB_ALERTS_ALLOW_PRIVATE on, a short backoff)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


class Receiver:
    """An HTTP server in a thread: each POST is recorded and answered with the next status of
    `statuses` (the last one repeats)."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.statuses = [200]
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._lock:
                    receiver.requests.append(Received(self.path, dict(self.headers.items()), body))
                    status = receiver.statuses.pop(0) if len(receiver.statuses) > 1 else receiver.statuses[0]
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", "http://127.0.0.1:9/elsewhere")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def ids(self) -> list[str]:
        with self._lock:
            return [r.headers["X-Lab-Event-Id"] for r in self.requests]

    def wait_for(self, n: int, timeout_s: float) -> list[Received]:
        deadline = time.monotonic() + timeout_s
        while len(self.requests) < n:
            if time.monotonic() > deadline:
                pytest.fail(f"the receiver got {len(self.requests)} requests in {timeout_s} s, not {n}")
            time.sleep(0.02)
        return list(self.requests)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.stop()


@pytest.fixture
def loopback_allowed(settings):
    """Deliveries to the test's receiver on 127.0.0.1: private addresses allowed, 50 ms backoff."""
    settings.LAB_ALERTS_ALLOW_PRIVATE = True
    settings.LAB_ALERTS_BACKOFF_S = 0.05
    settings.LAB_ALERTS_MAX_ATTEMPTS = 4
    settings.LAB_ALERTS_TIMEOUT_S = 5
    return settings
