"""docs/alerting.md's table of the default policies says what the shipped file says: every
policy in order, its metric, aggregate, window, operator, threshold, for, scope, severity and
ladder steps."""

from __future__ import annotations

import re

from service.thresholds.default_policies import default_policies
from service.thresholds.policy import NODE_METRICS, PolicySpec
from tests.support import DOCS

# "avg `activity` over 10m < 0.30": aggregate and window are left out for node metrics.
HEAD = re.compile(r"^(?:(\w+) )?`([^`]+)`(?: over (\w+))? (<=|>=|==|!=|<|>) ([0-9.]+)")


def table() -> list[list[str]]:
    """The rows of the table after "ships the default policies"."""
    text = (DOCS / "alerting.md").read_text()
    section = text[text.index("ships the default policies:") :]
    lines = section.split("\n\n", 2)[1].splitlines()
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]


def check_row(row: list[str], policy: PolicySpec) -> None:
    name, condition, for_, scope, severity = row
    assert name == policy.name
    head = HEAD.match(condition)
    assert head is not None, condition
    aggregate, metric, window, op, threshold = head.groups()
    assert (metric, op, float(threshold)) == (policy.metric, policy.op, policy.threshold), name
    if policy.metric not in NODE_METRICS:
        assert (aggregate, window) == (policy.aggregate, policy.window), name
    assert for_ == ("at once" if policy.for_ == "0s" else policy.for_), name
    assert (scope, severity) == (policy.scope, policy.severity), name
    if policy.ladder is None:
        assert "ladder" not in condition, name
        return
    steps = [s.after for s in policy.ladder.steps]
    said = re.findall(r"\b(\d+[smhd])\b", condition.split("ladder", 1)[1])
    assert said == steps, (name, said, steps)
    assert ("dry run" in condition) == policy.ladder.dry_run, name


def test_the_policy_table_is_the_shipped_file() -> None:
    policies = default_policies(channels=[])
    rows = table()
    assert [r[0] for r in rows] == [p.name for p in policies]
    for row, policy in zip(rows, policies, strict=True):
        check_row(row, policy)
