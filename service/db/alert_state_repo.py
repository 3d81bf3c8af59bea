"""Storage of alerts and their state changes, as the evaluator writes and the API lists them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, bindparam, func, insert, select, update

from service.db.records import record_of
from service.db.rows import (
    AlertEvent,
    AlertRow,
    AlertStateColumns,
    NewAlert,
    NewAlertEvent,
)
from service.db.schema import alert_events, alerts
from service.thresholds.evaluator import AlertState, Change
from service.thresholds.policy import PolicySpec


def _state(r: Any) -> AlertState:
    return record_of(AlertState, r, key="scope_key")


def open_alerts(conn: Connection) -> dict[str, dict[str, AlertState]]:
    """Pending and firing alerts by policy name and scope key."""
    out: dict[str, dict[str, AlertState]] = defaultdict(dict)
    for r in conn.execute(select(alerts).where(alerts.c.state.in_(("pending", "firing")))):
        out[r.policy][r.scope_key] = _state(r)
    return out


def _row(policy: PolicySpec, s: AlertState, now: datetime) -> NewAlert:
    labels = dict(s.labels)
    return {
        "policy": s.policy,
        "scope_key": s.key,
        "severity": policy.severity,
        "threshold": policy.threshold,
        "active_since": s.active_since,
        "last_eval_at": now,
        "job_id": labels.get("job_id"),
        "node": labels.get("node"),
        "gpu_uuid": labels.get("gpu_uuid") if policy.scope == "gpu" else None,
        **_mutable(s),
    }


def _mutable(s: AlertState) -> AlertStateColumns:
    """The columns of an alert that change with its state (``_MUTABLE``); no policy needed."""
    return {
        "state": s.state,
        "labels": dict(s.labels),
        "value": s.value,
        "fired_at": s.fired_at,
        "resolved_at": s.resolved_at,
        "last_notified_at": s.last_notified_at,
        "last_resent_at": s.last_resent_at,
        "stale": int(s.stale),
        "suppressed": int(s.suppressed),
        "silenced": int(s.silenced),
    }


_MUTABLE = (
    "state",
    "labels",
    "value",
    "fired_at",
    "resolved_at",
    "last_notified_at",
    "last_resent_at",
    "stale",
    "suppressed",
    "silenced",
)


def apply_changes(
    conn: Connection, changes: Iterable[tuple[PolicySpec | None, Change]], *, now: datetime
) -> list[int]:
    """Store a round's changes (new alerts, updates, events); returns each change's alert id.

    A change without a policy (one retired with its deleted policy) may only update an alert
    already stored: a new alert's row needs its policy's severity, threshold and scope.
    """
    changes = list(changes)
    ids: list[int | None] = [None] * len(changes)
    new_rows: list[NewAlert] = []
    new_idx: list[int] = []
    updates: list[dict[str, Any]] = []
    events: list[NewAlertEvent] = []
    for i, (policy, ch) in enumerate(changes):
        if ch.before is ch.after and ch.before.id is not None:
            ids[i] = ch.before.id  # unchanged: nothing to write
            continue
        if ch.before is None or ch.before.id is None:
            if policy is None:
                raise ValueError(f"alert {ch.after.key!r} of a deleted policy was never stored")
            new_rows.append(_row(policy, ch.after, now))
            new_idx.append(i)
            continue
        alert_id = ch.before.id
        ids[i] = alert_id
        row = _mutable(ch.after)
        if row != _mutable(ch.before):
            updates.append({"b_id": alert_id, **row, "last_eval_at": now})
        if ch.before.state != ch.after.state:
            events.append(_event(alert_id, ch.before.state, ch.after.state, now, ch.after.value))
    if new_rows:
        # One multi-row INSERT ... RETURNING, ids in parameter order.
        returned = conn.execute(
            insert(alerts).returning(alerts.c.id, sort_by_parameter_order=True), new_rows
        ).scalars()
        for i, alert_id in zip(new_idx, returned, strict=True):
            ids[i] = alert_id
            after = changes[i][1].after
            events.append(_event(alert_id, "inactive", "pending", after.active_since, after.value))
            if after.state == "firing":
                events.append(_event(alert_id, "pending", "firing", now, after.value))
    if updates:
        values: dict[str, Any] = {k: bindparam(k) for k in (*_MUTABLE, "last_eval_at")}
        conn.execute(update(alerts).where(alerts.c.id == bindparam("b_id")).values(values), updates)
    if events:
        conn.execute(insert(alert_events), events)
    return [int(i) for i in ids if i is not None]


def _event(alert_id: int, src: str, dst: str, ts: datetime, value: float | None) -> NewAlertEvent:
    return {"alert_id": alert_id, "ts": ts, "from_state": src, "to_state": dst, "value": value}


def list_alerts(
    conn: Connection,
    *,
    state: str | None = None,
    policy: str | None = None,
    job: str | None = None,
    node: str | None = None,
    alert_id: int | None = None,
    limit: int = 500,
) -> list[AlertRow]:
    """Alerts newest first with their events (history); pending, firing and resolved by default."""
    q = select(alerts).order_by(alerts.c.id.desc()).limit(limit)
    if alert_id is not None:
        q = q.where(alerts.c.id == alert_id)
    elif state is not None:
        q = q.where(alerts.c.state == state)
    else:
        q = q.where(alerts.c.state != "inactive")
    if policy is not None:
        q = q.where(alerts.c.policy == policy)
    if job is not None:
        q = q.where(alerts.c.job_id == job)
    if node is not None:
        q = q.where(alerts.c.node == node)
    rows = [dict(r._mapping) for r in conn.execute(q)]
    if not rows:
        return []
    history: dict[int, list[AlertEvent]] = defaultdict(list)
    ev = conn.execute(
        select(alert_events)
        .where(alert_events.c.alert_id.in_([r["id"] for r in rows]))
        .order_by(alert_events.c.id)
    )
    for e in ev:
        history[e.alert_id].append(
            {"ts": e.ts, "from_state": e.from_state, "to_state": e.to_state, "value": e.value}
        )
    for r in rows:
        for flag in ("stale", "suppressed", "silenced"):
            r[flag] = bool(r[flag])
        r["history"] = history[r["id"]]
    return cast(list[AlertRow], rows)


def firing_counts(conn: Connection) -> dict[str, int]:
    """Number of firing alerts per severity."""
    q = (
        select(alerts.c.severity, func.count())
        .where(alerts.c.state == "firing")
        .group_by(alerts.c.severity)
    )
    return {sev: int(n) for sev, n in conn.execute(q)}
