"""The evaluation round and its wiring: read data, run the pure evaluator, store, queue, send."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Connection, text

from service.context import ServiceContext
from service.core.verdict import NO_VERDICT, Verdict
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
from service.db.windows_repo import OwnStats, Scopes, WindowStatsByGpu
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
    NotifyKind,
    Observation,
    Silence,
    alert_labels,
    evaluate,
    observe,
    observe_silence,
    retire,
    route,
)
from service.thresholds.grouping import grouped, idle_now
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
from service.usecases.outbox import Dispatcher, outbox_row
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


def _report_job(policy: PolicySpec, state: AlertState) -> str | None:
    """The job whose report a notification links to: a job alert's, or the one job holding a
    GPU alert's GPU (none where several share it, their ids joined by commas)."""
    if policy.scope == "job":
        return _job_of(policy, state)
    job = state.labels.get("job_id") if policy.scope == "gpu" else None
    return job if job and "," not in job else None


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


def verdict_by_job(ctx: ServiceContext, jobs: set[str], now: datetime) -> dict[str, Verdict | None]:
    """Each job's verdict so far (waste USD as idle + fixable, top cause, its fix and what it
    saves), for its notifications; None where it is unknown or could not be computed.

    Runs the cost model on a connection of its own, before the round's write transaction: a
    slow or failing cost query then neither holds that transaction open nor aborts it.
    """
    out: dict[str, Verdict | None] = dict.fromkeys(jobs)
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
    kind: NotifyKind | Literal["notice"],
    alert_id: int | None,
    now: datetime,
    verdict: Verdict | None = None,
    xid_code: int | None = None,
) -> Notification:
    """The notification of one alert ``state``; its delivery id is empty until ``outbox_row``
    queues it to a channel."""
    base = ctx.settings.public_url.rstrip("/")
    job = _report_job(policy, state)
    resend = ctx.settings.alertmanager_resend_seconds
    return Notification(
        delivery_id="",
        kind=kind,
        status="resolved" if state.state == "resolved" else "firing",
        policy=policy.name,
        severity=policy.severity,
        description=policy.description,
        metric=policy.metric,
        aggregate=policy.aggregate,
        window=policy.window,
        op=policy.op,
        threshold=policy.threshold,
        value=state.value,
        scope=policy.scope,
        scope_key=state.key,
        labels=alert_labels(policy, state.labels),
        active_since=state.active_since,
        fired_at=state.fired_at,
        resolved_at=state.resolved_at,
        # Like Prometheus: an alert not re-sent within 4 resend periods is considered gone.
        ends_at=now + timedelta(seconds=4 * max(resend, ctx.settings.eval_interval_seconds)),
        stale=state.stale,
        silenced=state.silenced,
        suppressed=state.suppressed,
        verdict=verdict or NO_VERDICT,
        xid_code=xid_code,
        # Links for people: the console's pages, not the JSON API.
        report_url=base + job_path(job) if job else None,
        alert_url=base + alert_page_path(alert_id) if alert_id is not None else None,
        alert_id=alert_id,
    )


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


# The policy metrics whose verdict rests on memory use: idle-held is "nothing runs, memory held".
_MEMORY_METRICS = frozenset({"idle_held"})


def memory_unreported_gpus(
    ctx: ServiceContext, changes: list[tuple[PolicySpec, Change]], now: datetime
) -> set[str]:
    """The GPUs of this round's idle-held notifications whose samples carry no memory reading,
    so the text can say "held" was told by a job or process; empty where the read failed."""
    windows: dict[str, float] = {}
    for p, ch in changes:
        uuid = ch.after.labels.get("gpu_uuid")
        if ch.notify is not None and p.metric in _MEMORY_METRICS and uuid:
            windows[uuid] = max(windows.get(uuid, 0.0), p.window_seconds)
    if not windows:
        return set()
    since = now - timedelta(seconds=max(windows.values()))
    try:
        with ctx.engine.connect() as conn:
            return windows_repo.memory_unreported(conn, gpu_uuids=windows, since=since, until=now)
    except Exception:  # a nice-to-have for the text; the alert must still go out
        log.exception("the memory readings of this round's idle-held GPUs could not be read")
        return set()


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
        scopes = windows_repo.scope_members(
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
        own = windows_repo.tenant_cause_stats(
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
) -> list[dict[str, Any]]:
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
