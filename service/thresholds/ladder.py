"""A policy's warn-then-reclaim ladder: its schema, and the pure planner that says which step is
due, for which jobs, and explains the timeline in words.

Times are datetimes (UTC) and seconds; nothing here reads a clock, a database or settings.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, assert_never, get_args

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from service.core.durations import parse_duration, spec_duration

StepAction = Literal["notify_owner", "reclaim"]
DriverName = Literal["slurm", "kubernetes", "webhook"]
DRIVER_NAMES: tuple[DriverName, ...] = get_args(DriverName)
SlurmMode = Literal["cancel", "requeue"]
KubernetesMode = Literal["delete_pod", "scale_to_zero"]
# The state of one job's ladder in one alert episode (stored per policy, job and episode);
# refused: the scheduler lists the job otherwise than GPU Warden recorded it (never acted on).
ProgressState = Literal["active", "done", "gone", "reset", "exempt", "refused"]
EXEMPT_LABEL = "gpuwarden.io/exempt"
# The examples a step's refused duration names.
_LIKE = "60m, 105m or 2h"

# The word a timeline uses for each driver's reclaim mode.
_RECLAIM_WORDS: dict[tuple[DriverName, str], str] = {
    ("slurm", "cancel"): "cancel",
    ("slurm", "requeue"): "requeue",
    ("kubernetes", "delete_pod"): "delete the pod",
    ("kubernetes", "scale_to_zero"): "scale to zero",
    ("webhook", "reclaim"): "reclaim",
}


class LadderStep(BaseModel):
    """One rung: ``action`` once the condition has held ``after`` (a duration since it began)."""

    model_config = ConfigDict(extra="forbid")

    action: StepAction
    after: str
    _after_s: float = PrivateAttr(0.0)

    def model_post_init(self, context: Any, /) -> None:
        """Parse the delay once."""
        self._after_s = parse_duration(self.after)

    @field_validator("after", mode="before")
    @classmethod
    def _after(cls, value: Any) -> str:
        return spec_duration("after", value, allow_zero=True, like=_LIKE)

    @property
    def after_seconds(self) -> float:
        """Seconds from the condition's start to this step."""
        return self._after_s


class LadderExempt(BaseModel):
    """Jobs the ladder never touches: by label (shell patterns on the job's labels), user, team,
    partition or namespace; and jobs younger than ``min_age``, which wait until they are older."""

    model_config = ConfigDict(extra="forbid")

    labels: dict[str, str] = Field(default_factory=lambda: {EXEMPT_LABEL: "true"})
    users: list[str] = Field(default_factory=list)
    teams: list[str] = Field(default_factory=list)
    partitions: list[str] = Field(default_factory=list)
    namespaces: list[str] = Field(default_factory=list)
    min_age: str | None = None
    _min_age_s: float = PrivateAttr(0.0)

    def model_post_init(self, context: Any, /) -> None:
        """Parse the minimum age once."""
        self._min_age_s = parse_duration(self.min_age) if self.min_age else 0.0

    @field_validator("min_age", mode="before")
    @classmethod
    def _min_age(cls, value: Any) -> str | None:
        if value is None:
            return None
        return spec_duration("min_age", value, allow_zero=True, like=_LIKE)

    @property
    def min_age_seconds(self) -> float:
        """How old a job must be, in seconds, before a step acts on it (0: any age)."""
        return self._min_age_s


class ReclaimSpec(BaseModel):
    """How the reclaim step frees a job: the driver (None: chosen by the job id's prefix) and
    each driver's mode."""

    model_config = ConfigDict(extra="forbid")

    driver: DriverName | None = None
    slurm: SlurmMode = "cancel"
    kubernetes: KubernetesMode = "delete_pod"


