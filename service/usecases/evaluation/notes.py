"""An alert's notification and what it says beyond the alert: the job's verdict, its owner,
the fault's XID, whether memory use was reported; each read before the round's write."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Literal

from service.context import ServiceContext
from service.core.verdict import NO_VERDICT, Verdict
from service.db import sample_facts_repo
from service.notify import Notification
from service.thresholds.evaluator import (
    AlertState,
    Change,
    NotifyKind,
    alert_labels,
)
from service.thresholds.owners import Addressee
from service.thresholds.policy import (
    OWNER_CHANNEL,
    PolicySpec,
)
from service.usecases.notices import resolve_many
from service.usecases.verdict import job_verdict
from service.vocabulary import alert_page_path, job_path

log = logging.getLogger(__package__)


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
            return sample_facts_repo.last_hardware_xids(
                conn, gpu_uuids=windows, since=since, until=now
            )
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
            return sample_facts_repo.memory_unreported(
                conn, gpu_uuids=windows, since=since, until=now
            )
    except Exception:  # a nice-to-have for the text; the alert must still go out
        log.exception("the memory readings of this round's idle-held GPUs could not be read")
        return set()
