"""/metrics in shards (``?shard=i/n``) over real HTTP, and the documented scrape config of one
target per shard in a real Prometheus (and promtool)."""

from __future__ import annotations

import re
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from service.api.app import create_app
from service.clock import utc_now
from service.exposition.shards import Shard, parse_shard
from service.settings import Settings
from tests.conftest import make_token
from tests.support import FakeClock, live_server, make_batch, prometheus_query, prometheus_server

REPO = Path(__file__).resolve().parents[2]
NODES = [f"node-{k}" for k in range(8)]
# Per scrape, not per fleet: every shard carries its own.
SCRAPE_FAMILIES = {"gpuwarden_fleet_metrics_up", "gpuwarden_fleet_metrics_duration_seconds"}
Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _feed(base: str, engine: Engine, start: Any) -> None:
    """Two GPUs on each of NODES, one batch each, sent by the node's own agent token."""
    for node in NODES:
        token = make_token(engine, "agent", node)
        batch = make_batch(hostname=node, gpu_uuids=(f"GPU-{node}-0", f"GPU-{node}-1"), start=start)
        r = httpx.post(
            f"{base}/api/v1/ingest", json=batch, headers={"Authorization": f"Bearer {token}"}
        )
        assert r.status_code == 200, r.text


def _series(base: str, shard: str | None = None) -> Series:
    params = {} if shard is None else {"shard": shard}
    r = httpx.get(f"{base}/metrics", params=params)
    assert r.status_code == 200, r.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(r.text)
        for s in fam.samples
        if fam.name not in SCRAPE_FAMILIES
    }


def _per_node(series: Series) -> Series:
    return {k: v for k, v in series.items() if dict(k[1]).get("node")}


def test_shards_split_the_gpus_and_shard_0_alone_carries_the_fleet(
    engine: Engine, settings: Settings, clock: FakeClock
) -> None:
    with live_server(create_app(settings, engine=engine, clock=clock)) as base:
        _feed(base, engine, clock())
        whole = _series(base)
        shards = [_series(base, f"{i}/4") for i in range(4)]
        bad = {v: httpx.get(f"{base}/metrics", params={"shard": v}) for v in ("4/4", "0/0", "x")}
    per_node = [_per_node(s) for s in shards]
    assert sum(len(p) for p in per_node) == len(_per_node(whole))  # no GPU in two shards
    assert {k: v for p in per_node for k, v in p.items()} == _per_node(whole)
    assert all(per_node), "8 nodes over 4 shards left one empty"  # CRC-32 spreads these 8
    for i, part in enumerate(per_node):
        assert {dict(k[1])["node"] for k in part} == {n for n in NODES if Shard(i, 4).holds(n)}
    # Fleet figures (over every GPU) and the service's own families: in shard 0 only.
    fleet = {k: v for k, v in whole.items() if not dict(k[1]).get("node")}
    assert {k: v for k, v in shards[0].items() if k in fleet} == fleet
    assert whole[("gpuwarden_fleet_gpus", ())] == 16
    for other in shards[1:]:
        assert not [k for k in other if not dict(k[1]).get("node")], other.keys()
    for value, r in bad.items():
        assert r.status_code == 422, (value, r.text)
        assert r.json()["detail"][0]["loc"] == ["query", "shard"]


def test_parse_shard_names_the_rule() -> None:
    assert parse_shard("3/8") == Shard(3, 8)
    for text, rule in (("8/8", "0 to 7"), ("1/0", "1 to"), ("a/b", "i/n"), ("-1/2", "i/n")):
        with pytest.raises(ValueError, match=rule):
            parse_shard(text)


def documented_config() -> dict[str, Any]:
    """The sharded scrape config of docs/prometheus-grafana.md, as a mapping."""
    doc = (REPO / "docs" / "prometheus-grafana.md").read_text()
    section = doc.split("### Shards: a large fleet as several targets", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None
    config: dict[str, Any] = yaml.safe_load(block.group(1))
    return config


def test_promtool_accepts_the_documented_shard_config(tmp_path: Path) -> None:
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(documented_config()))
    proc = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout + proc.stderr, proc.stderr


def test_prometheus_scrapes_each_shard_as_a_target(
    engine: Engine, settings: Settings, tmp_path: Path
) -> None:
    config = documented_config()
    with live_server(create_app(settings, engine=engine)) as base:
        _feed(base, engine, utc_now() - timedelta(seconds=1))
        (job,) = config["scrape_configs"]
        job["scrape_interval"] = job["scrape_timeout"] = "1s"
        for target in job["static_configs"]:
            target["targets"] = [base.removeprefix("http://")]
        with prometheus_server(tmp_path, config) as prom:
            up = prometheus_query(prom, 'count(up{job="gpuwarden"} == 1) == 4')
            assert up, "not every shard target is up"
            gpus = prometheus_query(prom, "count(gpuwarden_gpu_info) == 16")
            assert gpus, prometheus_query(prom, "count by (shard) (gpuwarden_gpu_info)")
            assert not prometheus_query(
                prom, "count by (gpu_uuid) (gpuwarden_gpu_info) > 1", timeout_s=0
            )
            fleet = prometheus_query(prom, "gpuwarden_fleet_gpus")
            assert [(s["metric"]["shard"], s["value"][1]) for s in fleet] == [("0/4", "16")]
            stored = prometheus_query(prom, 'gpuwarden_ingest_batches_total{outcome="stored"}')
            assert [s["metric"]["shard"] for s in stored] == ["0/4"]
            per_shard = prometheus_query(prom, "count by (shard) (gpuwarden_fleet_metrics_up)")
            assert sorted(s["metric"]["shard"] for s in per_shard) == [f"{i}/4" for i in range(4)]