class LadderSpec(BaseModel):
    """The steps a policy takes on a job while its condition holds, and the safety rules."""

    model_config = ConfigDict(extra="forbid")

    steps: list[LadderStep] = Field(min_length=1)
    dry_run: bool = Field(True, strict=True)
    exempt: LadderExempt = Field(default_factory=LadderExempt)
    reclaim: ReclaimSpec = Field(default_factory=ReclaimSpec)

    @model_validator(mode="after")
    def _ordered(self) -> LadderSpec:
        for i, step in enumerate(self.steps):
            if i and step.after_seconds <= self.steps[i - 1].after_seconds:
                raise ValueError(
                    f"steps.{i}.after: {step.after} must be later than steps.{i - 1}.after "
                    f"({self.steps[i - 1].after}); delays count from the condition's start"
                )
            if step.action == "reclaim" and i != len(self.steps) - 1:
                raise ValueError(f"steps.{i}.action: reclaim must be the last step")
            if step.action == "reclaim" and not any(
                s.action == "notify_owner" for s in self.steps[:i]
            ):
                raise ValueError(
                    f"steps.{i}.action: a reclaim needs a notify_owner step before it (a job"
                    " is never reclaimed unwarned)"
                )
        return self

    @property
    def digest(self) -> str:
        """A fingerprint of what the ladder does (dry_run and steps): a job's progress started
        under another one starts over."""
        what = {"dry_run": self.dry_run, "steps": [s.model_dump() for s in self.steps]}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class LadderProgress:
    """How far one job's ladder has gone in one alert episode, as stored."""

    id: int
    policy: str
    job_id: str
    alert_id: int
    episode_start: datetime
    state: ProgressState
    steps_done: int
    pending_step: int | None
    last_step_at: datetime | None
    ladder_digest: str | None = None  # the ladder it runs under (None: from before 0027)


@dataclass(frozen=True)
class JobFacts:
    """What the planner needs to know of a job: who runs it, where, since when, its labels."""

    job_id: str
    user: str | None = None
    team: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    nodes: tuple[str, ...] = ()


# The driver of a job whose ladder names none, by its id's prefix; any other id (no prefix, or
# a scheduler of its own) is reclaimed through the action webhook (docs/actions.md).
DRIVER_BY_PREFIX: dict[str, DriverName] = {
    "slurm": "slurm",
    "k8s": "kubernetes",
    "kubernetes": "kubernetes",
}
OTHER_JOBS_DRIVER: DriverName = "webhook"


def driver_for(ladder: LadderSpec, job_id: str) -> DriverName:
    """The driver that reclaims ``job_id``: the ladder's, else by the id's prefix
    (``DRIVER_BY_PREFIX``), else the action webhook (``OTHER_JOBS_DRIVER``)."""
    if ladder.reclaim.driver is not None:
        return ladder.reclaim.driver
    return DRIVER_BY_PREFIX.get(job_id.partition(":")[0], OTHER_JOBS_DRIVER)


def reclaim_mode(ladder: LadderSpec, driver: DriverName) -> str:
    """The mode the ladder asks of ``driver`` (Slurm cancel|requeue, Kubernetes
    delete_pod|scale_to_zero, webhook reclaim); a driver without its branch is an error."""
    match driver:
        case "slurm":
            return ladder.reclaim.slurm
        case "kubernetes":
            return ladder.reclaim.kubernetes
        case "webhook":
            return "reclaim"
        case _:
            assert_never(driver)


def step_word(ladder: LadderSpec, step: LadderStep, job_id: str | None) -> str:
    """How a timeline names a step: ``warn``, or the reclaim (``cancel``, ``delete the pod``)."""
    if step.action == "notify_owner":
        return "warn"
    if job_id is None and ladder.reclaim.driver is None:
        return "reclaim"
    driver = driver_for(ladder, job_id or "")
    return _RECLAIM_WORDS[(driver, reclaim_mode(ladder, driver))]


def _namespace(job: JobFacts) -> str | None:
    if "namespace" in job.labels:
        return job.labels["namespace"]
    prefix, _, rest = job.job_id.partition(":")
    if prefix == "k8s" and "/" in rest:
        return rest.split("/", 1)[0]
    return None


def _any_match(value: str | None, patterns: Sequence[str]) -> bool:
    return value is not None and any(fnmatch.fnmatchcase(value, p) for p in patterns)


