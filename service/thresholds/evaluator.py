"""The pure evaluator and alert state machine: (policy, observations, states, now) -> changes.

It follows Prometheus alerting rules: inactive -> pending while the condition holds, pending ->
firing once it has held for ``for``, firing -> resolved when it no longer holds. No data keeps the
state (marked stale); a scope that disappears (a job that ended) resolves. Notifications follow
Alertmanager: on firing, every ``repeat_interval`` while firing, and on resolve; a silence or a
hardware fault mutes them, but never lets an alert Alertmanager holds expire there.
"""

from __future__ import annotations

import fnmatch
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

from service.thresholds.policy import PolicySpec

State = Literal["pending", "firing", "resolved", "inactive"]
NotifyKind = Literal["firing", "repeat", "resolved", "resend"]

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


@dataclass(frozen=True, slots=True)
class WindowStats:
    """Sum, count, min and max of one metric over a window (for one GPU or a whole scope)."""

    sum: float
    count: int
    min: float
    max: float

    def merge(self, other: WindowStats) -> WindowStats:
        """Both windows' samples together."""
        return WindowStats(
            self.sum + other.sum,
            self.count + other.count,
            min(self.min, other.min),
            max(self.max, other.max),
        )

    def value(self, aggregate: str) -> float | None:
        """avg, min or max of the samples; None without samples."""
        if self.count == 0:
            return None
        if aggregate == "min":
            return self.min
        if aggregate == "max":
            return self.max
        return self.sum / self.count


@dataclass(frozen=True, slots=True)
class ScopeMember:
    """One scope key (a GPU, a node or a job) with its labels and the GPUs it covers."""

    key: str
    labels: Mapping[str, str]
    gpu_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Observation:
    """What a policy sees of one scope key: the window aggregate (None = no data) and labels."""

    value: float | None
    labels: Mapping[str, str]
    hardware_fault: bool = False
    # Left to a more specific idle alert on the same GPUs (service.thresholds.grouping).
    covered: bool = False


@dataclass(frozen=True, slots=True)
class Silence:
    """Mutes notifications of alerts whose labels match every matcher (shell patterns)."""

    id: int
    matchers: Mapping[str, str]
    starts_at: datetime
    ends_at: datetime

    def mutes(self, labels: Mapping[str, str], now: datetime) -> bool:
        """Whether this silence is active at ``now`` and matches ``labels``."""
        if not (self.starts_at <= now < self.ends_at):
            return False
        return all(fnmatch.fnmatchcase(labels.get(k) or "", v) for k, v in self.matchers.items())


@dataclass(frozen=True, slots=True)
class AlertState:
    """One alert of a (policy, scope key): its state, timestamps and notification bookkeeping."""

    policy: str
    key: str
    state: State
    labels: Mapping[str, str]
    value: float | None
    active_since: datetime
    fired_at: datetime | None = None
    resolved_at: datetime | None = None
    last_notified_at: datetime | None = None
    last_resent_at: datetime | None = None
    stale: bool = False
    suppressed: bool = False
    silenced: bool = False
    id: int | None = None  # the store's id, carried through untouched


@dataclass(frozen=True, slots=True)
class Change:
    """The new state of one alert after a round, and the notification it calls for (if any)."""

    before: AlertState | None
    after: AlertState
    notify: NotifyKind | None = None

    @property
    def transition(self) -> bool:
        """Whether the state itself changed (not just value or bookkeeping)."""
        return self.before is None or self.before.state != self.after.state


def observe(
    policy: PolicySpec,
    members: Iterable[ScopeMember],
    stats: Mapping[int, Mapping[str, WindowStats]],
    faults: Mapping[int, bool],
    own: Mapping[tuple[str, int], Mapping[str, WindowStats]] | None = None,
) -> dict[str, Observation]:
    """Aggregate per-GPU window stats into one observation per scope key the policy matches;
    ``own`` holds a member's own stats on a GPU it shared (a job's tenant share), used there
    instead of the GPU's."""
    out: dict[str, Observation] = {}
    metric, aggregate = policy.metric, policy.aggregate
    check_match, want_faults = bool(policy.match), policy.low_utilization and bool(faults)
    for member in members:
        if check_match and not policy.matches(member.labels):
            continue
        ids = member.gpu_ids
        acc: WindowStats | None = None
        for gpu_id in ids:
            per = stats.get(gpu_id)
            mine = own.get((member.key, gpu_id)) if own else None
            if mine is not None and metric in mine:
                per = mine
            s = per.get(metric) if per is not None else None
            if s is not None and s.count:
                acc = s if acc is None else acc.merge(s)
        out[member.key] = Observation(
            value=None if acc is None else acc.value(aggregate),
            labels=member.labels,
            hardware_fault=want_faults and any(faults.get(g, False) for g in ids),
        )
    return out


