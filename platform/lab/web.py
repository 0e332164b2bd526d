"""The web server's worker class: gunicorn's ASGI worker, with a time limit on a connection's first
request's headers too (`LAB_HEADER_TIMEOUT_S`), so a client trickling bytes cannot hold a
connection for minutes; and its access log without the readiness checks. `manage.py up` and
`serve` run gunicorn with both."""

from __future__ import annotations

import os

from gunicorn.asgi.protocol import ASGIProtocol
from gunicorn.glogging import Logger
from gunicorn.workers import gasgi

HEADER_TIMEOUT_S = float(os.environ.get("LAB_HEADER_TIMEOUT_S") or 10)


class HeaderTimeoutProtocol(ASGIProtocol):
    """gunicorn's HTTP/1 protocol, its keep-alive timer armed for the first request's headers too:
    the timer closes the connection unless the headers are complete in time (gunicorn cancels it
    once they are, as it does for every later request)."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if self._request_ready is not None and self._keepalive_handle is None and not self._closed:
            self._keepalive_handle = self.worker.loop.call_later(HEADER_TIMEOUT_S, self._keepalive_timeout)


class ASGIWorker(gasgi.ASGIWorker):
    """gunicorn's ASGI worker serving with `HeaderTimeoutProtocol`."""

    def run(self) -> None:
        # The worker builds its protocol by the module's name for it, at each connection.
        gasgi.ASGIProtocol = HeaderTimeoutProtocol
        super().run()


class AccessLog(Logger):
    """gunicorn's logger, leaving out `GET /health`: `make up` polls it until every web process
    answers (dozens of lines before the URL), as load balancers do all day."""

    def access(self, resp, req, environ, request_time) -> None:
        if environ.get("PATH_INFO") != "/health":
            super().access(resp, req, environ, request_time)
