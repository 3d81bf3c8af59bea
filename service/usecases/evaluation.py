"""The evaluation round and its wiring: read data, run the pure evaluator, store, queue, send."""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import text

from service.context import ServiceContext
from service.db import (
    alert_state_repo,
    outbox_repo,
    owners_repo,
    policies_repo,
    set_aside,
    silences_repo,
    windows_repo,
)
from service.db.leader import LeaderLock
from service.db.metrics_repo import node_last_seen
from service.db.set_aside import SetAside
from service.errors import ConfigError, ValidationFailed
from service.notify import Notification
from service.notify.message import owner_notice_of
from service.notify.urlsafety import (
    HostDoesNotResolve,
    Resolver,
    check_url,
    parse_allow_nets,
    system_resolver,
)
from service.settings import load_config_file
from service.thresholds.evaluator import (
    AlertState,
    Change,
    Observation,
    alert_labels,
    evaluate,
    observe,
    observe_silence,
    route,
)
from service.thresholds.owners import Addressee, parse_owners_section
from service.thresholds.policy import (
    OWNER_CHANNEL,
    SILENT_SECONDS,
    PolicySpec,
    cause_of_metric,
    parse_config,
)
from service.usecases.job_summary import job_verdict
from service.usecases.notices import queue_owner_notice, resolve_many
from service.usecases.outbox import Dispatcher
from service.vocabulary import alert_page_path, job_path

log = logging.getLogger(__name__)

# An XID this recent (or a lost GPU) suppresses low-utilization alerts on that GPU.
FRESH_FAULT_SECONDS = 600.0
CONFIG_LOCK_KEY = 0x67707577_636F6E66  # "gpuwconf": serialises config loading across replicas


def check_file_channels(
    channels: list[Any],
    allow_nets_text: str,
    *,
    resolver: Resolver = system_resolver,
    source: str = "the config file",
) -> None:
    """Refuse (ConfigError) a config-file channel whose URL may not be called, as the API does.

    A host that does not resolve yet (DNS may come up after us) is only warned about: every
    send resolves and checks it again.
    """
    nets = parse_allow_nets(allow_nets_text)
    for i, c in enumerate(channels):
        if not c.is_http:
            continue
        try:
            check_url(c.url, nets, resolver=resolver, field=f"channels.{i}.url")
        except HostDoesNotResolve as exc:
            log.warning("channel %s from %s: %s", c.name, source, exc.message)
        except ValidationFailed as exc:
            raise ConfigError(f"channel {c.name!r} in {source}: {exc}") from None


def load_config(ctx: ServiceContext) -> tuple[int, int]:
    """Load policies and channels from the YAML config file into the store; returns the counts."""
    if ctx.settings.config is None:
        return 0, 0
    config = load_config_file(ctx.settings.config)
    with ctx.engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # Replicas starting together must not race on the same upserts.
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": CONFIG_LOCK_KEY})
        api_channels = {c.name for c in policies_repo.list_channels(conn)}
        policy_specs, channel_specs = parse_config(config, known_channels=api_channels)
        check_file_channels(channel_specs, ctx.settings.webhook_allow_nets)
        policies_repo.sync_from_file(
            conn, policy_specs=policy_specs, channel_specs=channel_specs, now=ctx.clock()
        )
        owners = parse_owners_section(config.get("owners"))
        owners_repo.sync_from_file(conn, entries=owners, now=ctx.clock())
    return len(policy_specs), len(channel_specs)


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


def _job_of(policy: PolicySpec, state: AlertState) -> str | None:
    return state.labels.get("job_id") if policy.scope == "job" else None


OWNER_KINDS = ("firing", "repeat")  # what a job's owner is told: not resolves or resends


def _owner_of(policy: PolicySpec, change: Change) -> tuple[str | None, str | None] | None:
    """The (user, team) a notification of ``change`` goes to as the job's owner, else None
    (a policy with a ladder tells the owner at its notify_owner steps instead)."""
    if change.notify not in OWNER_KINDS or OWNER_CHANNEL not in policy.channels:
        return None
    if policy.ladder is not None:
        return None
    if _job_of(policy, change.after) is None:
        return None
    labels = change.after.labels
    return labels.get("user") or None, labels.get("team") or None


