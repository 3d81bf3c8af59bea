"""A token seen valid lets its client past the failure throttle for KNOWN_GOOD_SECONDS, no longer."""

from __future__ import annotations

from datetime import UTC, datetime

from service.api.gate import KNOWN_GOOD_SECONDS, TokenGate
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
