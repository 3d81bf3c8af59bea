"""The job-efficiency dashboard on a fleet of stock dcgm-exporters, under a real Prometheus.

Stock dcgm-exporter (NVIDIA's default counters file) sends GR_ENGINE_ACTIVE, tensor and DRAM
activity and the duty cycle, never SM_ACTIVE (tests/data/dcgm-exporter). A real Prometheus
scrapes a real central service holding such samples for two GPUs of a job and one GPU no job
holds; every template variable of grafana/dashboards/job-efficiency.json must list the job's
team, user and id, and every panel query, with the variables set as Grafana sets them, must
return data.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, insert

from service.clock import utc_now
from service.db.schema import gpus, job_gpus, prices
from tests.integration.metrics_support import add_job
from tests.support import make_batch, prometheus_server

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "grafana" / "dashboards" / "job-efficiency.json"
GIB = 1024**3
# What a stock dcgm-exporter gives the agent (the ratios of its default counters, in canonical
# units): the graphics engine busy a fifth of the time, no SM_ACTIVE.
STOCK = {
    "gr_engine_active": 0.2,
    "tensor_active": 0.1,
    "dram_active": 0.05,
    "gpu_util": 0.3,
    "fb_used_bytes": 20 * GIB,
    "power_watts": 250.0,
}


@pytest.fixture
def prometheus(central: str, tmp_path: Path) -> Iterator[str]:
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "gpuwarden",
                "static_configs": [{"targets": [central.removeprefix("http://")]}],
            }
        ],
    }
    with prometheus_server(tmp_path, config) as url:
        yield url


def instant(prom: str, promql: str, at: datetime | None = None) -> list[dict[str, Any]]:
    """The instant query's result, at ``at`` (default: now)."""
    params = {"query": promql} | ({"time": at.isoformat()} if at else {})
    r = httpx.get(f"{prom}/api/v1/query", params=params, timeout=5)
    assert r.status_code == 200, (promql, r.text)
    result: list[dict[str, Any]] = r.json()["data"]["result"]
    return result


def substitute(expr: str, chosen: dict[str, list[str]]) -> str:
    """``expr`` with each $variable written as Grafana writes a multi-value choice."""
    for name, values in chosen.items():
        escaped = [re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", v) for v in values]
        text = escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
        expr = expr.replace(f"${name}", text)
    return expr.replace("$__range", "5m")


def label_values(prom: str, definition: str) -> list[str]:
    """Grafana's label_values(selector, label) through Prometheus's label values API."""
    m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", definition.strip())
    assert m, definition
    r = httpx.get(f"{prom}/api/v1/label/{m[2]}/values", params={"match[]": m[1]}, timeout=5)
    assert r.status_code == 200, (definition, r.text)
    values: list[str] = r.json()["data"]
    return values


def test_every_variable_and_query_has_data_on_stock_exporters(
    central: str, prometheus: str, engine: Engine, tokens: dict[str, str]
) -> None:
    start = utc_now() - timedelta(seconds=1)
    batch = make_batch(
        hostname="node-a", gpu_uuids=("GPU-j0", "GPU-j1", "GPU-free"), start=start, metrics=STOCK
    )
    r = httpx.post(
        f"{central}/api/v1/ingest",
        json=batch,
        headers={"Authorization": f"Bearer {tokens['agent']}"},
    )
    assert r.status_code == 200, r.text
    add_job(engine, job_id="train-7", uuid="GPU-j0", started=start, user="ana", team="vision")
    with engine.begin() as conn:
        gpu_id = conn.execute(gpus.select().where(gpus.c.uuid == "GPU-j1")).one().id
        conn.execute(
            insert(job_gpus).values(job_id="train-7", gpu_id=gpu_id, started_at=start, source="api")
        )
        conn.execute(
            insert(prices).values(
                model_pattern="*",
                usd_per_gpu_hour=2.0,
                effective_from=datetime(2026, 1, 1, tzinfo=UTC),
            )
        )
    dashboard = json.loads(DASHBOARD.read_text())
    variables = [v for v in dashboard["templating"]["list"] if v["type"] == "query"]
    deadline = time.monotonic() + 60
    chosen: dict[str, list[str]] = {}
    # Each variable's query sees the ones before it, as Grafana chains them.
    for v in variables:
        while not (got := label_values(prometheus, substitute(v["definition"], chosen))):
            assert time.monotonic() < deadline, f"variable {v['name']} has no values"
            time.sleep(0.25)
        chosen[v["name"]] = got
    assert chosen == {"team": ["vision"], "user": ["ana"], "job_id": ["train-7"]}

    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", []) if "expr" in t]
    assert len(exprs) >= 18
    # Evaluated at the next whole minute, as Grafana would be from then on: a subquery's steps
    # ([$__range:1m]) fall on whole minutes, so evaluated now it has no step after the first
    # scrape until that minute passes (up to 60 s of waiting); the gauges read the same
    # latest sample then as now.
    at = datetime.fromtimestamp((time.time() // 60 + 1) * 60, UTC)
    deadline = time.monotonic() + 60
    for expr in exprs:
        q = substitute(expr, chosen)
        while not instant(prometheus, q, at):
            assert time.monotonic() < deadline, f"no data: {expr}"
            time.sleep(0.25)
    # The job's efficiency is the activity ladder's rung the exporter has: gr_engine_active.
    (mean,) = [p for p in dashboard["panels"] if p["title"] == "Mean efficiency"]
    (eff,) = instant(prometheus, substitute(mean["targets"][0]["expr"], chosen))
    assert float(eff["value"][1]) == pytest.approx(STOCK["gr_engine_active"])