def owner_addressees(
    ctx: ServiceContext, changes: list[tuple[PolicySpec, Change]]
) -> dict[tuple[str | None, str | None], Addressee]:
    """Where this round's owner notices go, by (user, team), found before the write
    transaction (the lookup command may take seconds); empty when that failed."""
    owners = {o for p, ch in changes if (o := _owner_of(p, ch)) is not None}
    if not owners:
        return {}
    try:
        return resolve_many(ctx, owners)
    except Exception:  # the alert still goes to the policy's channels
        log.exception("the owners of this round's job alerts could not be resolved")
        return {}


VERDICT_KEYS = (
    "cost_usd",
    "waste_usd",
    "idle_usd",
    "fixable_usd",
    "top_cause",
    "fix",
    "fix_saving_usd",
)


def verdict_by_job(
    ctx: ServiceContext, jobs: set[str], now: datetime
) -> dict[str, dict[str, Any] | None]:
    """Each job's verdict so far (waste USD as idle + fixable, top cause, its fix and what it
    saves), for its notifications; None where it is unknown or could not be computed.

    Runs the cost model on a connection of its own, before the round's write transaction: a
    slow or failing cost query then neither holds that transaction open nor aborts it.
    """
    out: dict[str, dict[str, Any] | None] = dict.fromkeys(jobs)
    if not jobs:
        return out
    with ctx.engine.connect() as conn:
        for job in sorted(jobs):
            try:
                out[job] = job_verdict(conn, job_id=job, now=now, settings=ctx.settings)
            except Exception:  # dollars are a nice-to-have; the alert must still go out
                log.exception("the verdict on job %s could not be computed", job)
                conn.rollback()  # a failed statement must not spoil the next job's reads
    return out


def notification(
    ctx: ServiceContext,
    policy: PolicySpec,
    state: AlertState,
    kind: str,
    alert_id: int | None,
    now: datetime,
    verdict: dict[str, Any] | None = None,
    xid_code: int | None = None,
) -> dict[str, Any]:
    """The outbox payload of one notification about ``state`` (without the delivery id)."""
    base = ctx.settings.public_url.rstrip("/")
    job = _job_of(policy, state)
    resend = ctx.settings.alertmanager_resend_seconds
    return {
        "kind": kind,
        "status": "resolved" if state.state == "resolved" else "firing",
        "policy": policy.name,
        "severity": policy.severity,
        "description": policy.description,
        "metric": policy.metric,
        "aggregate": policy.aggregate,
        "window": policy.window,
        "op": policy.op,
        "threshold": policy.threshold,
        "value": state.value,
        "scope": policy.scope,
        "scope_key": state.key,
        "labels": alert_labels(policy, state.labels),
        "active_since": state.active_since.isoformat(),
        "fired_at": state.fired_at.isoformat() if state.fired_at else None,
        "resolved_at": state.resolved_at.isoformat() if state.resolved_at else None,
        # Like Prometheus: an alert not re-sent within 4 resend periods is considered gone.
        "ends_at": (
            now + timedelta(seconds=4 * max(resend, ctx.settings.eval_interval_seconds))
        ).isoformat(),
        "stale": state.stale,
        **{key: (verdict or {}).get(key) for key in VERDICT_KEYS},
        "xid_code": xid_code,
        # Links for people: the console's pages, not the JSON API.
        "report_url": base + job_path(job) if job else None,
        "alert_url": base + alert_page_path(alert_id) if alert_id is not None else None,
        "alert_id": alert_id,
    }


def fault_xids(
    ctx: ServiceContext, changes: list[tuple[PolicySpec, Change]], now: datetime
) -> dict[str, int]:
    """The hardware XID behind each GPU fault notified this round, by GPU uuid, for the
    notification's text; empty where none (a fault of the counters, or the query failed)."""
    windows: dict[str, float] = {}
    for p, ch in changes:
        uuid = ch.after.labels.get("gpu_uuid")
        if ch.notify is not None and p.metric == "hardware_fault" and uuid:
            windows[uuid] = max(windows.get(uuid, 0.0), p.window_seconds)
    if not windows:
        return {}
    since = now - timedelta(seconds=max(windows.values()))
    try:
        with ctx.engine.connect() as conn:
            return windows_repo.last_hardware_xids(conn, gpu_uuids=windows, since=since, until=now)
    except Exception:  # the code is a nice-to-have; the alert must still go out
        log.exception("the XID codes of this round's faults could not be read")
        return {}


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


