"""A token seen valid lets its client past the failure throttle for KNOWN_GOOD_SECONDS, no longer."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from service.api.gate import KNOWN_GOOD_SECONDS, TOKEN_CACHE_SECONDS, TokenGate
from service.db.tokens_repo import TokenInfo
from service.roles import Role
from service.settings import Settings


def _throttled_gate(digest: str, *, seen_valid_at: float) -> TokenGate:
    gate = TokenGate(Settings(auth_failure_burst=1, auth_failure_refill_per_second=1e-9))
    gate.accept(
        digest,
        TokenInfo(
            id=1,
            name="agent",
            role=Role.AGENT,
            node=None,
            prefix="gw_",
            created_at=datetime(2026, 1, 1, tzinfo=UTC),
            last_used_at=None,
            revoked_at=None,
        ),
        seen_valid_at,
    )
    gate.refuse("10.0.0.9", None, seen_valid_at, looked_up=False)  # the client's budget is spent
    return gate


def test_a_token_seen_valid_lately_keeps_the_shared_lane() -> None:
    gate = _throttled_gate("d1", seen_valid_at=1_000.0)
    assert gate.lane("10.0.0.9", "d1", 1_000.0 + KNOWN_GOOD_SECONDS - 1) == "auth"
    assert gate.lane("10.0.0.9", "other", 1_001.0) == "suspect"


def test_a_token_last_seen_valid_too_long_ago_waits_as_a_suspect() -> None:
    gate = _throttled_gate("d1", seen_valid_at=1_000.0)
    assert gate.lane("10.0.0.9", "d1", 1_000.0 + KNOWN_GOOD_SECONDS + 1) == "suspect"


def _info() -> TokenInfo:
    return TokenInfo(
        id=2, name="node-a", role=Role.AGENT, node="node-a", prefix="gw_",
        created_at=datetime(2026, 1, 1, tzinfo=UTC), last_used_at=None, revoked_at=None,
    )  # fmt: skip


def test_a_token_passes_past_its_cache_time_while_no_token_is_revoked() -> None:
    gate = TokenGate(Settings())
    gate.saw_revocations(3, read_at=100.0)
    gate.accept("d1", _info(), 100.5, gate.generation)
    assert gate.cached("d1", 100.5 + TOKEN_CACHE_SECONDS - 0.1) is not None
    # Past the cache time the count must be read again before the token passes without a lookup.
    later = 100.0 + TOKEN_CACHE_SECONDS + 1
    assert gate.cached("d1", later) is None and gate.needs_revocations("d1", later)
    gate.saw_revocations(3, read_at=later)
    assert gate.cached("d1", later + 0.1) is not None
    assert not gate.needs_revocations("d1", later + 0.1)
    # An hour on, with the count read every few seconds, still no lookup.
    for k in range(1, 721):
        gate.saw_revocations(3, read_at=later + 5 * k)
    assert gate.cached("d1", later + 3601) is not None


def test_a_new_revocation_sends_every_cached_token_back_to_a_lookup() -> None:
    gate = TokenGate(Settings())
    gate.saw_revocations(3, read_at=100.0)
    gate.accept("d1", _info(), 100.0, gate.generation)
    gate.saw_revocations(4, read_at=106.0)  # someone's token was revoked
    assert gate.cached("d1", 106.1) is None
    assert not gate.needs_revocations("d1", 106.1)  # the count cannot help: look it up
    gate.accept("d1", _info(), 106.2, gate.generation)
    assert gate.cached("d1", 106.3) is not None


def test_a_lookup_begun_before_a_revocation_was_seen_passes_its_cache_time_only() -> None:
    gate = TokenGate(Settings())
    gate.saw_revocations(3, read_at=100.0)
    begun_in = gate.generation
    gate.saw_revocations(4, read_at=100.5)  # seen while the lookup ran
    gate.accept("d1", _info(), 101.0, begun_in)
    assert gate.cached("d1", 101.0 + TOKEN_CACHE_SECONDS - 0.1) is not None
    gate.saw_revocations(4, read_at=101.0 + TOKEN_CACHE_SECONDS)
    assert gate.cached("d1", 101.0 + TOKEN_CACHE_SECONDS + 0.1) is None


def test_the_first_count_read_sends_earlier_lookups_back_and_a_late_read_changes_nothing() -> None:
    gate = TokenGate(Settings())
    gate.accept("d1", _info(), 100.0)  # before any count was read: revocations unknown
    gate.saw_revocations(3, read_at=106.0)
    assert gate.cached("d1", 106.1) is None
    gate.accept("d1", _info(), 106.2, gate.generation)
    generation = gate.generation
    gate.saw_revocations(9, read_at=105.0)  # a read begun earlier, answered later: ignored
    assert gate.generation == generation and gate.cached("d1", 106.3) is not None


def test_full_caches_forget_the_least_recently_used_token_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from service.api import gate as gate_mod

    monkeypatch.setattr(gate_mod, "MAX_ENTRIES", 3)
    gate = TokenGate(Settings())
    for k in range(3):
        gate.accept(f"d{k}", _info(), 100.0)
    assert gate.cached("d0", 100.1) is not None  # d0 used again: d1 is now the oldest
    gate.accept("d3", _info(), 100.2)
    # A fleet's worth of new tokens never empties the cache for the tokens in use.
    assert [gate.cached(f"d{k}", 100.3) is not None for k in range(4)] == [True, False, True, True]
    for client in ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"):
        gate.refuse(client, None, 100.0, looked_up=False)
    assert len(gate._buckets) == 3
