"""The server's own time for each response, in a W3C ``Server-Timing`` header (``app;dur=``
milliseconds from the request reaching the service to its response starting), so a client
tells the service's time from the network's and its own queueing."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class ServerTiming:
    """ASGI middleware adding ``Server-Timing: app;dur=<ms>`` to every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                ms = (time.perf_counter() - started) * 1000.0
                headers = list(message.get("headers", []))
                headers.append((b"server-timing", f"app;dur={ms:.1f}".encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, timed)
