"""One idle job, one alert: an idle condition mutes the overlapping alerts it covers, and only
those (pure: policies and observations in, the muted keys out)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from service.thresholds.evaluator import Observation, evaluate
from service.thresholds.grouping import covered_by, grouped, idle_now, is_idle_policy
from service.thresholds.policy import PolicySpec

NOW = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)
# Scope keys and their GPU ids: job j1 holds GPU 1, job j2 holds GPUs 2 and 3.
GPUS = {("job", "j1"): (1,), ("job", "j2"): (2, 3), ("gpu", "g1"): (1,), ("gpu", "g2"): (2,)}


def gpus_of(scope: str, key: str) -> tuple[int, ...]:
    return GPUS.get((scope, key), ())


def policy(name: str, metric: str, op: str, threshold: float, scope: str, **kw: Any) -> PolicySpec:
    return PolicySpec.model_validate(
        {"name": name, "metric": metric, "op": op, "threshold": threshold, "scope": scope, **kw}
    )


LOW = policy("low-sm-activity", "activity", "<", 0.3, "job")
IDLE_GPU = policy("idle-held-gpu", "idle_held", ">=", 1, "gpu", aggregate="min")
IDLE_JOB = policy("idle-held-job", "idle_held", ">=", 1, "job", aggregate="min")
EMPTY_JOB = policy("allocated-idle-gpu", "cause:idle_empty", ">=", 0.9, "job")
HOT = policy("hot-gpu", "temperature_celsius", ">", 85, "gpu")


def obs(value: float | None) -> Observation:
    return Observation(value=value, labels={})


def test_which_policies_are_idle_ones() -> None:
    assert is_idle_policy(IDLE_GPU) and is_idle_policy(IDLE_JOB) and is_idle_policy(EMPTY_JOB)
    assert not is_idle_policy(LOW) and not is_idle_policy(HOT)
    below = policy("few-idle", "cause:idle_empty", "<", 0.1, "job")
    assert not is_idle_policy(below)  # alerts on too little idle time: not an idle alert


def test_an_idle_gpu_mutes_low_activity_on_a_job_wholly_on_idle_gpus() -> None:
    idle = idle_now([(IDLE_GPU, {"g1": obs(1.0), "g2": obs(0.0)})], gpus_of)
    assert idle.gpus == {1} and idle.job_gpus == {}
    assert covered_by(LOW, (1,), idle)  # j1: its one GPU idle
    assert not covered_by(LOW, (2, 3), idle)  # j2: not idle, its own low activity alerts
    assert not covered_by(HOT, (1,), idle)  # a hot GPU is no low-utilization alert
    assert not covered_by(IDLE_GPU, (1,), idle)  # the idle GPU alert itself stays


def test_a_job_idle_policy_mutes_the_gpu_alert_of_the_same_idleness() -> None:
    idle = idle_now([(IDLE_JOB, {"j1": obs(1.0)}), (EMPTY_JOB, {"j2": obs(0.5)})], gpus_of)
    assert idle.job_gpus == {"idle_held": {1}}
    assert covered_by(IDLE_GPU, (1,), idle) and not covered_by(IDLE_GPU, (2,), idle)
    assert not covered_by(IDLE_JOB, (1,), idle)  # the job's alert is the one that says it


def test_a_muted_alert_fires_unnotified_and_no_data_is_never_covered() -> None:
    idle = idle_now([(EMPTY_JOB, {"j1": obs(1.0)})], gpus_of)
    observed = grouped(LOW, {"j1": obs(0.0), "j2": obs(None)}, gpus_of, idle)
    assert observed["j1"].covered and not observed["j2"].covered
    (change,) = evaluate(LOW, observed, {}, [], NOW)  # for: 0s, it fires at once
    assert change.after.suppressed and change.notify is None
    alone = evaluate(LOW, {"j1": obs(0.0)}, {}, [], NOW)[0]  # without the idle condition
    assert not alone.after.suppressed
