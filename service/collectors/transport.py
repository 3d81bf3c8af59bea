"""HTTP POST for the shipper: a lean keep-alive http.client transport, or httpx when injected.

httpx costs ~0.7 ms of CPU per request in building and parsing; a node sends one request per
cycle, so for small nodes that was most of the agent's own CPU. The stdlib transport keeps one
connection per central service and reconnects when the server has closed it.
"""

from __future__ import annotations

import http.client
import ssl
from typing import Protocol
from urllib.parse import urlsplit

import httpx


class TransportError(Exception):
    """The request did not get an HTTP response (connection refused, reset, timed out)."""


class Transport(Protocol):
    """POSTs a body and returns (status, response text, Retry-After header or None)."""

    def post(
        self, url: str, body: bytes, headers: dict[str, str], method: str = "POST"
    ) -> tuple[int, str, str | None]:
        """Send one request; raises TransportError when no response came."""
        ...

    def close(self) -> None:
        """Close open connections."""
        ...


class StdlibTransport:
    """http.client with one persistent connection; a dropped keep-alive is retried once."""

    def __init__(self, *, timeout_seconds: float = 30.0) -> None:
        self.timeout = timeout_seconds
        self._conn: http.client.HTTPConnection | None = None
        self._target: tuple[str, str, int | None] | None = None
        self._ssl = ssl.create_default_context()

    def _connection(self, url: str) -> tuple[http.client.HTTPConnection, str]:
        parts = urlsplit(url)
        target = (parts.scheme, parts.hostname or "", parts.port)
        if self._conn is None or target != self._target:
            self.close()
            if parts.scheme == "https":
                self._conn = http.client.HTTPSConnection(
                    target[1], target[2], timeout=self.timeout, context=self._ssl
                )
            else:
                self._conn = http.client.HTTPConnection(target[1], target[2], timeout=self.timeout)
            self._target = target
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return self._conn, path

    def post(
        self, url: str, body: bytes, headers: dict[str, str], method: str = "POST"
    ) -> tuple[int, str, str | None]:
        """POST (or ``method``) ``body``; ingest and job ends are idempotent, so a request on a
        stale connection is resent."""
        for attempt in (1, 2):
            conn, path = self._connection(url)
            reused = conn.sock is not None
            try:
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                text = resp.read().decode("utf-8", errors="replace")
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if reused and attempt == 1 and not isinstance(exc, TimeoutError):
                    continue  # the server closed an idle keep-alive connection: reconnect
                raise TransportError(f"{type(exc).__name__}: {exc}") from exc
            if resp.will_close:
                self.close()
            return resp.status, text, resp.getheader("retry-after")
        raise TransportError("unreachable")  # pragma: no cover

    def close(self) -> None:
        """Close the connection, if any."""
        if self._conn is not None:
            self._conn.close()
        self._conn = None


class HttpxTransport:
    """The same contract over an httpx client (tests inject MockTransport or event hooks)."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def post(
        self, url: str, body: bytes, headers: dict[str, str], method: str = "POST"
    ) -> tuple[int, str, str | None]:
        """POST (or ``method``) through httpx."""
        try:
            r = self.client.request(method, url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        return r.status_code, r.text, r.headers.get("retry-after")

    def close(self) -> None:
        """Close the httpx client."""
        self.client.close()
