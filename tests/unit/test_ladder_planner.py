"""The ladder's schema and its pure planner: validation names the field, steps fall due in
order, one at a time, exemptions and the timeline in words."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service.errors import ValidationFailed
from service.thresholds.ladder import (
    JobFacts,
    LadderSpec,
    driver_for,
    due_step,
    exemption,
    explain,
    next_step_at,
)
from service.thresholds.policy import parse_policy

POLICY = {"name": "idle", "metric": "idle_held", "op": ">=", "threshold": 1, "scope": "job"}
PRINCETON = {
    "steps": [
        {"action": "notify_owner", "after": "60m"},
        {"action": "notify_owner", "after": "105m"},
        {"action": "reclaim", "after": "120m"},
    ],
    "dry_run": False,
}
T0 = datetime(2026, 12, 2, 10, 2, tzinfo=UTC)


def ladder(**kw: Any) -> LadderSpec:
    spec = parse_policy(POLICY | {"ladder": PRINCETON | kw}).ladder
    assert spec is not None
    return spec


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"steps": [{"action": "notify_owner", "after": "60m"},
                    {"action": "reclaim", "after": "60m"}]},
         "ladder.steps.1.after", "must be later than steps.0.after (60m)"),
        ({"steps": [{"action": "reclaim", "after": "60m"},
                    {"action": "notify_owner", "after": "70m"}]},
         "ladder.steps.0.action", "reclaim must be the last step"),
        ({"steps": [{"action": "page", "after": "60m"}]}, "ladder.steps.0.action", "'notify_owner' or 'reclaim'"),
        ({"steps": [{"action": "reclaim", "after": "1.5h"}]}, "ladder.steps.0.after", "is not a duration"),
        ({"steps": [{"action": "reclaim"}]}, "ladder.steps.0.after", "Field required"),
        # A lone reclaim, even at 0s, would reclaim a job nobody warned.
        ({"steps": [{"action": "reclaim", "after": "0s"}]},
         "ladder.steps.0.action", "needs a notify_owner step before it"),
        ({"steps": []}, "ladder.steps", "at least 1 item"),
        ({"dry_run": "no"}, "ladder.dry_run", "valid boolean"),
        ({"reclaim": {"driver": "pbs"}}, "ladder.reclaim.driver", "'slurm', 'kubernetes' or 'webhook'"),
        ({"reclaim": {"slurm": "kill"}}, "ladder.reclaim.slurm", "'cancel' or 'requeue'"),
        ({"reclaim": {"kubernetes": "evict"}}, "ladder.reclaim.kubernetes", "'delete_pod' or 'scale_to_zero'"),
        ({"exempt": {"min_age": "-5m"}}, "ladder.exempt.min_age", "is not a duration"),
        ({"exempt": {"groups": ["x"]}}, "ladder.exempt.groups", "Extra inputs"),
    ],
)  # fmt: skip
def test_a_bad_ladder_names_the_field(change: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(ValidationFailed) as err:
        parse_policy(POLICY | {"ladder": PRINCETON | change})
    assert err.value.field == field
    assert message in err.value.message


def test_a_node_policy_takes_no_ladder() -> None:
    node = {"name": "n", "metric": "silent_seconds", "op": ">", "threshold": 60, "scope": "node"}
    with pytest.raises(ValidationFailed) as err:
        parse_policy(node | {"ladder": PRINCETON})
    assert err.value.field == "ladder" and "no job to act on" in err.value.message


def test_defaults_are_safe_and_the_document_round_trips() -> None:
    steps = [{"action": "notify_owner", "after": "1h"}, {"action": "reclaim", "after": "2h"}]
    spec = parse_policy(POLICY | {"ladder": {"steps": steps}})
    assert spec.ladder is not None
    assert spec.ladder.dry_run is True
    assert spec.ladder.exempt.labels == {"gpuwarden.io/exempt": "true"}
    assert parse_policy(spec.document()) == spec
    assert "ladder" not in parse_policy(POLICY).document()


def test_steps_fall_due_in_order_one_at_a_time() -> None:
    lad = ladder()

    def due(minutes: float, done: int) -> int | None:
        now = T0 + timedelta(minutes=minutes)
        return due_step(lad, episode_start=T0, steps_done=done, now=now)

    assert due(59, 0) is None
    assert due(60, 0) == 0
    assert due(104, 1) is None
    assert due(105, 1) == 1
    # Late (the service was down past both): the second warning first, never straight to reclaim.
    assert due(130, 1) == 1
    assert due(130, 2) == 2
    assert due(500, 3) is None
    step, at = next_step_at(lad, episode_start=T0, steps_done=2) or (None, None)
    assert step is not None and step.action == "reclaim" and at == T0 + timedelta(minutes=120)


def test_a_young_job_waits_for_its_minimum_age() -> None:
    lad = ladder(exempt={"min_age": "3h"})
    started = T0 - timedelta(minutes=30)
    at_60 = T0 + timedelta(minutes=60)
    assert due_step(lad, episode_start=T0, steps_done=0, now=at_60, job_started_at=started) is None
    at_150 = started + timedelta(hours=3)
    assert due_step(lad, episode_start=T0, steps_done=0, now=at_150, job_started_at=started) == 0


def test_exemptions_by_label_user_team_partition_and_namespace() -> None:
    lad = ladder(exempt={"labels": {"gpuwarden.io/exempt": "true"}, "users": ["svc-*"],
                         "teams": ["oncall"], "partitions": ["debug"], "namespaces": ["kube-*"]})  # fmt: skip
    assert exemption(lad, JobFacts("slurm:1", user="ana", team="ml")) is None
    assert exemption(lad, JobFacts("slurm:1", labels={"gpuwarden.io/exempt": "true"})) == (
        "exempt: label gpuwarden.io/exempt=true"
    )
    assert exemption(lad, JobFacts("slurm:1", labels={"gpuwarden.io/exempt": "false"})) is None
    assert exemption(lad, JobFacts("slurm:1", user="svc-ci")) == "exempt: user svc-ci"
    assert exemption(lad, JobFacts("slurm:1", team="oncall")) == "exempt: team oncall"
    assert exemption(lad, JobFacts("slurm:1", labels={"partition": "debug"})) == (
        "exempt: partition debug"
    )
    assert exemption(lad, JobFacts("k8s:kube-system/dns")) == "exempt: namespace kube-system"


def test_the_driver_follows_the_job_id_unless_the_ladder_names_one() -> None:
    lad = ladder()
    assert [driver_for(lad, j) for j in ("slurm:1", "k8s:ns/pod", "lsf:7")] == [
        "slurm", "kubernetes", "webhook",
    ]  # fmt: skip
    assert driver_for(ladder(reclaim={"driver": "webhook"}), "slurm:1") == "webhook"


def test_the_timeline_in_words() -> None:
    lad = ladder()
    assert explain(lad, condition="idle-held", job_id="slurm:123", since=T0) == (
        "slurm:123 idle-held since 10:02: warn 11:02, warn 11:47, cancel 12:02"
    )
    assert explain(lad, condition="idle-held") == (
        "when idle-held begins (T): warn at T+1h, warn at T+1h45m, reclaim at T+2h"
    )
    requeue = ladder(reclaim={"slurm": "requeue"}, dry_run=True)
    assert explain(requeue, condition="idle-held", job_id="slurm:9", since=T0, steps_done=1) == (
        "slurm:9 idle-held since 10:02: would warn (done) 11:02, would warn 11:47, would requeue 12:02"
    )
    k8s = ladder(reclaim={"kubernetes": "scale_to_zero"})
    assert explain(k8s, condition="idle-held", job_id="k8s:ml/train-0", since=T0).endswith(
        "scale to zero 12:02"
    )


def test_policies_check_explains_each_ladder_relative_and_on_live_jobs() -> None:
    from service.usecases.config_check import ladder_timelines

    policy = parse_policy(POLICY | {"ladder": PRINCETON})
    plain = parse_policy(POLICY | {"name": "no-ladder"})
    firing: list[dict[str, Any]] = [
        {"policy": "idle", "labels": {"job_id": "slurm:123"}, "active_since": "2026-12-02T10:02:00Z"},
        {"policy": "idle", "labels": {"node": "n1"}, "active_since": "2026-12-02T10:02:00Z"},
        {"policy": "other", "labels": {"job_id": "slurm:9"}, "active_since": "2026-12-02T10:02:00Z"},
    ]  # fmt: skip
    assert ladder_timelines([policy, plain], firing) == [
        "idle: when idle-held begins (T): warn at T+1h, warn at T+1h45m, reclaim at T+2h",
        "  slurm:123 idle-held since 10:02: warn 11:02, warn 11:47, cancel 12:02",
    ]
    # The audit log's steps of this episode (alert 7) mark theirs done; a failed try, a skip and
    # another episode's step do not.
    firing[0]["id"] = 7
    actions: list[dict[str, Any]] = [
        {"alert_id": 7, "step": 0, "outcome": "warned"},
        {"alert_id": 7, "step": 1, "outcome": "failed"},
        {"alert_id": 7, "step": None, "outcome": "skipped"},
        {"alert_id": 3, "step": 2, "outcome": "reclaimed"},
    ]
    assert ladder_timelines([policy], firing, actions)[1] == (
        "  slurm:123 idle-held since 10:02: warned 11:02, warn 11:47, cancel 12:02"
    )
    actions.append({"alert_id": 7, "step": 1, "outcome": "warned"})
    assert ladder_timelines([policy], firing, actions)[1] == (
        "  slurm:123 idle-held since 10:02: warned 11:02, warned 11:47, cancel 12:02"
    )