def exemption(ladder: LadderSpec, job: JobFacts) -> str | None:
    """Why ``job`` is exempt from the ladder (a sentence), or None if it is not."""
    ex = ladder.exempt
    for key, pattern in ex.labels.items():
        value = job.labels.get(key)
        if value is not None and fnmatch.fnmatchcase(str(value), pattern):
            return f"exempt: label {key}={value}"
    checks = (
        ("user", job.user, ex.users),
        ("team", job.team, ex.teams),
        ("partition", job.labels.get("partition"), ex.partitions),
        ("namespace", _namespace(job), ex.namespaces),
    )
    for what, value, patterns in checks:
        if _any_match(value, patterns):
            return f"exempt: {what} {value}"
    return None


def step_time(
    ladder: LadderSpec, index: int, *, episode_start: datetime, job_started_at: datetime | None
) -> datetime:
    """When step ``index`` falls due: ``after`` past the condition's start, and never before the
    job is ``exempt.min_age`` old."""
    at = episode_start + timedelta(seconds=ladder.steps[index].after_seconds)
    if job_started_at is not None and ladder.exempt.min_age_seconds:
        at = max(at, job_started_at + timedelta(seconds=ladder.exempt.min_age_seconds))
    return at


def due_step(
    ladder: LadderSpec,
    *,
    episode_start: datetime,
    steps_done: int,
    now: datetime,
    job_started_at: datetime | None = None,
) -> int | None:
    """The index of the step to take at ``now``, or None: the next step not done, once its time
    has come. One step at a time, so a late round never skips a warning."""
    if steps_done >= len(ladder.steps):
        return None
    at = step_time(ladder, steps_done, episode_start=episode_start, job_started_at=job_started_at)
    return steps_done if now >= at else None


def next_step_at(
    ladder: LadderSpec,
    *,
    episode_start: datetime,
    steps_done: int,
    job_started_at: datetime | None = None,
) -> tuple[LadderStep, datetime] | None:
    """The step after the first ``steps_done`` and when it falls due, or None if none is left."""
    if steps_done >= len(ladder.steps):
        return None
    at = step_time(ladder, steps_done, episode_start=episode_start, job_started_at=job_started_at)
    return ladder.steps[steps_done], at


def _clock(at: datetime) -> str:
    return at.strftime("%H:%M:%S") if at.second else at.strftime("%H:%M")


def _offset(seconds: float) -> str:
    s = int(seconds)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    parts = [f"{h}h" if h else "", f"{m}m" if m else "", f"{sec}s" if sec else ""]
    return "".join(parts) or "0s"


def explain(
    ladder: LadderSpec,
    *,
    condition: str,
    job_id: str | None = None,
    since: datetime | None = None,
    steps_done: int = 0,
    job_started_at: datetime | None = None,
) -> str:
    """The ladder's timeline in words.

    With a job and the condition's start: ``slurm:123 idle-held since 10:02: warn 11:02, warn
    11:47, cancel 12:02``; without them, relative to the start: ``when idle-held begins (T):
    warn at T+1h, warn at T+1h45m, cancel at T+2h``. Steps already done read ``warned`` or
    ``cancel (done)``; a dry run's steps read ``would ...`` (``would warn (done)`` once done).
    """
    prefix = "would " if ladder.dry_run else ""
    words: list[str] = []
    for i, step in enumerate(ladder.steps):
        word = step_word(ladder, step, job_id)
        if i < steps_done and step.action == "notify_owner" and not ladder.dry_run:
            word = "warned"
        elif i < steps_done:
            word = f"{prefix}{word} (done)"
        else:
            word = prefix + word
        if since is None:
            words.append(f"{word} at T+{_offset(step.after_seconds)}")
        else:
            at = step_time(ladder, i, episode_start=since, job_started_at=job_started_at)
            words.append(f"{word} {_clock(at)}")
    if since is None:
        head = f"when {condition} begins (T)"
        if job_id is not None:
            head = f"{job_id}: {head}"
    else:
        head = f"{job_id or 'a job'} {condition} since {_clock(since)}"
    tail = ""
    if ladder.exempt.min_age_seconds and since is None:
        tail = f" (never before the job is {ladder.exempt.min_age} old)"
    return f"{head}: {', '.join(words)}{tail}"
