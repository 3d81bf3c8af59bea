"""The evaluation round: read data, run the pure evaluator, store changes, queue notifications."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from service.context import ServiceContext
from service.core.verdict import Verdict
from service.db import (
    alert_state_repo,
    outbox_repo,
    policies_repo,
    scopes_repo,
    set_aside,
    silences_repo,
    tenant_stats_repo,
    windows_repo,
)
from service.db.metrics_repo import node_last_seen
from service.db.rows import NewOutboxRow
from service.db.scopes_repo import Scopes
from service.db.set_aside import SetAside
from service.db.tenant_stats_repo import OwnStats
from service.db.windows_repo import WindowStatsByGpu
from service.notify import Notification
from service.notify.message import owner_notice_of
from service.thresholds.evaluator import (
    AlertState,
    Change,
    NotifyKind,
    Observation,
    Silence,
    evaluate,
    observe,
    observe_silence,
    retire,
    route,
)
from service.thresholds.grouping import grouped, idle_now
from service.thresholds.owners import Addressee
from service.thresholds.policy import (
    SILENT_SECONDS,
    PolicySpec,
    cause_of_metric,
)
from service.usecases.evaluation.notes import (
    _job_of,
    _owner_of,
    fault_xids,
    memory_unreported_gpus,
    notification,
    owner_addressees,
    verdict_by_job,
)
from service.usecases.notices import queue_owner_notice
from service.usecases.outbox import outbox_row

log = logging.getLogger(__package__)

# An XID this recent (or a lost GPU) suppresses low-utilization alerts on that GPU.
FRESH_FAULT_SECONDS = 600.0


@dataclass
class RoundResult:
    """What one evaluation round did."""

    policies: int = 0
    changes: int = 0
    transitions: int = 0
    notifications: int = 0
    seconds: float = 0.0
    by_kind: dict[str, int] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=dict)  # read, evaluate, write
    failed_policies: list[str] = field(default_factory=list)  # skipped this round after an error


@dataclass
class StateCache:
    """The open alerts as the last round left them, so the leader need not re-read them.

    Only the leader writes alerts, so its copy stays true while it keeps the lock; it is
    dropped whenever the lock is (re)taken or a round fails.
    """

    open: dict[str, dict[str, AlertState]] | None = None

    def clear(self) -> None:
        """Forget the cached alerts; the next round reads them from the store."""
        self.open = None


def evaluate_once(ctx: ServiceContext, *, cache: StateCache | None = None) -> RoundResult:
    """Evaluate every policy at ``ctx.clock()`` in one transaction, queueing notifications."""
    try:
        return _evaluate_once(ctx, cache)
    except Exception:
        if cache is not None:
            cache.clear()
        raise


@dataclass
class _Round:
    """One round's clock reading and tallies, passed along its steps."""

    ctx: ServiceContext
    now: datetime
    result: RoundResult = field(default_factory=RoundResult)


@dataclass
class _Reads:
    """What a round reads before it evaluates, on one connection."""

    policies: list[PolicySpec]
    channel_types: Mapping[str, str]
    scopes: Scopes
    last_seen: dict[str, datetime]  # each node's last report, for silent_seconds policies
    stats: dict[float, WindowStatsByGpu]  # by window (seconds)
    own: dict[float, OwnStats]  # jobs' own cause stats on shared GPUs, by window (seconds)
    faults: dict[int, bool]  # a fresh hardware fault, by GPU id
    silences: list[Silence]
    # Open alerts by policy and scope key; evaluation pops each policy's, leaving the deleted.
    previous: dict[str, dict[str, AlertState]]


@dataclass
class _Extras:
    """What this round's notifications say beyond the alert, each found before the write."""

    verdicts: dict[str, Verdict | None]  # by job id
    addressees: dict[tuple[str | None, str | None], Addressee]  # by (user, team)
    xids: dict[str, int]  # by GPU uuid
    memory_unreported: set[str]  # GPU uuids whose exporter sends no memory use


