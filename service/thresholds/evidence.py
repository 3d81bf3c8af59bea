"""Whether a ladder step has the evidence it needs: fresh samples covering the time it judges,
from the node that registered the job, on a node whose clock agrees with the central's.

Pure: what the store holds and ``now`` in, the first reason to hold the step (or None) out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class EvidenceRules:
    """The bounds a step's evidence must meet (docs/actions.md#safety-rules)."""

    min_coverage: float  # share of whole minutes since the condition began with a sample, 0-1
    max_sample_age_seconds: float  # the newest sample of each GPU at most this old
    max_clock_offset_seconds: float  # each node's clock at most this far from the central's


@dataclass(frozen=True)
class GpuEvidence:
    """One GPU the job holds: where it reports now, which node registered the job on it, its
    newest sample and the minutes since the condition began in which it reported."""

    uuid: str
    node: str
    registered_node: str | None
    last_sample_at: datetime | None
    reported_minutes: frozenset[datetime]


@dataclass(frozen=True)
class NodeClock:
    """A node's clock minus the central's (seconds, positive: ahead), when last measured."""

    node: str
    offset_seconds: float | None


def judged_minutes(since: datetime, now: datetime) -> list[datetime]:
    """The minutes a step judges: from the one the condition began in to the last whole one
    before ``now`` (the current minute is still being reported)."""
    start = since.replace(second=0, microsecond=0)
    end = now.replace(second=0, microsecond=0)
    count = max(0, int((end - start).total_seconds() // 60))
    return [start + timedelta(minutes=i) for i in range(count)]


def _age(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _gpu_problem(
    gpu: GpuEvidence, minutes: Sequence[datetime], now: datetime, rules: EvidenceRules
) -> str | None:
    if gpu.registered_node is None:
        return f"no node is recorded as having registered the job on GPU {gpu.uuid}"
    if gpu.node != gpu.registered_node:
        return (
            f"GPU {gpu.uuid} now reports from node {gpu.node}, not from {gpu.registered_node}"
            " which registered the job: its samples do not speak for this job"
        )
    if gpu.last_sample_at is None:
        return f"GPU {gpu.uuid} has no sample"
    age = (now - gpu.last_sample_at).total_seconds()
    if age > rules.max_sample_age_seconds:
        return (
            f"GPU {gpu.uuid}'s newest sample is {_age(age)} old (at most"
            f" {rules.max_sample_age_seconds:g} s for a step)"
        )
    if minutes:
        share = sum(1 for m in minutes if m in gpu.reported_minutes) / len(minutes)
        if share < rules.min_coverage:
            return (
                f"GPU {gpu.uuid} reported in {share:.0%} of the {len(minutes)} minutes since"
                f" the condition began (at least {rules.min_coverage:.0%} needed)"
            )
    return None


def _clock_problem(clock: NodeClock, rules: EvidenceRules) -> str | None:
    offset = clock.offset_seconds
    if offset is None or abs(offset) <= rules.max_clock_offset_seconds:
        return None
    way = "ahead of" if offset > 0 else "behind"
    return (
        f"node {clock.node}'s clock is {abs(offset):.0f} s {way} the central's (at most"
        f" {rules.max_clock_offset_seconds:g} s): its samples' times cannot be trusted"
    )


def evidence_problem(
    *,
    since: datetime,
    now: datetime,
    stale: bool,
    gpus: Sequence[GpuEvidence],
    clocks: Iterable[NodeClock],
    rules: EvidenceRules,
) -> str | None:
    """Why a step judging the time from ``since`` to ``now`` may not be taken (a sentence), or
    None when every GPU of the job gives fresh, covering evidence from its registering node."""
    if stale:
        return "the alert is stale: its window holds no sample"
    if not gpus:
        return "the job holds no GPU that reports"
    minutes = judged_minutes(since, now)
    for gpu in gpus:
        problem = _gpu_problem(gpu, minutes, now, rules)
        if problem is not None:
            return problem
    for clock in clocks:
        problem = _clock_problem(clock, rules)
        if problem is not None:
            return problem
    return None