def observe_silence(
    policy: PolicySpec,
    last_seen: Mapping[str, datetime],
    node_labels: Mapping[str, Mapping[str, str]],
    now: datetime,
) -> dict[str, Observation]:
    """One observation per node of how many seconds ago it last reported (``silent_seconds``).

    A node silent longer than the policy's window has left its scope (taken as gone for good),
    so an alert on it resolves; ``node_labels`` holds the node scope's labels by host.
    """
    out: dict[str, Observation] = {}
    for host, seen in last_seen.items():
        silent = (now - seen).total_seconds()
        labels = node_labels.get(host) or {"node": host}
        if silent > policy.window_seconds or not policy.matches(labels):
            continue
        out[f"node:{host}"] = Observation(value=max(silent, 0.0), labels=labels)
    return out


def alert_labels(policy: PolicySpec, labels: Mapping[str, str]) -> dict[str, str]:
    """An alert's labels: the scope's plus ``policy``, ``severity`` and, for a cause, ``cause``."""
    out = {**labels, "policy": policy.name, "severity": policy.severity}
    if policy.metric.startswith("cause:"):
        out["cause"] = policy.metric.removeprefix("cause:")
    return out


def silenced_now(
    policy: PolicySpec | None,
    *,
    labels: Mapping[str, str],
    silences: Iterable[Silence],
    now: datetime,
) -> bool:
    """Whether an open alert of ``policy`` with scope ``labels`` is muted by a silence at
    ``now`` (as the next evaluation will find it), so a page shows a new silence at once."""
    if policy is None:
        return False
    full = alert_labels(policy, labels)
    return any(s.mutes(full, now) for s in silences)


@dataclass(frozen=True, slots=True)
class _Round:
    """What every scope key of one evaluation round is judged with."""

    policy: PolicySpec
    silences: list[Silence]
    now: datetime
    resend_seconds: float
    threshold_holds: Callable[[float, float], bool]
    for_delta: timedelta


def evaluate(
    policy: PolicySpec,
    observations: Mapping[str, Observation],
    previous: Mapping[str, AlertState],
    silences: Iterable[Silence],
    now: datetime,
    *,
    resend_seconds: float = 60.0,
) -> list[Change]:
    """One evaluation round of ``policy``: a Change for every alert that exists after it.

    ``previous`` holds the policy's pending and firing alerts by scope key. A key missing from
    ``observations`` has left the scope and resolves; a key whose value is None has no data and
    keeps its state, marked stale.
    """
    rnd = _Round(
        policy=policy,
        silences=list(silences),
        now=now,
        resend_seconds=resend_seconds,
        threshold_holds=_OPS[policy.op],
        for_delta=timedelta(seconds=policy.for_seconds),
    )
    changes: list[Change] = []
    keys = list(observations)
    keys += [k for k in previous if k not in observations]
    for key in keys:
        change = _key_change(rnd, key, previous.get(key), observations.get(key))
        if change is not None:
            changes.append(change)
    return changes


def _key_change(
    rnd: _Round, key: str, prev: AlertState | None, obs: Observation | None
) -> Change | None:
    """The change to the alert of one scope key in round ``rnd`` (None: no alert after it)."""
    policy, now = rnd.policy, rnd.now
    if obs is None:
        return _end(prev, now) if prev is not None else None
    value = obs.value
    if value is None:
        if prev is None:
            return None
        suppressed, silenced = _muted(policy, obs, rnd.silences, now)
        after = replace(prev, stale=True, suppressed=suppressed, silenced=silenced)
        return _notify_firing(policy, prev, after, now, rnd.resend_seconds)
    if not rnd.threshold_holds(value, policy.threshold):
        return _end(replace(prev, value=value, stale=False), now) if prev is not None else None
    state = _holding(rnd, key, prev, obs, value)
    if state.state == "pending" and now - state.active_since >= rnd.for_delta:
        state = replace(state, state="firing", fired_at=now)
    return _notify_firing(policy, prev, state, now, rnd.resend_seconds)


