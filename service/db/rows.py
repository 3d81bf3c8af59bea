"""Typed rows the repositories read and write, one name per column, so a misspelt key or a
column read that no longer exists fails in mypy rather than at run time."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, NotRequired, TypedDict


class AlertStateColumns(TypedDict):
    """The columns of an alert that change with its state."""

    state: str
    labels: dict[str, str]
    value: float | None
    fired_at: datetime | None
    resolved_at: datetime | None
    last_notified_at: datetime | None
    last_resent_at: datetime | None
    stale: int
    suppressed: int
    silenced: int


class NewAlert(AlertStateColumns):
    """A new alert's row as it is inserted."""

    policy: str
    scope_key: str
    severity: str
    threshold: float
    active_since: datetime
    last_eval_at: datetime
    job_id: str | None
    node: str | None
    gpu_uuid: str | None


class AlertEvent(TypedDict):
    """One state change of an alert, as its history shows it."""

    ts: datetime
    from_state: str
    to_state: str
    value: float | None


class NewAlertEvent(AlertEvent):
    """One state change of an alert, as it is inserted."""

    alert_id: int


class AlertRow(TypedDict):
    """An alert as listed: its stored columns (flags as booleans) and its history."""

    id: int
    policy: str
    scope_key: str
    severity: str
    state: str
    labels: dict[str, Any]
    value: float | None
    threshold: float
    active_since: datetime
    fired_at: datetime | None
    resolved_at: datetime | None
    last_eval_at: datetime
    last_notified_at: datetime | None
    last_resent_at: datetime | None
    stale: bool
    suppressed: bool
    silenced: bool
    job_id: str | None
    node: str | None
    gpu_uuid: str | None
    history: list[AlertEvent]


class SilenceRow(TypedDict):
    """A stored silence."""

    id: int
    matchers: dict[str, str]
    starts_at: datetime
    ends_at: datetime
    comment: str
    created_by: str | None
    created_at: datetime


class NewOutboxRow(TypedDict):
    """A delivery to queue: its payload is an outbox payload's JSON (a notification, a report
    or a rendered message)."""

    delivery_id: str
    channel: str
    alert_id: int | None
    payload: dict[str, Any]


class NoticeBase(TypedDict):
    """The fields every notice of one message shares."""

    kind: str
    subject: str
    job_id: str | None
    policy: str | None
    asked: str
    recipient: str | None
    fallback: str | None
    reason: str | None


class NewNotice(NoticeBase):
    """A notice as it is recorded: queued to one channel and address, or unreachable."""

    delivery_id: str | None
    status: str
    channel: str | None  # None: unreachable, nothing was queued
    address: str | None


class NoticeRow(NoticeBase):
    """A stored notice with the outcome of its delivery."""

    id: int
    delivery_id: str | None
    channel: str | None
    address: str | None
    status: str
    error: str | None
    created_at: datetime
    sent_at: datetime | None


class JobConflict(TypedDict):
    """A node's refused claim on a job."""

    node: str
    source: str
    claimed: dict[str, Any]
    at: datetime


class JobInterval(TypedDict):
    """One GPU a job held: the GPU, its node now, the node that registered the hold, and when."""

    gpu_id: int
    gpu_uuid: str
    node: str
    registered_node: str | None
    started_at: datetime
    ended_at: datetime | None
    source: str


class JobRow(TypedDict):
    """A stored job with its GPU intervals and the refused claims on it."""

    id: str
    user: str | None
    team: str | None
    project: str | None
    labels: dict[str, Any]
    source: str
    started_at: datetime
    ended_at: datetime | None
    created_at: datetime
    updated_at: datetime
    intervals: list[JobInterval]
    conflicts: list[JobConflict]
    work_key: NotRequired[str | None]  # runs of the same work share it (core/work_key.py)


class EpisodeKey(TypedDict):
    """The (policy, job, alert episode) a ladder's progress and audit rows are kept under."""

    policy: str
    job_id: str
    alert_id: int


class ActionNote(TypedDict, total=False):
    """What a ladder's audit row says beside its outcome: why, by which driver and mode, what
    was done, and the deliveries of a warning's notice."""

    reason: str | None
    driver: str | None
    mode: str | None
    detail: str | None
    delivery_ids: list[str] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class NewAction:
    """One audit row of a ladder's step to append, in the columns' order: the episode, the
    step's action and outcome (``dry_run``: what it would have done), why, and the numbers
    behind it."""

    at: datetime
    policy: str
    job_id: str
    user: str | None = None
    team: str | None = None
    alert_id: int | None = None
    step: int | None = None
    action: str
    outcome: str
    reason: str | None = None
    dry_run: bool
    driver: str | None = None
    mode: str | None = None
    detail: str | None = None
    value: float | None = None
    threshold: float | None = None
    since: datetime | None = None
    waste_usd: float | None = None
    idle_usd: float | None = None
    delivery_ids: list[str] | None = None


class ActionRow(TypedDict):
    """One audit row of a ladder's step: what it did (or would have), its outcome and why, with
    the figures behind it."""

    id: int
    at: datetime
    policy: str
    job_id: str
    user: str | None
    team: str | None
    alert_id: int | None
    step: int | None
    action: str
    outcome: str
    reason: str | None
    dry_run: bool
    driver: str | None
    mode: str | None
    detail: str | None
    value: float | None
    threshold: float | None
    since: datetime | None
    waste_usd: float | None
    idle_usd: float | None
    delivery_ids: list[str] | None


class GpuMove(TypedDict):
    """A GPU's move from one node to another that reported it."""

    from_node: str | None
    to_node: str
    moved_at: datetime
    from_last_sample_at: datetime | None


class ReportSendRow(TypedDict):
    """A periodic report claimed for sending to one recipient, with its outcome."""

    period_start: datetime
    recipient: str
    period_end: datetime
    status: str
    delivery_ids: list[str]
    claimed_at: datetime


class OptOutRow(TypedDict):
    """A user or team that gets no periodic report, since when and by whom."""

    recipient: str
    opted_out_at: datetime
    by: str | None


class GpuHeld(TypedDict):
    """The fields a fleet view filters, sorts and states a GPU by, with the job holding it."""

    uuid: str
    index: int
    model: str
    node: str
    last_seen_at: datetime | None
    lost: bool
    cause: str | None
    job: str | None
    user: str | None
    team: str | None
    state: NotRequired[str]  # added by the fleet's state rule


class GpuIndexRow(GpuHeld):
    """A GPU of the fleet's light index (``gpus_repo.fleet_index``)."""

    gpu_id: int


class GpuRow(GpuHeld):
    """A GPU in full as the API has it (``gpus_repo.list_gpus``), with its latest sample."""

    node_labels: dict[str, str]
    fb_total_bytes: int | None
    mig_parent_uuid: str | None
    first_seen_at: datetime
    retired_at: datetime | None
    source: str | None
    latest: dict[str, Any]
    activity: float | None
    activity_rung: str | None
    supported_causes: list[str]
    memory_unknown: bool
    clock_event_reasons: list[str]
    hw_slowdown: bool


class BookedSaving(NamedTuple):
    """A booked stored saving of a later run: its job, owner, realised and promised USD."""

    job_id: str
    user: str | None
    team: str | None
    project: str | None
    realised_usd: float | None
    promised_usd: float | None