def _evaluate_once(ctx: ServiceContext, cache: StateCache | None) -> RoundResult:
    started = time.perf_counter()
    rnd = _Round(ctx, ctx.clock())
    reads = _read(rnd, cache)
    t_read = time.perf_counter()
    changes, kept = _evaluate_policies(rnd, reads)
    # Alerts of deleted policies resolve quietly: there is no policy left to notify for.
    retired = [ch for states in reads.previous.values() for ch in retire(states, rnd.now)]
    t_eval = time.perf_counter()
    extras = _extras(rnd, changes, reads.channel_types)
    still_open, firing = _write(rnd, changes, retired, reads.channel_types, extras)
    if cache is not None:  # only once the transaction has committed
        cache.open = {**still_open, **kept}
    for sev in ("info", "warning", "critical"):
        ctx.telemetry.alerts_firing.labels(sev).set(firing.get(sev, 0))
    result = rnd.result
    result.policies = len(reads.policies)
    result.changes = len(changes) + len(retired)
    result.seconds = time.perf_counter() - started
    result.phase_seconds = {
        "read": t_read - started,
        "evaluate": t_eval - t_read,
        "write": started + result.seconds - t_eval,
    }
    ctx.telemetry.evaluation_seconds.observe(result.seconds)
    return result


def _metric_windows(policies: list[PolicySpec]) -> dict[float, set[str]]:
    """The metrics each window (seconds) is read for, the fresh-fault window included."""
    by_window: dict[float, set[str]] = defaultdict(set)
    for p in policies:
        if p.metric != SILENT_SECONDS:
            by_window[p.window_seconds].add(p.metric)
    # The fault window rides along in the same scan; it feeds inhibition.
    by_window[FRESH_FAULT_SECONDS].add("hardware_fault")
    return by_window


def _job_cause_windows(policies: list[PolicySpec]) -> dict[float, set[str]]:
    """The cause metrics each window (seconds) is read for as jobs' own shares."""
    # A job's cause on a GPU it shares is its own, from its tenant rows.
    job_causes: dict[float, set[str]] = defaultdict(set)
    for p in policies:
        if p.scope == "job" and cause_of_metric(p.metric) is not None:
            job_causes[p.window_seconds].add(p.metric)
    return job_causes


def _last_seen(conn: Connection, policies: list[PolicySpec], now: datetime) -> dict[str, datetime]:
    """Each node's last report within the widest silent_seconds window; empty without one."""
    silent_horizons = [p.window_seconds for p in policies if p.metric == SILENT_SECONDS]
    if not silent_horizons:
        return {}
    return node_last_seen(conn, since=now - timedelta(seconds=max(silent_horizons)))


def _read(rnd: _Round, cache: StateCache | None) -> _Reads:
    """Read policies, scopes, window stats, silences and open alerts (these from ``cache``
    when it holds them); rows that could not be read are reported and left out."""
    s, now = rnd.ctx.settings, rnd.now
    left_out: list[SetAside] = []
    with rnd.ctx.engine.connect() as conn:
        policies = policies_repo.list_policies(conn)
        channel_types = {c.name: c.type for c in policies_repo.list_channels(conn)}
        scopes = scopes_repo.scope_members(
            conn, now=now, start_skew_seconds=s.ingest_max_future_seconds
        )
        last_seen = _last_seen(conn, policies, now)
        stats = windows_repo.window_stats(
            conn,
            windows=_metric_windows(policies) if policies else {},
            now=now,
            gpu_ids=scopes.gpu_ids,
            lost_gpu_ids=scopes.lost_gpu_ids,
            set_aside=left_out,
        )
        own = tenant_stats_repo.tenant_cause_stats(
            conn, windows=_job_cause_windows(policies), now=now, gpu_stats=stats
        )
        silences = silences_repo.active_silences(conn, now=now)
        if cache is not None and cache.open is not None:
            previous = {name: dict(states) for name, states in cache.open.items()}
        else:
            previous = alert_state_repo.open_alerts(conn)
    set_aside.report(left_out, counter=rnd.ctx.telemetry.set_aside_rows, log=log)
    faults = {
        gid: per["hardware_fault"].max > 0
        for gid, per in stats.get(FRESH_FAULT_SECONDS, {}).items()
        if "hardware_fault" in per
    }
    return _Reads(
        policies, channel_types, scopes, last_seen, stats, own, faults, silences, previous
    )


