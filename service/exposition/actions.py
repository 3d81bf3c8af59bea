"""The ladders' steps on /metrics: one counter of audit-log rows by policy, action and outcome.

The counter is read from the audit log at scrape time, not kept in the process: only the leader
acts, so a process counter would sit at 0 on every other replica and restart from 0 on a new
leader; the stored rows give every replica the same total, across restarts and failovers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client.core import CounterMetricFamily

from service.vocabulary import ACTION_OUTCOMES

ACTIONS_FAMILY = "gpuwarden_actions"


def ladder_label_sets(ladders: Iterable[tuple[str, Sequence[str]]]) -> list[tuple[str, str, str]]:
    """Every (policy, action, outcome) the ladders could count, from (policy, its steps'
    actions): the series that start at 0, so the first step shows in ``increase()``."""
    return [
        (policy, action, outcome)
        for policy, actions in ladders
        for action in dict.fromkeys(actions)
        for outcome in ACTION_OUTCOMES
    ]


def actions_family(
    counts: Iterable[tuple[str, str, str, int]], *, zero: Iterable[tuple[str, str, str]] = ()
) -> CounterMetricFamily:
    """``gpuwarden_actions_total{policy,action,outcome}`` from (policy, action, outcome, rows),
    with every label set of ``zero`` present at 0 when no row has it yet."""
    totals = {(p, a, o): 0 for p, a, o in zero}
    for policy, action, outcome, rows in counts:
        totals[(policy, action, outcome)] = totals.get((policy, action, outcome), 0) + rows
    family = CounterMetricFamily(
        ACTIONS_FAMILY,
        "Ladder steps recorded in the audit log (GET /api/v1/actions) by policy, action "
        "(notify_owner, reclaim) and outcome, dry-run steps included (outcome would); the same "
        "total on every replica.",
        labels=["policy", "action", "outcome"],
    )
    for labels, value in sorted(totals.items()):
        family.add_metric(list(labels), float(value))
    return family
