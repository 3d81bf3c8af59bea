"""Storage of policies, channels, silences and alerts, and the data the evaluator reads."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    Float,
    Integer,
    Table,
    and_,
    any_,
    bindparam,
    case,
    cast,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY

from service.db.schema import (
    alert_events,
    alerts,
    channels,
    gpus,
    job_gpus,
    jobs,
    nodes,
    policies,
    rollup_1m,
    samples,
    silences,
)
from service.errors import Conflict, NotFound
from service.thresholds.evaluator import AlertState, Change, ScopeMember, Silence, WindowStats
from service.thresholds.policy import POLICY_METRICS, ChannelSpec, PolicySpec
from service.vocabulary import METRICS_BY_NAME

# Windows longer than this read 1-minute rollups instead of raw samples.
RAW_WINDOW_MAX_SECONDS = 3600.0


# --- policies and channels -------------------------------------------------------------


def _upsert(
    conn: Connection, table: Table, *, name: str, spec: dict[str, Any], source: str, now: datetime
) -> bool:
    """Insert or replace the row ``name``; True if it was new."""
    exists = conn.execute(select(table.c.name).where(table.c.name == name)).first() is not None
    if exists:
        conn.execute(
            update(table)
            .where(table.c.name == name)
            .values(spec=spec, source=source, updated_at=now)
        )
    else:
        conn.execute(
            insert(table).values(
                name=name, spec=spec, source=source, created_at=now, updated_at=now
            )
        )
    return not exists


def _specs(conn: Connection, table: Table) -> list[Any]:
    """The stored spec documents of ``table`` (policies or channels), by name."""
    return [r.spec for r in conn.execute(select(table.c.spec).order_by(table.c.name))]


def _spec(conn: Connection, table: Table, *, name: str, what: str) -> Any:
    """The stored spec document named ``name``, or NotFound naming the ``what``."""
    spec = conn.execute(select(table.c.spec).where(table.c.name == name)).scalar()
    if spec is None:
        raise NotFound(f"no {what} named {name!r}")
    return spec


def _insert_new(
    conn: Connection, table: Table, *, name: str, spec: dict[str, Any], source: str,
    now: datetime, taken: str,
) -> None:  # fmt: skip
    """Store a new spec; Conflict with the message ``taken`` if the name is in use."""
    if conn.execute(select(table.c.name).where(table.c.name == name)).first():
        raise Conflict(taken)
    _upsert(conn, table, name=name, spec=spec, source=source, now=now)


def _delete(conn: Connection, table: Table, *, name: str, what: str) -> None:
    """Delete the spec named ``name``, or NotFound naming the ``what``."""
    if conn.execute(delete(table).where(table.c.name == name)).rowcount == 0:
        raise NotFound(f"no {what} named {name!r}")


def list_policies(conn: Connection) -> list[PolicySpec]:
    """Every policy, by name."""
    return [PolicySpec.model_validate(spec) for spec in _specs(conn, policies)]


def get_policy(conn: Connection, *, name: str) -> PolicySpec:
    """Policy ``name``, or NotFound."""
    return PolicySpec.model_validate(_spec(conn, policies, name=name, what="policy"))


def create_policy(conn: Connection, *, policy: PolicySpec, source: str, now: datetime) -> None:
    """Store a new policy; Conflict if the name is taken."""
    _insert_new(
        conn, policies, name=policy.name, spec=policy.document(), source=source, now=now,
        taken=f"a policy named {policy.name!r} exists; PUT /policies/{policy.name}",
    )  # fmt: skip


def put_policy(conn: Connection, *, policy: PolicySpec, source: str, now: datetime) -> bool:
    """Create or replace a policy; True if it was new."""
    return _upsert(conn, policies, name=policy.name, spec=policy.document(), source=source, now=now)


def delete_policy(conn: Connection, *, name: str) -> None:
    """Delete policy ``name`` (NotFound if absent); its open alerts resolve at the next round."""
    _delete(conn, policies, name=name, what="policy")


def list_channels(conn: Connection) -> list[ChannelSpec]:
    """Every channel, by name (with secrets: never return these from the API as they are)."""
    return [ChannelSpec.model_validate(spec) for spec in _specs(conn, channels)]


def get_channel(conn: Connection, *, name: str) -> ChannelSpec:
    """Channel ``name``, or NotFound."""
    return ChannelSpec.model_validate(_spec(conn, channels, name=name, what="channel"))


def create_channel(conn: Connection, *, channel: ChannelSpec, source: str, now: datetime) -> None:
    """Store a new channel; Conflict if the name is taken."""
    _insert_new(
        conn, channels, name=channel.name, spec=channel.model_dump(), source=source, now=now,
        taken=f"a channel named {channel.name!r} exists",
    )  # fmt: skip


def delete_channel(conn: Connection, *, name: str) -> None:
    """Delete channel ``name`` (NotFound if absent)."""
    _delete(conn, channels, name=name, what="channel")


def sync_from_file(
    conn: Connection,
    *,
    policy_specs: Sequence[PolicySpec],
    channel_specs: Sequence[ChannelSpec],
    now: datetime,
) -> None:
    """Make the file-sourced policies and channels exactly those of the config file."""
    for table, specs in ((channels, channel_specs), (policies, policy_specs)):
        names = [s.name for s in specs]
        conn.execute(
            delete(table).where(table.c.source == "file", table.c.name.not_in(names or [""]))
        )
        for s in specs:
            doc = s.document() if isinstance(s, PolicySpec) else s.model_dump()
            _upsert(conn, table, name=s.name, spec=doc, source="file", now=now)


# --- silences --------------------------------------------------------------------------


def create_silence(
    conn: Connection,
    *,
    matchers: dict[str, str],
    starts_at: datetime,
    ends_at: datetime,
    comment: str,
    created_by: str | None,
    now: datetime,
) -> int:
    """Store a silence; returns its id."""
    return int(
        conn.execute(
            insert(silences)
            .values(
                matchers=matchers,
                starts_at=starts_at,
                ends_at=ends_at,
                comment=comment,
                created_by=created_by,
                created_at=now,
            )
            .returning(silences.c.id)
        ).scalar_one()
    )


def list_silences(conn: Connection) -> list[dict[str, Any]]:
    """Every silence, newest first."""
    rows = conn.execute(select(silences).order_by(silences.c.id.desc()))
    return [dict(r._mapping) for r in rows]


def expire_silence(conn: Connection, *, silence_id: int, now: datetime) -> None:
    """End silence ``silence_id`` now (kept for history); NotFound if absent."""
    row = conn.execute(select(silences.c.ends_at).where(silences.c.id == silence_id)).first()
    if row is None:
        raise NotFound(f"no silence with id {silence_id}")
    if row.ends_at > now:
        conn.execute(update(silences).where(silences.c.id == silence_id).values(ends_at=now))


def active_silences(conn: Connection, *, now: datetime) -> list[Silence]:
    """Silences in force at ``now``."""
    rows = conn.execute(
        select(silences).where(silences.c.starts_at <= now, silences.c.ends_at > now)
    )
    return [Silence(r.id, r.matchers, r.starts_at, r.ends_at) for r in rows]


# --- alerts ----------------------------------------------------------------------------


def _state(r: Any) -> AlertState:
    return AlertState(
        policy=r.policy,
        key=r.scope_key,
        state=r.state,
        labels=r.labels,
        value=r.value,
        active_since=r.active_since,
        fired_at=r.fired_at,
        resolved_at=r.resolved_at,
        last_notified_at=r.last_notified_at,
        last_resent_at=r.last_resent_at,
        stale=bool(r.stale),
        suppressed=bool(r.suppressed),
        silenced=bool(r.silenced),
        id=r.id,
    )


def open_alerts(conn: Connection) -> dict[str, dict[str, AlertState]]:
    """Pending and firing alerts by policy name and scope key."""
    out: dict[str, dict[str, AlertState]] = defaultdict(dict)
    for r in conn.execute(select(alerts).where(alerts.c.state.in_(("pending", "firing")))):
        out[r.policy][r.scope_key] = _state(r)
    return out


def _row(policy: PolicySpec, s: AlertState, now: datetime) -> dict[str, Any]:
    labels = dict(s.labels)
    return {
        "policy": s.policy,
        "scope_key": s.key,
        "severity": policy.severity,
        "state": s.state,
        "labels": labels,
        "value": s.value,
        "threshold": policy.threshold,
        "active_since": s.active_since,
        "fired_at": s.fired_at,
        "resolved_at": s.resolved_at,
        "last_eval_at": now,
        "last_notified_at": s.last_notified_at,
        "last_resent_at": s.last_resent_at,
        "stale": int(s.stale),
        "suppressed": int(s.suppressed),
        "silenced": int(s.silenced),
        "job_id": labels.get("job"),
        "node": labels.get("node"),
        "gpu_uuid": labels.get("gpu") if policy.scope == "gpu" else None,
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
    conn: Connection, changes: Iterable[tuple[PolicySpec, Change]], *, now: datetime
) -> list[int]:
    """Store a round's changes (new alerts, updates, events); returns each change's alert id."""
    changes = list(changes)
    ids: list[int | None] = [None] * len(changes)
    new_rows: list[dict[str, Any]] = []
    new_idx: list[int] = []
    updates: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    for i, (policy, ch) in enumerate(changes):
        if ch.before is ch.after and ch.before.id is not None:
            ids[i] = ch.before.id  # unchanged: nothing to write
            continue
        row = _row(policy, ch.after, now)
        if ch.before is None or ch.before.id is None:
            new_rows.append(row)
            new_idx.append(i)
            continue
        alert_id = ch.before.id
        ids[i] = alert_id
        old = _row(policy, ch.before, now)
        if any(old[k] != row[k] for k in _MUTABLE):
            updates.append({"b_id": alert_id, **{k: row[k] for k in _MUTABLE}, "last_eval_at": now})
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


def _event(alert_id: int, src: str, dst: str, ts: datetime, value: float | None) -> dict[str, Any]:
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
) -> list[dict[str, Any]]:
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
    history: dict[int, list[dict[str, Any]]] = defaultdict(list)
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
    return rows


def firing_counts(conn: Connection) -> dict[str, int]:
    """Number of firing alerts per severity."""
    q = (
        select(alerts.c.severity, func.count())
        .where(alerts.c.state == "firing")
        .group_by(alerts.c.severity)
    )
    return {sev: int(n) for sev, n in conn.execute(q)}


# --- what the evaluator reads ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scopes:
    """Scope members per scope type, and the GPUs that are lost."""

    gpu: list[ScopeMember]
    node: list[ScopeMember]
    job: list[ScopeMember]
    lost_gpu_ids: frozenset[int]

    @property
    def gpu_ids(self) -> list[int]:
        """Every GPU's id."""
        return [m.gpu_ids[0] for m in self.gpu]

    def of(self, scope: str) -> list[ScopeMember]:
        """The members of scope ``scope`` (gpu, node or job)."""
        members: list[ScopeMember] = getattr(self, scope)
        return members