def _observe(
    p: PolicySpec, reads: _Reads, seen: dict[tuple[Any, ...], dict[str, Observation]], now: datetime
) -> dict[str, Observation]:
    """What ``p`` observes, shared through ``seen`` with the round's other policies that
    differ only in threshold, for or channels."""
    key = (
        p.scope,
        p.metric,
        p.window_seconds,
        p.aggregate,
        tuple(sorted(p.match.items())),
        p.low_utilization,
    )
    obs = seen.get(key)
    if obs is not None:
        return obs
    if p.metric == SILENT_SECONDS:
        node_labels = {m.labels["node"]: m.labels for m in reads.scopes.of("node")}
        obs = observe_silence(p, reads.last_seen, node_labels, now)
    else:
        obs = observe(
            p,
            reads.scopes.of(p.scope),
            reads.stats[p.window_seconds],
            reads.faults,
            reads.own.get(p.window_seconds) if p.scope == "job" else None,
        )
    seen[key] = obs
    return obs


def _evaluate_policies(
    rnd: _Round, reads: _Reads
) -> tuple[list[tuple[PolicySpec, Change]], dict[str, dict[str, AlertState]]]:
    """Each policy's changes, and the open alerts of the policies that failed (logged, counted,
    skipped, their alerts kept as they were). Every policy's open alerts are popped from
    ``reads.previous``, leaving the deleted policies'."""
    ctx, resend = rnd.ctx, rnd.ctx.settings.alertmanager_resend_seconds
    changes: list[tuple[PolicySpec, Change]] = []
    kept: dict[str, dict[str, AlertState]] = {}
    seen: dict[tuple[Any, ...], dict[str, Observation]] = {}
    observed: list[tuple[PolicySpec, dict[str, Observation] | Exception]] = []
    for p in reads.policies:
        try:
            observed.append((p, _observe(p, reads, seen, rnd.now)))
        except Exception as exc:  # counted as the policy's failure below
            observed.append((p, exc))
    gpus_of = _gpus_of(reads.scopes)
    # One idle job, one alert: an idle condition mutes the overlapping alerts it covers.
    idle = idle_now(((p, o) for p, o in observed if not isinstance(o, Exception)), gpus_of)
    for p, obs in observed:
        ctx.telemetry.policy(p.name, p.channels)
        # Popped first: a policy that fails keeps its open alerts (they are not "deleted").
        before = reads.previous.pop(p.name, {})
        try:
            if isinstance(obs, Exception):
                raise obs
            policy_changes = evaluate(
                p, grouped(p, obs, gpus_of, idle), before, reads.silences, rnd.now,
                resend_seconds=resend,
            )  # fmt: skip
        except Exception:
            # One policy that cannot be evaluated must not stop the others' evaluation.
            log.warning("policy %r could not be evaluated this round", p.name, exc_info=True)
            ctx.telemetry.policy_failures.labels(p.name).inc()
            rnd.result.failed_policies.append(p.name)
            if before:
                kept[p.name] = before
            continue
        changes.extend((p, ch) for ch in policy_changes)
    return changes, kept


def _gpus_of(scopes: Scopes) -> Callable[[str, str], tuple[int, ...]]:
    """``gpus_of(scope, key)``: the GPU ids of a scope key of this round."""
    by_scope: dict[str, dict[str, tuple[int, ...]]] = {}

    def gpus_of(scope: str, key: str) -> tuple[int, ...]:
        if scope not in by_scope:
            by_scope[scope] = {m.key: m.gpu_ids for m in scopes.of(scope)}
        return by_scope[scope].get(key, ())

    return gpus_of


