"""The ladder-steps counter on /metrics: totals per label set, zeros for sets not seen yet."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from service.exposition.actions import actions_family


class _One(Collector):
    def __init__(self, family: object) -> None:
        self.family = family

    def collect(self):
        yield self.family


def test_rows_become_totals_and_unseen_label_sets_start_at_zero() -> None:
    family = actions_family(
        [("gpu-idle", "reclaim", "reclaimed", 2), ("gpu-idle", "notify_owner", "warned", 5)],
        zero=[("gpu-idle", "reclaim", "failed"), ("gpu-idle", "reclaim", "reclaimed")],
    )
    registry = CollectorRegistry()
    registry.register(_One(family))
    text = generate_latest(registry).decode()
    assert "# TYPE gpuwarden_actions_total counter" in text
    lines = {line for line in text.splitlines() if not line.startswith("#")}
    assert lines == {
        'gpuwarden_actions_total{action="notify_owner",outcome="warned",policy="gpu-idle"} 5.0',
        'gpuwarden_actions_total{action="reclaim",outcome="failed",policy="gpu-idle"} 0.0',
        'gpuwarden_actions_total{action="reclaim",outcome="reclaimed",policy="gpu-idle"} 2.0',
    }
