"""One guard for every request: NUL characters, body size, encoding and gzip expansion.

Before any route sees a request:
- a NUL in the path, the query string or (for JSON) the body is a 422 naming the parameter or
  field: PostgreSQL text cannot hold it, so it would otherwise fail deep in a query;
- a body is at most its route's limit (ingest's, or ``max_body_bytes`` for every other route),
  as sent and once expanded: 413 past it, as soon as it is known;
- ``Content-Encoding`` is none, ``identity`` or one layer of gzip (415 else); gzip is expanded in
  bounded steps up to the limit, every member of a multi-member body read, bytes after the last
  member refused; the route then gets the plain body, so each route validates one form;
- bodies held at once count against one budget for all requests (``body_memory_budget_bytes``):
  as sent, as expanded, and what parsing a JSON body will take (PARSE_BYTES_PER_VALUE for each
  of its values: 3 KB of gzip can be a million empty objects, 150 MiB once parsed). Past the
  budget a request is answered 503 with Retry-After instead of growing the process; one
  request alone is always admitted, so a body within its limit is never refused for its size.
"""

from __future__ import annotations

import json
import threading
import zlib
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, unquote

import anyio
from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.settings import Settings

NUL = "\x00"
INGEST_PATH = "/api/v1/ingest"
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Output of one decompression step: memory grows by at most this much between checks.
GUNZIP_STEP_BYTES = 256 * 1024
# Bodies larger than this are expanded and checked on a worker thread, off the event loop.
INLINE_BYTES = 256 * 1024
GZIP_MAGIC = b"\x1f\x8b"
# Memory that parsing takes per JSON value (measured 68-90 bytes per `{`, `[`, `,` or `:` for
# valid batches, empty objects and bare numbers alike, with pydantic's models or errors).
PARSE_BYTES_PER_VALUE = 100
STRUCTURAL = (b"{", b"[", b",", b":")


class Refused(Exception):
    """A request the guard answers itself: ``status`` with a JSON ``detail``."""

    def __init__(self, status: int, detail: object, headers: dict[str, str] | None = None):
        super().__init__(str(detail))
        self.status = status
        self.detail = detail
        self.headers = headers or {}


class BodyBudget:
    """Bytes of request bodies held at once, over all requests, up to ``total_bytes``."""

    def __init__(self, total_bytes: int) -> None:
        self.total_bytes = total_bytes
        self.used_bytes = 0
        self._lock = threading.Lock()  # expanded on worker threads too

    def take(self, n: int, *, own: int = 0) -> None:
        """Count ``n`` more bytes held by a request already holding ``own``, or raise Refused
        (503) when they do not fit beside what other requests hold."""
        with self._lock:
            others = self.used_bytes - own
            if others > 0 and self.used_bytes + n > self.total_bytes:
                raise Refused(
                    503,
                    "the service is holding as many request bodies as it may; retry shortly",
                    {"Retry-After": "1"},
                )
            self.used_bytes += n

    def give(self, n: int) -> None:
        """Release ``n`` bytes counted by ``take``."""
        with self._lock:
            self.used_bytes -= n


def nul_location(value: Any, loc: list[str | int]) -> list[str | int] | None:
    """The location of the first string (or key) in ``value`` holding a NUL, or None."""
    if isinstance(value, str):
        return loc if NUL in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            if NUL in key:
                return [*loc, key]
            found = nul_location(item, [*loc, key])
            if found is not None:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = nul_location(item, [*loc, i])
            if found is not None:
                return found
    return None


def _nul_refused(loc: list[str | int]) -> Refused:
    return Refused(
        422, [{"loc": loc, "msg": "must not contain a NUL character", "type": "value_error"}]
    )


def _too_large(limit: int, what: str = "body") -> Refused:
    return Refused(413, f"{what} exceeds the limit of {limit} bytes for this route")


def gunzip(body: bytes, *, limit: int, take: Callable[[int], None]) -> bytes:
    """``body`` expanded from gzip (every member, in order), at most ``limit`` bytes.

    Expands GUNZIP_STEP_BYTES at a time, counting each step with ``take`` before the next, so a
    small body that would expand to gigabytes costs at most ``limit`` bytes.
    """
    out: list[bytes] = []
    size = 0
    rest = body
    members = 0
    while rest:
        if members and not rest.startswith(GZIP_MAGIC):
            raise Refused(422, _gzip_error(f"{len(rest)} bytes after gzip member {members}"))
        inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        pending = rest
        while not inflate.eof:
            try:
                chunk = inflate.decompress(pending, GUNZIP_STEP_BYTES)
            except zlib.error as exc:
                raise Refused(422, _gzip_error(str(exc))) from exc
            if not chunk and not inflate.unconsumed_tail:
                raise Refused(422, _gzip_error("the body ends inside a gzip member"))
            size += len(chunk)
            if size > limit:
                raise _too_large(limit, "the expanded body")
            take(len(chunk))
            out.append(chunk)
            pending = inflate.unconsumed_tail
        members += 1
        rest = inflate.unused_data
    return b"".join(out)