def _joined(values: Iterable[str | None]) -> str:
    return ",".join(sorted({v for v in values if v}))


def scope_members(conn: Connection, *, now: datetime) -> Scopes:
    """Every GPU, node and running job with its labels and GPUs (jobs: intervals open at now)."""
    gpu_rows = conn.execute(
        select(gpus.c.id, gpus.c.uuid, gpus.c.model, gpus.c.lost_at, nodes.c.hostname).join(
            nodes, nodes.c.id == gpus.c.node_id
        )
    ).all()
    held = conn.execute(
        select(job_gpus.c.gpu_id, jobs.c.id, jobs.c.user, jobs.c.team, jobs.c.project)
        .join(jobs, jobs.c.id == job_gpus.c.job_id)
        .where(
            job_gpus.c.started_at <= now,
            or_(job_gpus.c.ended_at.is_(None), job_gpus.c.ended_at > now),
        )
    ).all()
    by_gpu: dict[int, list[Any]] = defaultdict(list)
    by_job: dict[str, list[int]] = defaultdict(list)
    job_info: dict[str, Any] = {}
    for h in held:
        by_gpu[h.gpu_id].append(h)
        by_job[h.id].append(h.gpu_id)
        job_info[h.id] = h
    info = {g.id: g for g in gpu_rows}
    gpu_members, node_gpus = [], defaultdict(list)
    for g in gpu_rows:
        js = by_gpu.get(g.id, [])
        labels = {"node": g.hostname, "gpu": g.uuid, "model": g.model}
        if js:
            labels |= {
                "job": _joined(j.id for j in js),
                "user": _joined(j.user for j in js),
                "team": _joined(j.team for j in js),
                "project": _joined(j.project for j in js),
            }
        gpu_members.append(ScopeMember(f"gpu:{g.uuid}", labels, (g.id,)))
        node_gpus[g.hostname].append(g)
    node_members = [
        ScopeMember(
            f"node:{host}",
            {"node": host, "model": _joined(g.model for g in gs)},
            tuple(g.id for g in gs),
        )
        for host, gs in sorted(node_gpus.items())
    ]
    job_members = []
    for job_id, gpu_ids in sorted(by_job.items()):
        j = job_info[job_id]
        labels = {
            "job": job_id,
            "user": j.user or "",
            "team": j.team or "",
            "project": j.project or "",
            "node": _joined(info[i].hostname for i in gpu_ids if i in info),
            "gpu": _joined(info[i].uuid for i in gpu_ids if i in info),
            "model": _joined(info[i].model for i in gpu_ids if i in info),
        }
        job_members.append(ScopeMember(f"job:{job_id}", labels, tuple(sorted(gpu_ids))))
    lost = frozenset(g.id for g in gpu_rows if g.lost_at is not None and g.lost_at <= now)
    return Scopes(gpu_members, node_members, job_members, lost)


