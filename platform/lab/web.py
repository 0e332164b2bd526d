"""The web server's worker class: gunicorn's ASGI worker, with a time limit on a request's headers.

gunicorn's ASGI worker bounds the headers of a kept-alive connection's later requests (its
keep-alive timer runs until they are complete), but not those of a connection's first request: a
client sending one byte every few seconds held its connection for minutes. Here a connection's
first request too must have sent all its headers within `LAB_HEADER_TIMEOUT_S` (10 s, as the
nginx of docker-compose allows), else the connection is closed; the body and the answer are not
limited by it. `manage.py up` and `serve` run gunicorn with `--worker-class lab.web.ASGIWorker`.
"""

from __future__ import annotations

import os

from gunicorn.asgi.protocol import ASGIProtocol
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
