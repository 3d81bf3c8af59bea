"""Requests awaiting one token's lookup at once share a single lookup, and one that goes away
does not cancel it for the others."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

from service.api.deps import _shared_lookup
from service.api.gate import Admission, TokenGate
from service.settings import Settings


def _request() -> Any:
    settings = Settings()
    state = SimpleNamespace(gate=TokenGate(settings), admission=Admission(settings))
    return SimpleNamespace(app=SimpleNamespace(state=state))


def test_twenty_waiters_one_lookup_and_a_later_request_looks_again() -> None:
    calls: list[str] = []
    release = threading.Event()

    def look_up() -> str:
        calls.append("lookup")
        release.wait(5)
        return "token-info"

    async def scenario() -> tuple[list[str], list[str]]:
        request = _request()
        waiters = [asyncio.create_task(_shared_lookup(request, "k", look_up)) for _ in range(20)]
        while not calls:  # the lookup has started in its thread; every waiter is queued on it
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        release.set()
        first = list(await asyncio.gather(*waiters))
        assert request.app.state.gate.lookups == {}  # done: the next request looks again
        again = [await _shared_lookup(request, "k", look_up)]
        return first, again

    first, again = asyncio.run(scenario())
    assert first == ["token-info"] * 20 and again == ["token-info"]
    assert calls == ["lookup", "lookup"]


def test_a_waiter_that_goes_away_leaves_the_lookup_to_the_others() -> None:
    release = threading.Event()
    calls: list[str] = []

    def look_up() -> str:
        calls.append("lookup")
        release.wait(5)
        return "token-info"

    async def scenario() -> str:
        request = _request()
        gone = asyncio.create_task(_shared_lookup(request, "k", look_up))
        stays = asyncio.create_task(_shared_lookup(request, "k", look_up))
        while not calls:
            await asyncio.sleep(0.01)
        gone.cancel()  # its client hung up
        await asyncio.sleep(0.05)
        release.set()
        return await stays

    assert asyncio.run(scenario()) == "token-info"
    assert calls == ["lookup"]
