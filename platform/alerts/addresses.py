"""Where a webhook may point: http or https only, and, unless the operator sets
`LAB_ALERTS_ALLOW_PRIVATE=1`, never to a loopback, private, link-local or other non-public address
(the lab's own database, Redis or a cloud metadata service). Checked when a target is saved and
again at each delivery, which then connects to the very addresses it checked (`post`): a name that
resolves elsewhere the second time is not followed, nor is a redirect."""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

SCHEMES = {"http": 80, "https": 443}


class AddressRefused(ValueError):
    """A webhook URL that may not be delivered to; the message says why and what to do."""


@dataclass(frozen=True)
class Resolved:
    """A checked URL: its parts, and the addresses its host resolved to, which a delivery
    connects to (the first that answers)."""

    scheme: str
    host: str
    port: int
    path: str
    addresses: tuple[str, ...]


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def resolve(url: str) -> Resolved:
    """The URL's parts and the addresses its host resolves to; `AddressRefused` when the
    scheme is not http(s), the host does not resolve, or (without `LAB_ALERTS_ALLOW_PRIVATE`)
    any address it resolves to is not public."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise AddressRefused(f"{url!r} is not a URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise AddressRefused(
            f"a webhook URL must start with http:// or https:// (got {parts.scheme or 'none'}:)"
        )
    if not parts.hostname:
        raise AddressRefused(f"{url!r} names no host")
    port = port or SCHEMES[scheme]
    try:
        found = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise AddressRefused(f"the host {parts.hostname!r} does not resolve ({exc})") from None
    addresses = tuple(dict.fromkeys(info[4][0] for info in found))
    if not settings.LAB_ALERTS_ALLOW_PRIVATE:
        private = [a for a in addresses if not _public(a)]
        if private:
            raise AddressRefused(
                f"{parts.hostname} resolves to {private[0]}, a loopback, private or link-local address: "
                "webhooks go only to public addresses unless the operator sets LAB_ALERTS_ALLOW_PRIVATE=1"
            )
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Resolved(scheme, parts.hostname, port, path, addresses)


def _connect(addresses: tuple[str, ...], port: int, timeout: float) -> socket.socket:
    """A connection to the first of `addresses` that answers."""
    error: OSError | None = None
    for address in addresses:
        try:
            return socket.create_connection((address, port), timeout)
        except OSError as exc:
            error = exc
    raise error or OSError("no address to connect to")


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, resolved: Resolved, timeout: float):
        super().__init__(resolved.host, resolved.port, timeout=timeout)
        self._addresses = resolved.addresses

    def connect(self) -> None:
        self.sock = _connect(self._addresses, self.port, self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, resolved: Resolved, timeout: float):
        super().__init__(resolved.host, resolved.port, timeout=timeout, context=ssl.create_default_context())
        self._addresses = resolved.addresses

    def connect(self) -> None:
        sock = _connect(self._addresses, self.port, self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> int:
    """POST `body` to `url` after checking it (`resolve`), connected to an address checked, the
    certificate checked against the URL's host; the HTTP status (a redirect is not followed)."""
    resolved = resolve(url)
    kind = _PinnedHTTPS if resolved.scheme == "https" else _PinnedHTTP
    connection = kind(resolved, timeout_s)
    try:
        connection.request("POST", resolved.path, body=body, headers=headers)
        response = connection.getresponse()
        response.read(64 * 1024)
        return response.status
    finally:
        connection.close()