def _evaluate_once(ctx: ServiceContext, cache: StateCache | None) -> RoundResult:
    started = time.perf_counter()
    s = ctx.settings
    now = ctx.clock()
    result = RoundResult()
    left_out: list[SetAside] = []
    with ctx.engine.connect() as conn:
        policy_list = policies_repo.list_policies(conn)
        channel_types = {c.name: c.type for c in policies_repo.list_channels(conn)}
        scopes = windows_repo.scope_members(
            conn, now=now, start_skew_seconds=s.ingest_max_future_seconds
        )
        by_window: dict[float, set[str]] = defaultdict(set)
        for p in policy_list:
            if p.metric != SILENT_SECONDS:
                by_window[p.window_seconds].add(p.metric)
        silent_horizons = [p.window_seconds for p in policy_list if p.metric == SILENT_SECONDS]
        last_seen = (
            node_last_seen(conn, since=now - timedelta(seconds=max(silent_horizons)))
            if silent_horizons
            else {}
        )
        # The fault window rides along in the same scan; it feeds inhibition.
        by_window[FRESH_FAULT_SECONDS].add("hardware_fault")
        stats = windows_repo.window_stats(
            conn,
            windows=by_window if policy_list else {},
            now=now,
            gpu_ids=scopes.gpu_ids,
            lost_gpu_ids=scopes.lost_gpu_ids,
            set_aside=left_out,
        )
        # A job's cause on a GPU it shares is its own, from its tenant rows.
        job_causes: dict[float, set[str]] = defaultdict(set)
        for p in policy_list:
            if p.scope == "job" and cause_of_metric(p.metric) is not None:
                job_causes[p.window_seconds].add(p.metric)
        own = windows_repo.tenant_cause_stats(conn, windows=job_causes, now=now, gpu_stats=stats)
        faults = {
            gid: per["hardware_fault"].max > 0
            for gid, per in stats.get(FRESH_FAULT_SECONDS, {}).items()
            if "hardware_fault" in per
        }
        silences = silences_repo.active_silences(conn, now=now)
        if cache is not None and cache.open is not None:
            previous = {name: dict(states) for name, states in cache.open.items()}
        else:
            previous = alert_state_repo.open_alerts(conn)
    set_aside.report(left_out, counter=ctx.telemetry.set_aside_rows, log=log)
    t_read = time.perf_counter()
    changes: list[tuple[PolicySpec, Change]] = []
    # Policies that differ only in threshold, for or channels see the same observations.
    seen: dict[tuple[Any, ...], dict[str, Observation]] = {}
    for p in policy_list:
        ctx.telemetry.policy(p.name, p.channels)
        obs_key = (
            p.scope,
            p.metric,
            p.window_seconds,
            p.aggregate,
            tuple(sorted(p.match.items())),
            p.low_utilization,
        )
        # Popped first: a policy that fails keeps its open alerts (they are not "deleted").
        before = previous.pop(p.name, {})
        try:
            obs = seen.get(obs_key)
            if obs is None and p.metric == SILENT_SECONDS:
                node_labels = {m.labels["node"]: m.labels for m in scopes.of("node")}
                obs = observe_silence(p, last_seen, node_labels, now)
                seen[obs_key] = obs
            elif obs is None:
                obs = observe(
                    p,
                    scopes.of(p.scope),
                    stats[p.window_seconds],
                    faults,
                    own.get(p.window_seconds) if p.scope == "job" else None,
                )
                seen[obs_key] = obs
            policy_changes = evaluate(
                p, obs, before, silences, now, resend_seconds=s.alertmanager_resend_seconds
            )
        except Exception:
            # One policy that cannot be evaluated must not stop the others' evaluation.
            log.warning("policy %r could not be evaluated this round", p.name, exc_info=True)
            ctx.telemetry.policy_failures.labels(p.name).inc()
            result.failed_policies.append(p.name)
            continue
        changes.extend((p, ch) for ch in policy_changes)
    # Alerts of deleted policies resolve quietly: there is no policy left to notify for.
    for name, states in previous.items():
        gone = PolicySpec(name=name, metric="sm_active", op="<", threshold=0.0)
        for st in states.values():
            after = AlertState(**{**_fields(st), "state": "resolved", "resolved_at": now})
            if st.state == "pending":
                after = AlertState(**{**_fields(st), "state": "inactive", "resolved_at": now})
            changes.append((gone, Change(st, after)))
    t_eval = time.perf_counter()
    notified_jobs = {
        job
        for p, ch in changes
        if ch.notify is not None
        and (route(ch.notify, p, channel_types) or _owner_of(p, ch))
        and (job := _job_of(p, ch.after))
    }
    verdicts = verdict_by_job(ctx, notified_jobs, now)
    addressees = owner_addressees(ctx, changes)
    xids = fault_xids(ctx, changes, now)
    with ctx.engine.begin() as conn:
        ids = alert_state_repo.apply_changes(conn, changes, now=now)
        still_open: dict[str, dict[str, AlertState]] = defaultdict(dict)
        for (_p, ch), alert_id in zip(changes, ids, strict=True):
            if ch.after.state in ("pending", "firing"):
                still_open[ch.after.policy][ch.after.key] = replace(ch.after, id=alert_id)
        rows = []
        for (p, ch), alert_id in zip(changes, ids, strict=True):
            result.transitions += ch.transition
            if ch.notify is None:
                continue
            result.by_kind[ch.notify] = result.by_kind.get(ch.notify, 0) + 1
            targets = route(ch.notify, p, channel_types)
            owner = _owner_of(p, ch)
            if not targets and owner is None:
                continue
            job = _job_of(p, ch.after)
            verdict = verdicts.get(job) if job else None
            xid = (
                xids.get(ch.after.labels.get("gpu_uuid", ""))
                if p.metric == "hardware_fault"
                else None
            )
            payload = notification(ctx, p, ch.after, ch.notify, alert_id, now, verdict, xid)
            for channel in targets:
                delivery_id = f"msg_{uuid.uuid4().hex}"
                rows.append(
                    {
                        "delivery_id": delivery_id,
                        "channel": channel,
                        "alert_id": alert_id,
                        "payload": {**payload, "delivery_id": delivery_id},
                    }
                )
            addressee = addressees.get(owner) if owner is not None else None
            if addressee is not None:
                note = Notification.model_validate({**payload, "delivery_id": "owner"})
                queued = queue_owner_notice(
                    conn, ctx, notice=owner_notice_of(note), addressee=addressee
                )
                result.notifications += sum(1 for n in queued if n["status"] == "pending")
        outbox_repo.enqueue(conn, rows, now=now)
        firing = alert_state_repo.firing_counts(conn)
    if cache is not None:  # only once the transaction has committed
        cache.open = dict(still_open)
    for sev in ("info", "warning", "critical"):
        ctx.telemetry.alerts_firing.labels(sev).set(firing.get(sev, 0))
    result.policies = len(policy_list)
    result.changes = len(changes)
    result.notifications += len(rows)
    result.seconds = time.perf_counter() - started
    result.phase_seconds = {
        "read": t_read - started,
        "evaluate": t_eval - t_read,
        "write": started + result.seconds - t_eval,
    }
    ctx.telemetry.evaluation_seconds.observe(result.seconds)
    return result


