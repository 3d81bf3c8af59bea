"""One idle job, one alert: which alerts a round leaves to a more specific one on the same GPUs.

The default policies overlap on an idle job: its low activity (``low-sm-activity``) and its idle
GPUs (``idle-held-gpu`` or ``allocated-idle-gpu``) would each alert, and a job-scope idle policy
(as in docs/actions.md) would add a third for the GPU alert it repeats. Like a hardware fault,
the more specific condition mutes the others while it holds (their alerts are kept, flagged
``suppressed``, and notify nobody): an idle policy's condition on a GPU mutes the low-activity
alerts of scopes whose GPUs are all idle, and a job-scope idle policy's condition mutes the
GPU-scope alerts of the same idle metric on that job's GPUs.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from service.thresholds.evaluator import Observation
from service.thresholds.policy import PolicySpec

IDLE_METRICS = frozenset({"idle_held", "cause:idle_held", "cause:idle_empty"})
_HOLDS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def is_idle_policy(policy: PolicySpec) -> bool:
    """Whether ``policy`` alerts on GPUs on which nothing runs (a share of idle time above)."""
    return policy.metric in IDLE_METRICS and policy.op in (">", ">=")


@dataclass(frozen=True, slots=True)
class IdleNow:
    """The GPUs an idle policy's condition holds on this round: on any scope, and by metric on
    a job scope."""

    gpus: frozenset[int] = frozenset()
    job_gpus: Mapping[str, frozenset[int]] = field(default_factory=dict)


def idle_now(
    observed: Iterable[tuple[PolicySpec, Mapping[str, Observation]]],
    gpus_of: Callable[[str, str], tuple[int, ...]],
) -> IdleNow:
    """The GPUs of every scope key whose idle policy's condition holds in ``observed``;
    ``gpus_of(scope, key)`` names a scope key's GPUs."""
    gpus: set[int] = set()
    job_gpus: dict[str, set[int]] = {}
    for policy, observations in observed:
        if not is_idle_policy(policy):
            continue
        holds = _HOLDS[policy.op]
        for key, obs in observations.items():
            if obs.value is None or not holds(obs.value, policy.threshold):
                continue
            ids = gpus_of(policy.scope, key)
            gpus.update(ids)
            if policy.scope == "job":
                job_gpus.setdefault(policy.metric, set()).update(ids)
    return IdleNow(frozenset(gpus), {m: frozenset(g) for m, g in job_gpus.items()})


def covered_by(policy: PolicySpec, ids: tuple[int, ...], idle: IdleNow) -> bool:
    """Whether an alert of ``policy`` on GPUs ``ids`` is left to a more specific idle alert."""
    if not ids or not policy.low_utilization:
        return False
    if not is_idle_policy(policy):
        return all(g in idle.gpus for g in ids)  # low activity on GPUs an idle alert covers
    if policy.scope == "gpu":
        same = idle.job_gpus.get(policy.metric, frozenset())
        return all(g in same for g in ids)  # the job's alert of the same idleness says it
    return False


def grouped(
    policy: PolicySpec,
    observations: Mapping[str, Observation],
    gpus_of: Callable[[str, str], tuple[int, ...]],
    idle: IdleNow,
) -> dict[str, Observation]:
    """``observations`` with ``covered`` set on the scope keys a more specific alert covers."""
    return {
        key: replace(obs, covered=True)
        if obs.value is not None and covered_by(policy, gpus_of(policy.scope, key), idle)
        else obs
        for key, obs in observations.items()
    }
