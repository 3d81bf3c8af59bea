"""A real agent process's own /metrics (``gpuwarden agent --metrics-port``): its counters,
gauges and histogram, without the ``_created`` series prometheus_client adds by default."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.process_support import scrape, start_agent, stop, wait_until
from tests.support import free_port


@pytest.fixture(scope="module")
def exposition(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The text of a running agent's /metrics once it has cycled (no central: it spools)."""
    state, port = tmp_path_factory.mktemp("agent"), free_port()
    agent = start_agent(
        central_url=f"http://127.0.0.1:{free_port()}", token="gw_agent_test", state=state,
        metrics_port=port,
        args=["--backend", "simulated", "--node-name", "node-a", "--interval-seconds", "0.2"],
    )  # fmt: skip
    try:

        def cycled() -> bool:
            assert agent.poll() is None, (state / "agent.log").read_text()[-2000:]
            metrics = scrape(port)
            return any(name == "gpuwarden_agent_samples_collected_total" and v > 0
                       for (name, _), v in metrics.items())  # fmt: skip

        wait_until("the agent's first samples on its /metrics", cycled, timeout=60)
        yield httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        stop(agent)


def test_the_agent_s_metrics_have_no_created_series(exposition: str) -> None:
    families = {f.name: f for f in text_string_to_metric_families(exposition)}
    counters = [f for f in families.values() if f.type == "counter"]
    # Not vacuous: the counters (errors by kind, spool drops, dead letters...) are there.
    assert len(counters) >= 8 and "gpuwarden_agent_dead_letter_batches" in families
    assert "gpuwarden_agent_cycle_duration_seconds" in families
    created = [ln for ln in exposition.splitlines() if "_created" in ln]
    assert created == []