def _among(conn: Connection, column: Any, ids: list[int]) -> Any:
    """``column IN ids``; on PostgreSQL one array parameter (``= ANY``), cheap to send and plan."""
    if conn.dialect.name == "postgresql":
        return column == any_(bindparam("gpu_id_list", ids, type_=ARRAY(Integer)))
    return column.in_(ids)


def _sample_expr(metric: str, idle_threshold: float, held_bytes: float) -> Any:
    """The per-sample value of ``metric`` (canonical or derived) as a SQL expression."""
    if metric == "idle_held":
        return case(
            (samples.c.sm_active.is_(None), None),
            (
                and_(samples.c.sm_active < idle_threshold, samples.c.fb_used_bytes > held_bytes),
                1.0,
            ),
            else_=0.0,
        )
    if metric == "hardware_fault":
        return cast(samples.c.xid_last, Float)
    return cast(samples.c[metric], Float)


WindowStatsByGpu = dict[int, dict[str, WindowStats]]


def window_stats(
    conn: Connection,
    *,
    windows: Mapping[float, Iterable[str]],
    now: datetime,
    idle_threshold: float,
    held_bytes: float,
    gpu_ids: Iterable[int],
    lost_gpu_ids: frozenset[int] = frozenset(),
) -> dict[float, WindowStatsByGpu]:
    """Per window and GPU, sum/count/min/max of each metric over (now - window, now].

    Every raw-sample window is read in one scan of the widest one (narrower windows are
    aggregate FILTERs); windows longer than an hour read 1-minute rollups.
    """
    ids = sorted(gpu_ids)
    out: dict[float, WindowStatsByGpu] = {}
    raw: dict[float, list[str]] = {}
    for w, ms in windows.items():
        if w > RAW_WINDOW_MAX_SECONDS:
            out[w] = _rollup_stats(conn, sorted(set(ms)), w, now, ids, lost_gpu_ids)
        else:
            raw[w] = sorted(set(ms) & set(POLICY_METRICS))
            out[w] = {}
    if raw:
        widest = max(raw)
        cols: list[Any] = [samples.c.gpu_id]
        plan: list[tuple[float, str, int]] = []  # (window, metric, first column index)
        for w, ms in sorted(raw.items()):
            recent = None if w == widest else samples.c.ts > now - timedelta(seconds=w)
            for m in ms:
                e = _sample_expr(m, idle_threshold, held_bytes)
                aggs = [func.sum(e), func.count(e), func.min(e), func.max(e)]
                plan.append((w, m, len(cols)))
                cols += [a if recent is None else a.filter(recent) for a in aggs]
        # Naming the GPUs lets PostgreSQL walk the (gpu_id, ts) primary key per GPU instead
        # of scanning the whole day's partition for the time range.
        q = (
            select(*cols)
            .where(
                _among(conn, samples.c.gpu_id, ids),
                samples.c.ts > now - timedelta(seconds=widest),
                samples.c.ts <= now,
            )
            .group_by(samples.c.gpu_id)
        )
        for r in conn.execute(q):
            gid = r[0]
            for w, m, i in plan:
                count = int(r[i + 1] or 0)
                if m == "hardware_fault":
                    v = 1.0 if count > 0 else 0.0
                    out[w].setdefault(gid, {})[m] = WindowStats(v, 1, v, v)
                elif count:
                    out[w].setdefault(gid, {})[m] = WindowStats(
                        float(r[i]), count, float(r[i + 2]), float(r[i + 3])
                    )
    for w, ms in raw.items():
        if "hardware_fault" in ms:
            for gid in lost_gpu_ids:
                out[w].setdefault(gid, {})["hardware_fault"] = WindowStats(1.0, 1, 1.0, 1.0)
    return out


