"""Slow clients do not take the site down: the web server started exactly as `make up` starts it
(`up.web_command`, on a free loopback port, SQLite under a temporary var/) keeps answering
`/health` while 32 connections trickle a request one byte at a time, half of them stuck in
their headers, half in a POST body; and a connection whose headers are not complete within
`LAB_HEADER_TIMEOUT_S` is closed (here 2 s: the default is 10)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from support import free_port, start_web, stop_group, wait_for

SLOW_CONNECTIONS = 32
HEALTH_CHECKS = 20
ANSWER_TIMEOUT_S = 30  # generous: an answer is what is asserted, not how fast it came
TRICKLE_INTERVAL_S = 0.2
SERVER_LIMIT_S = 300
HEADER_TIMEOUT_S = 2


def health(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "health", timeout=ANSWER_TIMEOUT_S) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture
def front(tmp_path) -> Iterator[tuple[str, int]]:
    """The web server of `make up`, alone, in its own process group; stopped at teardown."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "LAB_"))}
    env["LAB_VAR_DIR"] = str(tmp_path / "var")
    env["LAB_HEADER_TIMEOUT_S"] = str(HEADER_TIMEOUT_S)
    log_path = tmp_path / "web.log"
    with log_path.open("w") as log:
        proc = start_web(env, port, log, limit_s=SERVER_LIMIT_S)
    try:
        url = f"http://127.0.0.1:{port}/"

        def serving() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"the web server exited with {proc.returncode}:\n{log_path.read_text()}")
            return health(url)

        wait_for(serving, 60, f"the web server to answer (log: {log_path})", interval_s=0.5)
        yield url, port
    finally:
        stop_group(proc, signal.SIGTERM, timeout_s=30)


class SlowClients:
    """Connections that send a request one byte every TRICKLE_INTERVAL_S, never finishing it."""

    def __init__(self, port: int, count: int):
        self.sockets: list[socket.socket] = []
        self.rounds = 0
        self._stop = threading.Event()
        self._round_done = threading.Condition()
        for i in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            self.sockets.append(sock)
            if i % 2:  # stuck in the body of a login POST
                sock.sendall(
                    b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n\r\nu"
                )
            else:  # stuck in the headers
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        self._thread = threading.Thread(target=self._trickle, daemon=True)
        self._thread.start()

    def _trickle(self) -> None:
        while not self._stop.wait(TRICKLE_INTERVAL_S):
            for sock in self.sockets:
                # The server may close a slow connection: that is allowed.
                with contextlib.suppress(OSError):
                    sock.send(b"a")
            with self._round_done:
                self.rounds += 1
                self._round_done.notify_all()

    def wait_rounds(self, rounds: int) -> None:
        with self._round_done:
            assert self._round_done.wait_for(lambda: self.rounds >= rounds, timeout=30)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for sock in self.sockets:
            sock.close()


def test_health_keeps_answering_while_slow_clients_trickle_requests(front):
    url, port = front
    slow = SlowClients(port, SLOW_CONNECTIONS)
    try:
        slow.wait_rounds(3)
        for i in range(HEALTH_CHECKS):
            assert health(url), f"/health went unanswered (check {i + 1} of {HEALTH_CHECKS})"
        still_trickling = slow.rounds
    finally:
        slow.close()
    assert still_trickling >= 3


def test_a_connection_whose_headers_take_too_long_is_closed(front):
    url, port = front
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        sock.settimeout(TRICKLE_INTERVAL_S)
        opened = time.monotonic()
        closed_after = None
        while time.monotonic() - opened < HEADER_TIMEOUT_S * 10:
            try:
                sock.send(b"a")  # one byte of header at a time, never the end
                if sock.recv(1024) == b"":
                    closed_after = time.monotonic() - opened
                    break
            except TimeoutError:
                continue
            except OSError:
                closed_after = time.monotonic() - opened
                break
    assert closed_after is not None, f"still open after {HEADER_TIMEOUT_S * 10} s"
    assert HEADER_TIMEOUT_S * 0.9 <= closed_after < HEADER_TIMEOUT_S * 3
    assert health(url), "complete requests are answered as before"
