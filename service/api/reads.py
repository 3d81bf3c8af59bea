"""Noting each token's committed writes, so that its next reads wait for them (service.reads)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.sessions import SAFE_METHODS
from service.reads import ReadRouter

# The request-state key naming the token of a write request (set once it is authenticated).
WRITER_KEY = "writer_token_id"


class NoteWrites:
    """ASGI middleware: when a write request's response starts (its transaction committed, its
    client not yet answered), the read router learns that the request's token wrote."""

    def __init__(self, app: ASGIApp, *, reads: ReadRouter) -> None:
        self.app = app
        self.reads = reads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS or self.reads.replica is None:
            await self.app(scope, receive, send)
            return

        async def noting(message: Message) -> None:
            if message["type"] == "http.response.start":
                token_id = scope.get("state", {}).get(WRITER_KEY)
                if token_id is not None:
                    self.reads.noted_write(token_id)
            await send(message)

        await self.app(scope, receive, noting)
