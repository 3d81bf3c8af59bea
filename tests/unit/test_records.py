"""A stored row read into a core dataclass by column name (service.db.records)."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

from service.db.records import record_of
from service.thresholds.evaluator import AlertState

AT = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_row_reads_renamed_columns_and_stored_flags_as_booleans() -> None:
    row = SimpleNamespace(
        policy="idle", scope_key="gpu:GPU-a", state="firing", labels={"node": "n1"}, value=0.0,
        active_since=AT, fired_at=AT, resolved_at=None, last_notified_at=None,
        last_resent_at=None, stale=0, suppressed=1, silenced=0, id=7,
    )  # fmt: skip
    got = record_of(AlertState, row, key="scope_key")
    assert got.key == "gpu:GPU-a"
    assert got.id == 7 and got.fired_at == AT
    # A 0/1 column becomes a bool, so the API's JSON says true, never 1.
    assert (got.stale, got.suppressed, got.silenced) == (False, True, False)
    assert all(type(v) is bool for v in (got.stale, got.suppressed, got.silenced))
