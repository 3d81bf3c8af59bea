"""An agent's token costs one query per process every few seconds, not one per batch: a token
looked up valid keeps passing while the count of revoked tokens stays the same, and stops
passing within the cache time of any revocation (on SQLite and PostgreSQL, over real HTTP)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from service.api import gate
from service.db import tokens_repo
from tests.conftest import make_token
from tests.support import FakeClock

CACHE_SECONDS = 0.5


def _counted(calls: Counter[str], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def spy(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return fn(*args, **kwargs)

    return spy


def _token_id(engine: Engine, token: str) -> int:
    with engine.connect() as conn:
        info = tokens_repo.authenticate(conn, token=token)
    assert info is not None
    return info.id


def _revoke(engine: Engine, token_id: int) -> None:
    with engine.begin() as conn:
        tokens_repo.revoke_token(conn, token_id=token_id, now=FakeClock()())


def test_a_token_is_looked_up_again_only_after_a_revocation(
    server: str, tokens: dict[str, str], engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    other, mine = (_token_id(engine, t) for t in (make_token(engine, "reader"), tokens["reader"]))
    monkeypatch.setattr(gate, "TOKEN_CACHE_SECONDS", CACHE_SECONDS)
    calls: Counter[str] = Counter()
    for name in ("authenticate", "revoked_count"):
        monkeypatch.setattr(tokens_repo, name, _counted(calls, name, getattr(tokens_repo, name)))
    reader = {"Authorization": f"Bearer {tokens['reader']}"}
    with httpx.Client(base_url=server, timeout=30) as client:

        def passes() -> bool:
            time.sleep(CACHE_SECONDS + 0.1)  # every request finds the last check too old
            return client.get("/api/v1/gpus", headers=reader).status_code == 200

        # The first lookup, and one more once the first count of revocations is known.
        assert all(passes() for _ in range(6))
        assert calls["authenticate"] == 2 and calls["revoked_count"] == 5
        # Another token revoked: the count moved, so the token is looked up once more.
        _revoke(engine, other)
        assert all(passes() for _ in range(3))
        assert calls["authenticate"] == 3
        # This token revoked: refused within the cache time.
        _revoke(engine, mine)
        assert not passes()