def _holding(
    rnd: _Round, key: str, prev: AlertState | None, obs: Observation, value: float
) -> AlertState:
    """The alert of a scope key whose condition holds at ``value``: a new pending one, the
    previous one untouched, or the previous one with its new value, labels and muting."""
    suppressed, silenced = _muted(rnd.policy, obs, rnd.silences, rnd.now)
    # A firing alert keeps the labels it fired with until it resolves: Alertmanager knows an
    # alert by its label set, and a changed set (the job ended, a label dropped out) would
    # let the fired one expire there as resolved while it still fires here.
    labels = prev.labels if prev is not None and prev.state == "firing" else obs.labels
    if prev is None:
        return AlertState(
            policy=rnd.policy.name,
            key=key,
            state="pending",
            labels=obs.labels,
            value=value,
            active_since=rnd.now,
            suppressed=suppressed,
            silenced=silenced,
        )
    if (
        prev.value == value
        and not prev.stale
        and prev.suppressed == suppressed
        and prev.silenced == silenced
        and prev.labels == labels
    ):
        return prev  # nothing changed: the common case for a long-firing alert
    return replace(
        prev,
        labels=labels,
        value=value,
        stale=False,
        suppressed=suppressed,
        silenced=silenced,
    )


def _muted(
    policy: PolicySpec, obs: Observation, silences: list[Silence], now: datetime
) -> tuple[bool, bool]:
    """(suppressed by a hardware fault or a more specific idle alert, silenced) for an alert
    observed as ``obs``."""
    suppressed = policy.low_utilization and (obs.hardware_fault or obs.covered)
    silenced = bool(silences) and any(
        s.mutes(alert_labels(policy, obs.labels), now) for s in silences
    )
    return suppressed, silenced


def _notify_firing(
    policy: PolicySpec,
    before: AlertState | None,
    after: AlertState,
    now: datetime,
    resend_seconds: float,
) -> Change:
    """Decide whether a (still) firing alert is notified now: first time, repeat or resend.

    A muted one (silenced, or suppressed by a hardware fault) notifies nobody, but once it has
    reached Alertmanager it is still re-sent there: left to expire, Alertmanager would tell its
    receivers "resolved" while the alert fires.
    """
    if after.state != "firing":
        return Change(before, after)
    muted = after.suppressed or after.silenced
    if after.last_notified_at is None:
        if muted:
            return Change(before, after)
        return Change(before, replace(after, last_notified_at=now, last_resent_at=now), "firing")
    if not muted and now - after.last_notified_at >= timedelta(seconds=policy.repeat_seconds):
        return Change(before, replace(after, last_notified_at=now, last_resent_at=now), "repeat")
    last = after.last_resent_at or after.last_notified_at
    if now - last >= timedelta(seconds=resend_seconds):
        # Alertmanager forgets an alert after its endsAt unless the sender re-sends it.
        return Change(before, replace(after, last_resent_at=now), "resend")
    return Change(before, after)


def _end(prev: AlertState, now: datetime) -> Change:
    """A pending alert goes back to inactive; a firing one resolves (notified if it was)."""
    if prev.state == "pending":
        return Change(prev, replace(prev, state="inactive", resolved_at=now))
    after = replace(prev, state="resolved", resolved_at=now)
    return Change(prev, after, "resolved" if prev.last_notified_at is not None else None)


def retire(previous: Mapping[str, AlertState], now: datetime) -> list[Change]:
    """Close the open alerts of a policy that no longer exists (``previous`` by scope key): a
    pending one goes back to inactive, a firing one resolves, and none is notified (there is no
    policy left to notify for)."""
    return [replace(_end(prev, now), notify=None) for prev in previous.values()]


def route(kind: NotifyKind, policy: PolicySpec, channel_types: Mapping[str, str]) -> list[str]:
    """The channels of ``policy`` a notification of ``kind`` goes to.

    Resends go to Alertmanager channels only; resolves go everywhere if send_resolved, and to
    Alertmanager regardless (else it would keep showing the alert until endsAt passes).
    """
    out = []
    for name in policy.channels:
        ctype = channel_types.get(name)
        if ctype is None:
            continue
        if kind == "resend" and ctype != "alertmanager":
            continue
        if kind == "resolved" and not policy.send_resolved and ctype != "alertmanager":
            continue
        out.append(name)
    return out
