"""A real agent process's own /metrics (``gpuwarden agent --metrics-port``): its counters,
gauges and histogram, without the ``_created`` series prometheus_client adds by default."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.process_support import agent_exposition


def test_the_agent_s_metrics_have_no_created_series(tmp_path: Path) -> None:
    exposition = agent_exposition(tmp_path)
    families = {f.name: f for f in text_string_to_metric_families(exposition)}
    counters = [f for f in families.values() if f.type == "counter"]
    # Not vacuous: the counters (errors by kind, spool drops, dead letters...) are there.
    assert len(counters) >= 8 and "gpuwarden_agent_dead_letter_batches" in families
    assert "gpuwarden_agent_cycle_duration_seconds" in families
    created = [ln for ln in exposition.splitlines() if "_created" in ln]
    assert created == []
