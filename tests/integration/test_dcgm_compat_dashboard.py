"""NVIDIA's dcgm-exporter Grafana dashboard, unchanged, on GPU Warden's compat /metrics.

A real Prometheus scrapes a real central service (GPUWARDEN_METRICS_DCGM_COMPAT=true) with the
scrape jobs of deploy/prometheus/prometheus.yml, only their target pointed at the test's central.
Two nodes report two GPUs each, both numbered 0 and 1, as on real nodes. Every template variable
and every panel query of the dashboard (tests/data/grafana, NVIDIA's file) must then see one
series per node and GPU, exactly as with one dcgm-exporter per node.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import Engine

from service.api.app import create_app
from service.clock import utc_now
from service.settings import Settings
from tests.conftest import make_token
from tests.support import iso, live_server, prometheus_server

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "tests" / "data" / "grafana" / "dcgm-exporter-dashboard.json"
SCRAPE = REPO / "deploy" / "prometheus" / "prometheus.yml"
NODES = ("gpu-node-a", "gpu-node-b")
GIB = 1024**3


@pytest.fixture
def central(engine: Engine) -> Iterator[str]:
    settings = Settings(
        database_url=str(engine.url.render_as_string(hide_password=False)),
        run_scheduler=False,
        metrics_dcgm_compat=True,
        metrics_token_required=True,  # as shipped: Prometheus sends a reader token
    )
    with live_server(create_app(settings, engine=engine)) as url:
        yield url


@pytest.fixture
def prometheus(central: str, engine: Engine, tmp_path: Path) -> Iterator[str]:
    """A real Prometheus with the shipped scrape jobs of the central, aimed at the test's."""
    # The agents' own job (gpuwarden-agent, no token) scrapes agents, of which this test has none.
    jobs = [
        job
        for job in yaml.safe_load(SCRAPE.read_text())["scrape_configs"]
        if job["job_name"] != "gpuwarden-agent"
    ]
    assert {job["job_name"] for job in jobs} == {"gpuwarden", "gpuwarden-dcgm-compat"}
    for job in jobs:
        job["static_configs"] = [{"targets": [central.removeprefix("http://")]}]
        job["scrape_interval"] = "1s"
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": jobs}
    # The reader token where the shipped jobs read it, beside prometheus.yml.
    for job in jobs:
        token_file = tmp_path / job["authorization"]["credentials_file"]
        token_file.parent.mkdir(exist_ok=True)
        token_file.write_text(make_token(engine, "reader"))
    with prometheus_server(tmp_path, config) as url:
        yield url


def report_two_nodes(central: str, engine: Engine) -> None:
    now = utc_now() - timedelta(seconds=1)
    for n, node in enumerate(NODES):
        token = make_token(engine, "agent", node)
        uuids = [f"GPU-{n}{i}00dead-beef-4000-8000-00000000000{i}" for i in (0, 1)]
        batch = {
            "node": {"hostname": node},
            "gpus": [
                {
                    "uuid": u,
                    "index": i,
                    "model": "NVIDIA H100 80GB HBM3",
                    "fb_total_bytes": 80 * GIB,
                    "pci_bus_id": f"00000000:{0x1A + i:02X}:00.0",
                    "driver_version": "570.124.06",
                }
                for i, u in enumerate(uuids)
            ],
            "samples": [
                {
                    "gpu_uuid": u,
                    "ts": iso(now),
                    "metrics": {
                        "temperature_celsius": 40.0 + 10 * n + i,
                        "power_watts": 300.0 + 100 * n + i,
                        "sm_clock_hz": 1.98e9,
                        "gpu_util": 0.5,
                        "fb_used_bytes": (10 + i) * GIB,
                        "tensor_active": 0.25,
                        "sm_active": 0.9,
                    },
                }
                for i, u in enumerate(uuids)
            ],
        }
        r = httpx.post(
            f"{central}/api/v1/ingest", json=batch, headers={"Authorization": f"Bearer {token}"}
        )
        assert r.status_code == 200, r.text


