"""Retiring the open alerts of a deleted policy: closed quietly, each by its own state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from service.thresholds.evaluator import AlertState, retire

T0 = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
NOW = T0 + timedelta(minutes=30)
LABELS = {"node": "node-a", "gpu_uuid": "GPU-a0"}


def state(key: str, st: str, **kw: object) -> AlertState:
    return AlertState(
        policy="deleted-policy",
        key=key,
        state=st,  # type: ignore[arg-type]
        labels=LABELS,
        value=0.1,
        active_since=T0,
        id=hash(key) % 1000,
        **kw,  # type: ignore[arg-type]
    )


def test_a_pending_alert_goes_back_to_inactive_and_a_firing_one_resolves_unnotified() -> None:
    pending = state("gpu:1", "pending")
    firing = state(
        "gpu:2",
        "firing",
        fired_at=T0 + timedelta(minutes=2),
        last_notified_at=T0 + timedelta(minutes=2),
        last_resent_at=T0 + timedelta(minutes=20),
    )
    changes = retire({"gpu:1": pending, "gpu:2": firing}, NOW)

    assert [(ch.before, ch.after.key, ch.after.state) for ch in changes] == [
        (pending, "gpu:1", "inactive"),
        (firing, "gpu:2", "resolved"),
    ]
    # No policy is left to notify for, even for an alert that was notified while it fired.
    assert [ch.notify for ch in changes] == [None, None]
    assert all(ch.after.resolved_at == NOW and ch.transition for ch in changes)
    # The store's id and what the alert was are kept, so the row is updated in place.
    resolved = changes[1].after
    assert resolved.id == firing.id and resolved.fired_at == firing.fired_at
    assert resolved.labels == LABELS and resolved.value == 0.1
    assert resolved.last_notified_at == firing.last_notified_at


def test_a_policy_without_open_alerts_retires_nothing() -> None:
    assert retire({}, NOW) == []
