"""The request guard's gunzip and body budget, driven as an ASGI app (no network)."""

from __future__ import annotations

import asyncio
import gzip
from typing import Any

import pytest

from service.api.input_guard import BodyBudget, Refused, RequestGuard, gunzip
from service.settings import Settings

MIB = 1024 * 1024


def _counting() -> tuple[list[int], Any]:
    taken: list[int] = []
    return taken, taken.append


def test_gunzip_reads_every_member_within_the_limit() -> None:
    taken, take = _counting()
    body = gzip.compress(b'{"a": ') + gzip.compress(b"1}")
    assert gunzip(body, limit=100, take=take) == b'{"a": 1}'
    assert sum(taken) == 8


def test_gunzip_stops_at_the_limit_in_bounded_steps() -> None:
    taken, take = _counting()
    bomb = gzip.compress(b"0" * (64 * MIB))
    assert len(bomb) < 100_000
    with pytest.raises(Refused) as refused:
        gunzip(bomb, limit=MIB, take=take)
    assert refused.value.status == 413
    # Never more than the limit plus one step was expanded.
    assert sum(taken) <= MIB and max(taken) <= 256 * 1024


@pytest.mark.parametrize(
    "body",
    [b"not gzip", gzip.compress(b"{}")[:-4], gzip.compress(b"{}") + b"junk"],
    ids=["not-gzip", "truncated", "trailing-junk"],
)
def test_gunzip_refuses_what_is_not_whole_gzip(body: bytes) -> None:
    with pytest.raises(Refused) as refused:
        gunzip(body, limit=100, take=lambda _: None)
    detail = refused.value.detail
    assert refused.value.status == 422
    assert isinstance(detail, list) and detail[0]["loc"] == ["body"]


@pytest.mark.parametrize(
    ("budget_bytes", "doc"),
    [
        (3 * MIB, b'{"pad": "' + b" " * (2 * MIB) + b'"}'),
        # 3 KB of gzip: a million empty objects, 150 MiB once parsed.
        (64 * MIB, b'{"samples": [' + b"{}," * 1_000_000 + b"{}]}"),
    ],
    ids=["expanded-bytes", "parsed-values"],
)
def test_the_budget_counts_bodies_held_across_concurrent_requests(
    budget_bytes: int, doc: bytes
) -> None:
    """A second body that does not fit beside one still held gets 503; after it, it fits."""
    budget = BodyBudget(budget_bytes)
    release = asyncio.Event()
    seen: list[int] = []

    async def route(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        seen.append(len(message["body"]))
        if len(seen) == 1:
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    settings = Settings(max_body_bytes=4 * MIB, database_url="sqlite://")
    guard = RequestGuard(route, settings=settings, budget=budget)
    body = gzip.compress(doc, 9)

    async def call() -> int:
        scope = {"type": "http", "method": "POST", "path": "/api/v1/jobs", "query_string": b"",
                 "headers": [(b"content-type", b"application/json"),
                             (b"content-encoding", b"gzip")]}  # fmt: skip
        sent: list[Any] = []

        async def receive() -> Any:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: Any) -> None:
            sent.append(message)

        await guard(scope, receive, send)
        return int(sent[0]["status"])

    async def main() -> list[int]:
        first = asyncio.create_task(call())
        while not seen:
            await asyncio.sleep(0.01)
        held = budget.used_bytes
        second = await call()  # the first still holds its expanded body
        release.set()
        codes = [await first, second, await call()]
        assert held > 2 * MIB and budget.used_bytes == 0, held
        return codes

    assert asyncio.run(main()) == [200, 503, 200]
