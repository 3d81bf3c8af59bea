"""``idle_held`` and ``cause:idle_held`` are one policy metric under two names."""

from __future__ import annotations

from service.core.diagnosis import Cause
from service.thresholds.policy import PolicySpec, cause_of_metric, condition_words


def _policy(metric: str, scope: str) -> PolicySpec:
    return PolicySpec.model_validate(
        {"name": "p", "metric": metric, "op": ">=", "threshold": 0.5, "scope": scope}
    )


def test_both_names_read_the_idle_held_cause() -> None:
    assert cause_of_metric("idle_held") is Cause.IDLE_HELD
    assert cause_of_metric("cause:idle_held") is Cause.IDLE_HELD
    assert cause_of_metric("sm_active") is None


def test_both_names_describe_and_classify_a_policy_alike() -> None:
    for scope in ("gpu", "job"):
        old, new = _policy("idle_held", scope), _policy("cause:idle_held", scope)
        assert condition_words(old) == condition_words(new) == "idle-held"
        assert old.low_utilization == new.low_utilization is True
