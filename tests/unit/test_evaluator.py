"""The pure evaluator and alert state machine, table-driven on a scripted clock."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service.thresholds.evaluator import (
    AlertState,
    Observation,
    ScopeMember,
    Silence,
    WindowStats,
    evaluate,
    observe,
    route,
)
from service.thresholds.policy import PolicySpec
from tests.support import FakeClock

T0 = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
LABELS = {"node": "node-a", "gpu": "GPU-a0", "model": "H100"}
GONE = "gone"  # the scope key left the scope (job ended)
NODATA = None


def low_sm(**kw: Any) -> PolicySpec:
    doc = {
        "name": "low-sm",
        "metric": "sm_active",
        "aggregate": "avg",
        "window": "10m",
        "op": "<",
        "threshold": 0.3,
        "for": "2m",
        "repeat_interval": "10m",
        "channels": ["slack", "am"],
    }
    return PolicySpec.model_validate(doc | kw)


@dataclass
class Step:
    """One round: advance the clock, observe ``value``; expect state, notification, stale flag."""

    after_s: float
    value: float | str | None
    state: str | None  # None: no alert exists after the round
    notify: str | None = None
    stale: bool = False
    fault: bool = False


def run(policy: PolicySpec, steps: list[Step], silences: list[Silence] | None = None) -> None:
    clock = FakeClock(T0)
    states: dict[str, AlertState] = {}
    for i, step in enumerate(steps):
        clock.advance(step.after_s)
        obs = {}
        if step.value != GONE:
            assert not isinstance(step.value, str)
            obs["k"] = Observation(step.value, LABELS, hardware_fault=step.fault)
        changes = evaluate(policy, obs, states, silences or [], clock(), resend_seconds=3600)
        by_key = {c.after.key: c for c in changes}
        c = by_key.get("k")
        got_state = c.after.state if c else None
        assert got_state == step.state, f"step {i}: state {got_state} != {step.state}"
        assert (c.notify if c else None) == step.notify, f"step {i}: notify {c and c.notify}"
        if c is not None:
            assert c.after.stale == step.stale, f"step {i}: stale"
        states = {
            k: ch.after for k, ch in by_key.items() if ch.after.state in ("pending", "firing")
        }


CASES: dict[str, tuple[dict[str, Any], list[Step]]] = {
    "for-duration: pending until for has passed, then firing once": (
        {},
        [
            Step(0, 0.1, "pending"),
            Step(60, 0.1, "pending"),
            Step(59, 0.1, "pending"),
            Step(1, 0.1, "firing", "firing"),
            Step(30, 0.1, "firing"),
        ],
    ),
    "for 0 fires at once": ({"for": "0s"}, [Step(0, 0.0, "firing", "firing")]),
    "threshold is strict for <": ({"for": "0s"}, [Step(0, 0.3, None)]),
    "<= includes the threshold": ({"for": "0s", "op": "<="}, [Step(0, 0.3, "firing", "firing")]),
    "flapping: a good round resets pending, never fires": (
        {},
        [
            Step(0, 0.1, "pending"),
            Step(90, 0.5, "inactive"),
            Step(30, 0.1, "pending"),
            Step(90, 0.5, "inactive"),
            Step(30, 0.1, "pending"),
            Step(90, 0.1, "pending"),
            Step(30, 0.1, "firing", "firing"),
        ],
    ),
    "resolve: firing -> resolved notifies when send_resolved": (
        {"for": "0s"},
        [Step(0, 0.1, "firing", "firing"), Step(30, 0.9, "resolved", "resolved")],
    ),
    "resolve without send_resolved still reports resolved (routing drops it)": (
        {"for": "0s", "send_resolved": False},
        [Step(0, 0.1, "firing", "firing"), Step(30, 0.9, "resolved", "resolved")],
    ),
    "stale data keeps firing and marks it stale; never resolves by itself": (
        {"for": "0s"},
        [
            Step(0, 0.1, "firing", "firing"),
            Step(30, NODATA, "firing", stale=True),
            Step(300, NODATA, "firing", stale=True),
            Step(30, 0.1, "firing"),
        ],
    ),
    "stale data keeps pending without firing it": (
        {},
        [
            Step(0, 0.1, "pending"),
            Step(300, NODATA, "pending", stale=True),
            Step(30, 0.2, "firing", "firing"),
        ],
    ),
    "no data never creates a low-utilization alert": ({"for": "0s"}, [Step(0, NODATA, None)]),
    "repeat after repeat_interval while firing": (
        {"for": "0s"},
        [
            Step(0, 0.1, "firing", "firing"),
            Step(300, 0.1, "firing"),
            Step(299, 0.1, "firing"),
            Step(1, 0.1, "firing", "repeat"),
            Step(300, 0.1, "firing"),
            Step(300, 0.1, "firing", "repeat"),
        ],
    ),
    "scope gone (job ended) resolves": (
        {"for": "0s"},
        [Step(0, 0.1, "firing", "firing"), Step(30, GONE, "resolved", "resolved")],
    ),
    "pending whose scope is gone goes inactive quietly": (
        {},
        [Step(0, 0.1, "pending"), Step(30, GONE, "inactive")],
    ),
    "inhibition: hardware fault suppresses the low-use notification until it clears": (
        {"for": "0s"},
        [
            Step(0, 0.0, "firing", fault=True),
            Step(30, 0.0, "firing", fault=True),
            Step(30, 0.0, "firing", "firing"),
        ],
    ),
    "a resolved alert that was never notified resolves quietly": (
        {"for": "0s"},
        [Step(0, 0.0, "firing", fault=True), Step(30, 0.9, "resolved")],
    ),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_state_machine(case: str) -> None:
    overrides, steps = CASES[case]
    run(low_sm(**overrides), steps)


def test_inhibition_only_applies_to_low_utilization_policies() -> None:
    hot = low_sm(metric="temperature_celsius", op=">", threshold=85, **{"for": "0s"})
    assert not hot.low_utilization
    run(hot, [Step(0, 90.0, "firing", "firing", fault=True)])
    assert low_sm().low_utilization
    assert low_sm(metric="idle_held", op=">=", threshold=1).low_utilization


def test_silence_mutes_while_active_then_notifies() -> None:
    silence = Silence(1, {"policy": "low-sm", "node": "node-*"}, T0, T0 + timedelta(seconds=60))
    run(
        low_sm(**{"for": "0s"}),
        [
            Step(0, 0.1, "firing"),
            Step(30, 0.1, "firing"),
            Step(30, 0.1, "firing", "firing"),  # silence ended at T0+60
        ],
        [silence],
    )


def test_silence_with_other_matchers_does_not_mute() -> None:
    silence = Silence(1, {"node": "node-b"}, T0, T0 + timedelta(hours=1))
    run(low_sm(**{"for": "0s"}), [Step(0, 0.1, "firing", "firing")], [silence])


def test_silenced_alert_is_flagged_not_hidden() -> None:
    silence = Silence(1, {"severity": "warning"}, T0, T0 + timedelta(hours=1))
    changes = evaluate(low_sm(**{"for": "0s"}), {"k": Observation(0.1, LABELS)}, {}, [silence], T0)
    assert len(changes) == 1 and changes[0].after.silenced and changes[0].notify is None


@pytest.mark.parametrize("fault", [False, True], ids=["silenced", "suppressed"])
def test_a_muted_alert_alertmanager_holds_is_only_resent(fault: bool) -> None:
    # Notified, then muted: no repeat for anyone, but resends keep it alive in Alertmanager
    # (route() sends resends there only); muted before it was ever notified: nothing at all.
    p = low_sm(**{"for": "0s"})
    silences = [] if fault else [Silence(1, {"policy": "low-sm"}, T0, T0 + timedelta(days=1))]
    loud, muted = Observation(0.1, LABELS), Observation(0.1, LABELS, hardware_fault=fault)
    (c,) = evaluate(p, {"k": loud}, {}, [], T0, resend_seconds=60)
    assert c.notify == "firing"
    kinds = []
    for minutes in range(1, 16):  # past the 10-minute repeat_interval
        at = T0 + timedelta(minutes=minutes)
        (c,) = evaluate(p, {"k": muted}, {"k": c.after}, silences, at, resend_seconds=60)
        kinds.append(c.notify)
        assert c.after.state == "firing" and (c.after.suppressed or c.after.silenced)
    assert kinds == ["resend"] * 15
    (never,) = evaluate(p, {"k": muted}, {}, silences, T0, resend_seconds=60)
    (never,) = evaluate(p, {"k": muted}, {"k": never.after}, silences, T0 + timedelta(hours=1))
    assert never.after.state == "firing" and never.notify is None


def test_job_scope_aggregates_over_the_jobs_gpus() -> None:
    stats = {
        1: {"sm_active": WindowStats(sum=6.0, count=60, min=0.0, max=0.2)},  # avg 0.1
        2: {"sm_active": WindowStats(sum=30.0, count=60, min=0.4, max=0.6)},  # avg 0.5
        3: {"sm_active": WindowStats(sum=54.0, count=60, min=0.9, max=0.9)},  # another job
    }
    members = [
        ScopeMember("job:j1", {"job": "j1", "team": "ml"}, (1, 2)),
        ScopeMember("job:j2", {"job": "j2", "team": "infra"}, (3,)),
        ScopeMember("job:j3", {"job": "j3", "team": "ml"}, (4,)),  # no data at all
    ]
    policy = low_sm(scope="job")
    obs = observe(policy, members, stats, {2: True})
    assert obs["job:j1"].value == pytest.approx(0.3)
    assert obs["job:j1"].hardware_fault
    assert obs["job:j2"].value == pytest.approx(0.9)
    assert obs["job:j3"].value is None
    assert observe(low_sm(scope="job", aggregate="min"), members, stats, {})["job:j1"].value == 0.0
    assert observe(low_sm(scope="job", aggregate="max"), members, stats, {})["job:j1"].value == 0.6
    # match on team narrows the scope
    matched = observe(low_sm(scope="job", match={"team": "m*"}), members, stats, {})
    assert sorted(matched) == ["job:j1", "job:j3"]


def test_a_jobs_own_stats_on_a_gpu_it_shares_replace_the_gpus() -> None:
    idle = PolicySpec(name="idle", metric="cause:idle_empty", op=">=", threshold=0.9, scope="job")
    busy_gpu = {7: {"cause:idle_empty": WindowStats(sum=0.0, count=180, min=0.0, max=0.0)}}
    own = {("job:j2", 7): {"cause:idle_empty": WindowStats(180.0, 180, 1.0, 1.0)}}
    members = [
        ScopeMember("job:j1", {"job": "j1"}, (7,)),  # the busy tenant: the GPU's figure
        ScopeMember("job:j2", {"job": "j2"}, (7,)),  # the idle one: its own
    ]
    obs = observe(idle, members, busy_gpu, {}, own)
    assert obs["job:j1"].value == 0.0
    assert obs["job:j2"].value == 1.0
    assert observe(idle, members, busy_gpu, {})["job:j2"].value == 0.0  # without: the GPU's


def test_route_resends_only_to_alertmanager_and_resolves_per_send_resolved() -> None:
    types = {"slack": "slack", "am": "alertmanager"}
    p = low_sm()
    assert route("firing", p, types) == ["slack", "am"]
    assert route("resend", p, types) == ["am"]
    assert route("resolved", p, types) == ["slack", "am"]
    assert route("resolved", low_sm(send_resolved=False), types) == ["am"]
    assert route("firing", low_sm(channels=["slack", "deleted"]), types) == ["slack"]


def test_alertmanager_resend_while_firing() -> None:
    p = low_sm(**{"for": "0s"})
    clock = FakeClock(T0)
    obs = {"k": Observation(0.1, LABELS)}
    (c,) = evaluate(p, obs, {}, [], clock(), resend_seconds=60)
    assert c.notify == "firing"
    clock.advance(30)
    (c,) = evaluate(p, obs, {"k": c.after}, [], clock(), resend_seconds=60)
    assert c.notify is None
    clock.advance(30)
    (c,) = evaluate(p, obs, {"k": c.after}, [], clock(), resend_seconds=60)
    assert c.notify == "resend"


def test_no_data_keeps_firing_alert_and_its_resends_going() -> None:
    p = low_sm(**{"for": "0s"})
    (c,) = evaluate(p, {"k": Observation(0.1, LABELS)}, {}, [], T0, resend_seconds=60)
    later = T0 + timedelta(seconds=61)
    (c2,) = evaluate(
        p, {"k": Observation(None, LABELS)}, {"k": c.after}, [], later, resend_seconds=60
    )
    assert c2.after.state == "firing" and c2.after.stale and c2.notify == "resend"


def test_an_alert_takes_new_labels_while_pending_and_keeps_its_fired_labels_until_resolved() -> (
    None
):
    policy = low_sm(**{"for": "1m"})
    with_job = LABELS | {"job_id": "slurm:7", "user": "alice"}
    states: dict[str, AlertState] = {}

    def round_(at_s: float, labels: dict[str, str], value: float) -> AlertState:
        obs = {"k": Observation(value=value, labels=labels)}
        (change,) = evaluate(policy, obs, states, [], T0 + timedelta(seconds=at_s))
        states["k"] = change.after
        return change.after

    assert round_(0, LABELS, 0.1).labels == LABELS
    pending = round_(30, with_job, 0.1)
    assert pending.state == "pending" and pending.labels == with_job
    fired = round_(60, with_job, 0.1)
    assert fired.state == "firing" and fired.labels == with_job
    # The job ends: the scope's labels lose it, the alert does not.
    still = round_(90, LABELS, 0.05)
    assert still.state == "firing" and still.labels == with_job and still.value == 0.05
    resolved = round_(120, LABELS, 0.9)
    assert resolved.state == "resolved" and resolved.labels == with_job


def test_silence_is_observed_per_node_until_the_window_calls_it_gone() -> None:
    from service.thresholds.evaluator import observe_silence

    policy = PolicySpec.model_validate(
        {"name": "node-silent", "metric": "silent_seconds", "window": "1h", "op": ">",
         "threshold": 60, "scope": "node", "match": {"node": "gpu-*"}}
    )  # fmt: skip
    last_seen = {
        "gpu-1": T0 - timedelta(seconds=30),
        "gpu-2": T0 - timedelta(minutes=10),
        "gpu-3": T0 - timedelta(hours=2),  # past the window: gone for good
        "login-1": T0 - timedelta(minutes=10),  # not matched
    }
    labels = {"gpu-2": {"node": "gpu-2", "model": "H100"}}
    obs = observe_silence(policy, last_seen, labels, T0)
    assert {k: o.value for k, o in obs.items()} == {"node:gpu-1": 30.0, "node:gpu-2": 600.0}
    assert obs["node:gpu-2"].labels == {"node": "gpu-2", "model": "H100"}
    assert obs["node:gpu-1"].labels == {"node": "gpu-1"}
    changes = evaluate(policy, obs, {}, [], T0)
    assert {c.after.key: c.after.state for c in changes} == {"node:gpu-2": "firing"}  # for: 0s


def test_silent_seconds_is_a_node_metric_in_seconds() -> None:
    with pytest.raises(ValueError, match="scope: silent_seconds is a node's metric"):
        PolicySpec.model_validate(
            {"name": "x", "metric": "silent_seconds", "op": ">", "threshold": 60}
        )
    assert (
        PolicySpec.model_validate(
            {"name": "x", "metric": "silent_seconds", "op": ">", "threshold": 600, "scope": "node"}
        ).threshold
        == 600
    )
