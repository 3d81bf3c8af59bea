"""A real Prometheus scrapes a live central service fed over HTTP and sees the ingested values.

It also loads deploy/prometheus/rules/, so the shipped rules must load in a real server.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, text

from service.clock import utc_now
from tests.support import make_batch, prometheus_query, prometheus_server

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "rules" / "gpuwarden-alerts.yml"


@pytest.fixture
def prometheus(central: str, tmp_path: Path) -> Iterator[str]:
    """A real Prometheus on loopback scraping ``central`` every second; yields its base URL."""
    rules = tmp_path / "rules.yml"
    shutil.copy(RULES, rules)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": "gpuwarden",
                "static_configs": [{"targets": [central.removeprefix("http://")]}],
            }
        ],
    }
    with prometheus_server(tmp_path, config) as url:
        yield url


def test_prometheus_scrapes_ingested_values(central: str, prometheus: str, tokens):
    batch = make_batch(
        hostname="node-a",
        gpu_uuids=("GPU-s0", "GPU-s1"),
        start=utc_now() - timedelta(seconds=1),
        metrics={"sm_active": 0.37, "power_watts": 234.5, "fb_used_bytes": 12_345_678},
    )
    r = httpx.post(
        f"{central}/api/v1/ingest",
        json=batch,
        headers={"Authorization": f"Bearer {tokens['agent']}"},
    )
    assert r.status_code == 200, r.text

    sm = prometheus_query(prometheus, 'gpuwarden_gpu_sm_active_ratio{gpu_uuid="GPU-s1"}')
    assert len(sm) == 1, sm
    assert float(sm[0]["value"][1]) == 0.37
    labels = sm[0]["metric"]
    assert labels["job"] == "gpuwarden"  # the scrape job label is Prometheus's own
    assert (labels["node"], labels["gpu_index"], labels["model"]) == (
        "node-a",
        "1",
        "NVIDIA H100 80GB HBM3",
    )

    power = prometheus_query(prometheus, "sum(gpuwarden_gpu_power_watts)")
    assert float(power[0]["value"][1]) == 469.0
    fb = prometheus_query(prometheus, 'gpuwarden_gpu_fb_used_bytes{gpu_uuid="GPU-s0"}')
    assert float(fb[0]["value"][1]) == 12_345_678
    gpus = prometheus_query(prometheus, "gpuwarden_fleet_gpus == 2")
    assert len(gpus) == 1
    # The service's own health arrives with the same scrape.
    stored = prometheus_query(prometheus, 'gpuwarden_ingest_batches_total{outcome="stored"}')
    assert float(stored[0]["value"][1]) == 1.0
    # The shipped alerting rules loaded into the real server.
    rules = httpx.get(f"{prometheus}/api/v1/rules", timeout=5).json()["data"]["groups"]
    names = {rule["name"] for g in rules for rule in g["rules"]}
    assert {"GpuIdleHeld", "GpuJobLowSmActivity", "GpuLost", "GpuXidError"} <= names


def test_the_first_database_error_fires_the_rule(engine: Engine, central: str, prometheus: str):
    # A healthy service exposes its labelled counters at 0, so the first failure is a rise
    # increase() sees; a series that first appears at 1 has nothing to rise from.
    before = prometheus_query(prometheus, 'gpuwarden_database_errors_total{operation="metrics"}')
    assert [float(s["value"][1]) for s in before] == [0.0], before
    assert prometheus_query(prometheus, 'gpuwarden_ingest_batches_total{outcome="error"}')
    # A real database failure of the /metrics read: the table it reads is gone.
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE gpus RENAME TO gpus_away"))
    try:
        firing = prometheus_query(
            prometheus,
            'ALERTS{alertname="GpuWardenDatabaseErrors",operation="metrics",alertstate="firing"}',
        )
        assert len(firing) == 1, firing
    finally:
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE gpus_away RENAME TO gpus"))