def _extras(
    rnd: _Round, changes: list[tuple[PolicySpec, Change]], channel_types: Mapping[str, str]
) -> _Extras:
    """The verdicts, owners' addresses and XIDs this round's notifications need, each read
    on its own connection before the write transaction."""
    notified_jobs = {
        job
        for p, ch in changes
        if ch.notify is not None
        and (route(ch.notify, p, channel_types) or _owner_of(p, ch))
        and (job := _job_of(p, ch.after))
    }
    return _Extras(
        verdicts=verdict_by_job(rnd.ctx, notified_jobs, rnd.now),
        addressees=owner_addressees(rnd.ctx, changes),
        xids=fault_xids(rnd.ctx, changes, rnd.now),
        memory_unreported=memory_unreported_gpus(rnd.ctx, changes, rnd.now),
    )


def _write(
    rnd: _Round,
    changes: list[tuple[PolicySpec, Change]],
    retired: list[Change],
    channel_types: Mapping[str, str],
    extras: _Extras,
) -> tuple[dict[str, dict[str, AlertState]], dict[str, int]]:
    """Store the changes and queue their notifications in one transaction; returns the alerts
    still open (by policy and scope key) and the firing counts by severity."""
    ctx, result = rnd.ctx, rnd.result
    with ctx.engine.begin() as conn:
        # A retired alert is written without a policy: it is stored, only its state changes.
        stored = [*changes, *((None, ch) for ch in retired)]
        ids = alert_state_repo.apply_changes(conn, stored, now=rnd.now)[: len(changes)]
        still_open: dict[str, dict[str, AlertState]] = defaultdict(dict)
        for (_p, ch), alert_id in zip(changes, ids, strict=True):
            if ch.after.state in ("pending", "firing"):
                still_open[ch.after.policy][ch.after.key] = replace(ch.after, id=alert_id)
        result.transitions += sum(ch.transition for _p, ch in stored)
        rows = []
        for (p, ch), alert_id in zip(changes, ids, strict=True):
            rows += _queue(conn, rnd, p, ch, alert_id, channel_types, extras)
        outbox_repo.enqueue(conn, rows, now=rnd.now)
        firing = alert_state_repo.firing_counts(conn)
    result.notifications += len(rows)
    return dict(still_open), firing


def _queue(
    conn: Connection,
    rnd: _Round,
    p: PolicySpec,
    ch: Change,
    alert_id: int,
    channel_types: Mapping[str, str],
    extras: _Extras,
) -> list[NewOutboxRow]:
    """The outbox rows of ``ch``'s notification, one per channel it routes to; a notice to the
    job's owner is queued here too and counted in the round's result."""
    if ch.notify is None:
        return []
    result = rnd.result
    result.by_kind[ch.notify] = result.by_kind.get(ch.notify, 0) + 1
    targets = route(ch.notify, p, channel_types)
    owner = _owner_of(p, ch)
    if not targets and owner is None:
        return []
    note = _note(rnd, p, ch.after, ch.notify, alert_id, extras)
    addressee = extras.addressees.get(owner) if owner is not None else None
    if addressee is not None:
        to_owner = note.model_copy(update={"delivery_id": "owner"})
        queued = queue_owner_notice(
            conn, rnd.ctx, notice=owner_notice_of(to_owner), addressee=addressee
        )
        result.notifications += sum(1 for n in queued if n["status"] == "pending")
    return [outbox_row(note, channel=c, alert_id=alert_id) for c in targets]


def _note(
    rnd: _Round,
    p: PolicySpec,
    state: AlertState,
    kind: NotifyKind,
    alert_id: int,
    extras: _Extras,
) -> Notification:
    """The notification of ``state`` with its job's verdict and, for a fault, its XID."""
    job = _job_of(p, state)
    verdict = extras.verdicts.get(job) if job else None
    gpu_uuid = state.labels.get("gpu_uuid", "")
    xid = extras.xids.get(gpu_uuid) if p.metric == "hardware_fault" else None
    note = notification(rnd.ctx, p, state, kind, alert_id, rnd.now, verdict, xid)
    note.memory_unknown = gpu_uuid in extras.memory_unreported
    return note