def _rollup_stats(
    conn: Connection,
    wanted: list[str],
    window_seconds: float,
    now: datetime,
    gpu_ids: list[int],
    lost_gpu_ids: frozenset[int],
) -> dict[int, dict[str, WindowStats]]:
    """Like window_stats from whole 1-minute buckets (long windows)."""
    since = now - timedelta(seconds=window_seconds)
    c = rollup_1m.c
    cols: list[Any] = [c.gpu_id]
    for m in wanted:
        if m in METRICS_BY_NAME:
            cols += [
                func.sum(c[f"{m}_sum"]).label(f"{m}__sum"),
                func.sum(c[f"{m}_count"]).label(f"{m}__count"),
                func.min(c[f"{m}_min"]).label(f"{m}__min"),
                func.max(c[f"{m}_max"]).label(f"{m}__max"),
            ]
    cols += [
        func.sum(c.idle_held_seconds).label("ih"),
        func.sum(c.covered_seconds).label("cov"),
        func.sum(c.xid_last_count).label("xid"),
    ]
    q = (
        select(*cols)
        .where(_among(conn, c.gpu_id, gpu_ids), c.bucket_start >= since, c.bucket_start < now)
        .group_by(c.gpu_id)
    )
    out: dict[int, dict[str, WindowStats]] = {}
    for r in conn.execute(q):
        m_ = r._mapping
        per: dict[str, WindowStats] = {}
        for m in wanted:
            if m in METRICS_BY_NAME and m_[f"{m}__count"]:
                per[m] = WindowStats(
                    float(m_[f"{m}__sum"]),
                    int(m_[f"{m}__count"]),
                    float(m_[f"{m}__min"]),
                    float(m_[f"{m}__max"]),
                )
        cov = float(r.cov or 0.0)
        if "idle_held" in wanted and cov > 0:
            ratio = float(r.ih or 0.0) / cov
            # Weighted by covered seconds: avg is exact; min and max are the window's mean.
            per["idle_held"] = WindowStats(ratio, 1, ratio, ratio)
        if "hardware_fault" in wanted:
            v = 1.0 if (r.xid or 0) > 0 or r.gpu_id in lost_gpu_ids else 0.0
            per["hardware_fault"] = WindowStats(v, 1, v, v)
        out[r.gpu_id] = per
    if "hardware_fault" in wanted:
        for gid in lost_gpu_ids:
            out.setdefault(gid, {})["hardware_fault"] = WindowStats(1.0, 1, 1.0, 1.0)
    return out
