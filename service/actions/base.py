"""What every reclaim driver shares: the job to reclaim, the outcome, and the driver Protocol."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol

from service.core.verdict import NO_VERDICT, Verdict

# reclaimed: the driver freed the job's GPUs now; gone: the job had already ended (nothing to
# do, which counts as done); would: dry run, nothing was touched; failed: try again later.
ReclaimOutcome = Literal["reclaimed", "gone", "would", "failed"]


@dataclass(frozen=True)
class ReclaimTarget:
    """The job a ladder's reclaim step frees, as the driver needs to find it.

    ``job_id`` is GPU Warden's id (``slurm:4242``, ``k8s:ns/pod``); ``labels`` are the job's
    labels as registered (a Kubernetes job carries its namespace and pod); ``mode`` is the
    policy's choice for this driver (Slurm: ``cancel`` or ``requeue``; Kubernetes:
    ``delete_pod`` or ``scale_to_zero``; webhook: ``reclaim``). ``policy``, ``reason`` and
    ``figures`` (the numbers that triggered the step, e.g. ``idle_seconds``, ``waste_usd``) are
    passed on to a receiver that wants them (the action webhook); ``idempotency_key`` names
    this one step of this one ladder, the same on every retry of it.
    """

    job_id: str
    mode: str
    user: str | None = None
    team: str | None = None
    nodes: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    policy: str | None = None
    reason: str | None = None
    figures: Mapping[str, float] = field(default_factory=dict)
    # The job's verdict so far (its dollars, top cause and fix), sent beside ``figures``.
    verdict: Verdict = NO_VERDICT
    idempotency_key: str | None = None
    # When GPU Warden's record says the job started: a scheduler's job of the same id that
    # started at another time (a wrapped Slurm id, a re-created pod) is another job.
    started_at: datetime | None = None


@dataclass(frozen=True)
class ReclaimResult:
    """What a driver did: the outcome and one line of detail a person can read (the command run,
    the API request, the error)."""

    outcome: ReclaimOutcome
    detail: str


class ReclaimDriver(Protocol):
    """Frees a job's GPUs; idempotent (reclaiming a gone job answers ``gone``) and safe to retry.

    A driver never raises for a failed attempt: it answers ``failed`` with the reason, so the
    ladder records it and tries again on a later round. ``dry_run`` returns ``would`` with the
    request it would have made, and touches nothing.
    """

    name: str

    def reclaim(self, target: ReclaimTarget, *, dry_run: bool) -> ReclaimResult: ...


# present: the scheduler lists the job as GPU Warden recorded it (id, user, nodes), still holding
# its GPUs; gone: it ended or now runs elsewhere (the ladder resets); mismatch: the scheduler
# lists a job under that id whose user, nodes, id spelling or start differ from the record (never
# acted on); unknown: the read failed, so nothing is done this round.
ProbeOutcome = Literal["present", "gone", "mismatch", "unknown"]


@dataclass(frozen=True)
class SchedulerFacts:
    """What the scheduler itself says of a job: its id as the scheduler prints it, its user,
    nodes, the account or team its accounting charges (Slurm account, the namespace's team
    label), and when it started (UTC)."""

    job_id: str
    user: str | None = None
    nodes: tuple[str, ...] = ()
    account: str | None = None
    started_at: datetime | None = None


@dataclass(frozen=True)
class ProbeResult:
    """What a driver's re-read of a job found, with one line of detail, and (when it found the
    job) what the scheduler says of it."""

    outcome: ProbeOutcome
    detail: str
    facts: SchedulerFacts | None = None


class JobProbe(Protocol):
    """A driver that can re-read a job before the ladder acts on it (reads only, never acts).

    It compares what the scheduler says with ``target`` (``job_id`` as the scheduler prints it,
    ``user``, ``nodes``, ``started_at`` where the scheduler keeps one) and answers ``mismatch``,
    naming each difference, when they disagree; ``present`` carries the scheduler's facts.
    """

    def probe(self, target: ReclaimTarget) -> ProbeResult: ...