def _gzip_error(why: str) -> list[dict[str, object]]:
    return [{"loc": ["body"], "msg": f"not valid gzip: {why}", "type": "value_error"}]


def body_nul(body: bytes) -> list[str | int] | None:
    """Where a JSON ``body`` holds a NUL, or None (also when it is not JSON: the route says)."""
    if b"\\u0000" not in body and b"\x00" not in body:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return nul_location(doc, ["body"])


class RequestGuard:
    """ASGI middleware applying the module's rules to every HTTP request."""

    def __init__(self, app: ASGIApp, *, settings: Settings, budget: BodyBudget) -> None:
        self.app = app
        self.settings = settings  # read at each request: the limits are its fields
        self.budget = budget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held = [0]
        try:
            _check_path_and_query(scope)
            if scope["method"] in BODY_METHODS:
                scope, receive = await self._guard_body(scope, receive, held)
        except Refused as refused:
            self.budget.give(held[0])
            await _answer(send, refused)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.budget.give(held[0])

    def _take(self, held: list[int]) -> Callable[[int], None]:
        def take(n: int) -> None:
            self.budget.take(n, own=held[0])
            held[0] += n

        return take

    async def _guard_body(
        self, scope: Scope, receive: Receive, held: list[int]
    ) -> tuple[Scope, Receive]:
        headers = dict(scope.get("headers") or [])
        s = self.settings
        ingest = scope["path"] == INGEST_PATH
        limit = s.ingest_max_body_bytes if ingest else s.max_body_bytes
        encoding = headers.get(b"content-encoding", b"").decode("latin-1").strip().lower()
        if encoding not in ("", "identity", "gzip", "x-gzip"):
            # One layer of gzip is what agents send; deflate, br or stacked encodings are
            # refused rather than guessed at.
            raise Refused(
                415, f"Content-Encoding {encoding!r} is not supported; send gzip or no encoding"
            )
        declared = headers.get(b"content-length", b"").decode("latin-1")
        if declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        # Ingest checks each of its strings itself (a NUL there is refused, item by item).
        json_body = b"json" in headers.get(b"content-type", b"").lower() and not ingest
        take = self._take(held)

        async def plain() -> bytes:
            body = await _read(receive, limit, take)
            if encoding in ("gzip", "x-gzip"):
                body = await self._gunzip(body, limit, take, held)
            # Whatever its type says, a body may be parsed as JSON (FastAPI reads them so).
            take(sum(body.count(c) for c in STRUCTURAL) * PARSE_BYTES_PER_VALUE)
            if json_body:
                loc = (
                    await anyio.to_thread.run_sync(body_nul, body)
                    if len(body) > INLINE_BYTES
                    else body_nul(body)
                )
                if loc is not None:
                    raise _nul_refused(loc)
            return body

        if ingest:
            # Read when the route asks, after its token check: a client without a valid agent
            # token never makes the service hold (or expand) a body.
            return _stripped(scope), _lazy(plain, receive)
        return _stripped(scope), _replay(await plain(), receive)

    async def _gunzip(
        self, body: bytes, limit: int, take: Callable[[int], None], held: list[int]
    ) -> bytes:
        sent = len(body)
        if sent > INLINE_BYTES // 16:
            plain = await anyio.to_thread.run_sync(lambda: gunzip(body, limit=limit, take=take))
        else:
            plain = gunzip(body, limit=limit, take=take)
        self.budget.give(sent)  # the sent form is dropped once expanded
        held[0] -= sent
        return plain


def _check_path_and_query(scope: Scope) -> None:
    if NUL in scope["path"]:
        raise _nul_refused(["path"])
    query = scope.get("query_string", b"").decode("latin-1")
    if "%00" in query or NUL in unquote(query):
        for name, value in parse_qsl(query, keep_blank_values=True):
            if NUL in name or NUL in value:
                raise _nul_refused(["query", name.replace(NUL, "")])


async def _read(receive: Receive, limit: int, take: Callable[[int], None]) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise Refused(400, "the client went away before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        take(len(chunk))
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _stripped(scope: Scope) -> Scope:
    """``scope`` for the plain body: no Content-Encoding, no length of the sent form."""
    dropped = (b"content-encoding", b"content-length", b"transfer-encoding")
    kept = [(k, v) for k, v in scope.get("headers") or [] if k.lower() not in dropped]
    return {**scope, "headers": kept}


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives ``body`` whole, then what the client sends next (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _lazy(plain: Callable[[], Awaitable[bytes]], receive: Receive) -> Receive:
    """A receive that reads and checks the body at the route's first call; a refusal then is
    an HTTPException, answered by the app like the route's own."""
    sent = False

    async def lazy() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        try:
            body = await plain()
        except Refused as refused:
            raise HTTPException(refused.status, refused.detail, refused.headers) from None
        return {"type": "http.request", "body": body, "more_body": False}

    return lazy


async def _answer(send: Send, refused: Refused) -> None:
    body = json.dumps({"detail": refused.detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((k.lower().encode(), v.encode()) for k, v in refused.headers.items()),
    ]
    await send({"type": "http.response.start", "status": refused.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
