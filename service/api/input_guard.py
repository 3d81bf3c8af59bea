"""Refuse NUL characters in paths, query strings and JSON bodies before any route sees them.

PostgreSQL text cannot hold NUL, so such input would otherwise fail deep in a query; refusing it
up front gives the same 422 naming the parameter or field on both stores.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl, unquote

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Bodies larger than this are left to the route (which limits them itself); the routes that take
# JSON besides ingest carry small documents.
MAX_CHECKED_BODY_BYTES = 1024 * 1024
NUL = "\x00"


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


def _error(loc: list[str | int]) -> bytes:
    detail = [{"loc": loc, "msg": "must not contain a NUL character", "type": "value_error"}]
    return json.dumps({"detail": detail}).encode()


class RejectNul:
    """ASGI middleware answering 422 to a request with a NUL in its path, query or JSON body."""

    def __init__(self, app: ASGIApp, *, skip_body_paths: tuple[str, ...] = ()) -> None:
        self.app = app
        # Routes that validate their own bodies (ingest checks each item and may be gzipped).
        self.skip_body_paths = skip_body_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if NUL in path:
            await _answer(send, _error(["path"]))
            return
        query = scope.get("query_string", b"").decode("latin-1")
        if "%00" in query or NUL in unquote(query):
            for name, value in parse_qsl(query, keep_blank_values=True):
                if NUL in name or NUL in value:
                    await _answer(send, _error(["query", name.replace(NUL, "")]))
                    return
        headers = dict(scope.get("headers") or [])
        content_type = headers.get(b"content-type", b"").decode("latin-1").lower()
        if (
            scope["method"] in ("POST", "PUT", "PATCH")
            and "json" in content_type
            and not headers.get(b"content-encoding")
            and path not in self.skip_body_paths
        ):
            await self._check_body(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _check_body(self, scope: Scope, receive: Receive, send: Send) -> None:
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > MAX_CHECKED_BODY_BYTES or not message.get("more_body", False):
                break
        body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
        if size <= MAX_CHECKED_BODY_BYTES and (b"\\u0000" in body or b"\x00" in body):
            try:
                doc = json.loads(body)
            except ValueError:
                doc = None  # not JSON at all: the route's own parser answers that
            loc = nul_location(doc, ["body"]) if doc is not None else None
            if loc is not None:
                await _answer(send, _error(loc))
                return
        replay = iter(messages)

        async def replay_receive() -> Message:
            message = next(replay, None)
            return message if message is not None else await receive()

        await self.app(scope, replay_receive, send)


async def _answer(send: Send, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 422,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