def _fields(st: AlertState) -> dict[str, Any]:
    return {f: getattr(st, f) for f in AlertState.__dataclass_fields__}


class Alerting:
    """The evaluator's runtime in one process: the leader lock and the dispatcher."""

    def __init__(self, ctx: ServiceContext, dispatcher: Dispatcher | None = None) -> None:
        self.ctx = ctx
        self.leader = LeaderLock(ctx.engine)
        self.dispatcher = dispatcher or Dispatcher(ctx)
        self.cache = StateCache()
        self._epoch = -1

    def evaluate_tick(self) -> RoundResult | None:
        """If this replica is the leader: evaluate, then send what that queued."""
        leader = self.leader.check()
        self.ctx.telemetry.evaluator_leader.set(1 if leader else 0)
        if leader and self.leader.acquisitions != self._epoch:
            self.cache.clear()  # another replica may have written alerts meanwhile
            self._epoch = self.leader.acquisitions
        if not leader:
            return None
        result = evaluate_once(self.ctx, cache=self.cache)
        if result.notifications:
            self.dispatcher.drain()
        return result

    def deliver_tick(self) -> int:
        """If this replica is the leader: send due deliveries (retries, rate-limited ones)."""
        if not self.leader.check():
            return 0
        return self.dispatcher.drain()

    def close(self) -> None:
        """Release the leader lock and the HTTP client."""
        self.leader.release()
        self.dispatcher.client.close()