def instant(prom: str, promql: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{prom}/api/v1/query", params={"query": promql}, timeout=5)
    assert r.status_code == 200, r.text
    result: list[dict[str, Any]] = r.json()["data"]["result"]
    return result


def label_values(prom: str, query: str) -> list[str]:
    """Grafana's label_values(metric, label) through Prometheus's label values API."""
    m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query.strip())
    assert m, query
    r = httpx.get(f"{prom}/api/v1/label/{m[2]}/values", params={"match[]": m[1]}, timeout=5)
    values: list[str] = r.json()["data"]
    return values


def grafana_regex(values: list[str]) -> str:
    """How Grafana writes a multi-value variable into a Prometheus query."""
    escaped = [re.sub(r"([\\\\^$.|?*+()\[\]{}])", r"\\\\\1", v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def test_every_dashboard_query_sees_one_series_per_node_and_gpu(
    central: str, prometheus: str, engine: Engine
):
    dashboard = json.loads(DASHBOARD.read_text())
    report_two_nodes(central, engine)
    deadline = time.monotonic() + 60
    while len(instant(prometheus, "DCGM_FI_DEV_GPU_TEMP")) < 4 and time.monotonic() < deadline:
        time.sleep(0.25)

    variables = {v["name"]: v for v in dashboard["templating"]["list"] if v["type"] == "query"}
    assert set(variables) == {"instance", "gpu"}
    instances = label_values(prometheus, variables["instance"]["definition"])
    gpus = label_values(prometheus, variables["gpu"]["definition"])
    assert sorted(instances) == sorted(NODES)  # one instance per node, not one for central
    assert sorted(gpus) == ["0", "1"]

    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", []) if "expr" in t]
    assert len(exprs) == 8
    for expr in exprs:
        aggregated = re.match(r"^\s*(avg|sum)\(", expr) is not None
        # "All" instances and GPUs: every node's every GPU, once.
        q = expr.replace("$instance", grafana_regex(instances)).replace("$gpu", grafana_regex(gpus))
        got = instant(prometheus, q)
        if aggregated:
            assert len(got) == 1, (expr, got)
        else:
            keys = [(s["metric"]["instance"], s["metric"]["gpu"]) for s in got]
            assert sorted(keys) == sorted((n, g) for n in NODES for g in ("0", "1")), (expr, got)
        # One node picked: its two GPUs only (the aggregate over exactly them).
        for n, node in enumerate(NODES):
            q = expr.replace("$instance", grafana_regex([node])).replace(
                "$gpu", grafana_regex(gpus)
            )
            got = instant(prometheus, q)
            if aggregated:
                (s,) = got
                if "GPU_TEMP" in expr:
                    assert float(s["value"][1]) == 40.0 + 10 * n + 0.5
                if "POWER_USAGE" in expr:
                    assert float(s["value"][1]) == 2 * (300.0 + 100 * n) + 1
            else:
                assert sorted(s["metric"]["gpu"] for s in got) == ["0", "1"], (expr, got)
                assert {s["metric"]["Hostname"] for s in got} == {node}
    # dcgm-exporter's other labels are there too, and the SM clock panel's unit works out.
    (s,) = instant(prometheus, f'DCGM_FI_DEV_SM_CLOCK{{instance="{NODES[1]}",gpu="1"}} * 1000000')
    assert float(s["value"][1]) == 1.98e9
    assert s["metric"]["pci_bus_id"] == "00000000:1B:00.0"
    assert s["metric"]["DCGM_FI_DRIVER_VERSION"] == "570.124.06"
    assert s["metric"]["job"] == "gpuwarden-dcgm-compat"
    # The plain job does not store them a second time under central's address.
    assert instant(prometheus, 'DCGM_FI_DEV_GPU_TEMP{job="gpuwarden"}') == []
