"""A node that stops reporting is seen: its last-seen gauge on /metrics, the native node-silent
policy, and the shipped GpuNodeSilent rule in a real Prometheus after a real agent is killed."""

from __future__ import annotations

import re
import signal
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from service.api.app import create_app
from service.settings import Settings
from service.thresholds.default_policies import default_policies
from service.usecases.evaluation import evaluate_once
from tests.alerting_support import auth, ingest
from tests.conftest import make_token
from tests.process_support import scrape, start_agent, stop, wait_until
from tests.support import FakeClock, free_port, live_server, prometheus_server

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "rules" / "gpuwarden-alerts.yml"
GAUGE = "gpuwarden_node_last_seen_timestamp_seconds"


def last_seen(http: httpx.Client) -> dict[str, float]:
    text = http.get("/metrics").text
    return {
        s.labels["node"]: s.value
        for fam in text_string_to_metric_families(text)
        if fam.name == GAUGE
        for s in fam.samples
    }


def test_the_gauge_keeps_a_silent_node_and_the_default_policy_fires_for_it(
    app, http: httpx.Client, engine: Engine, clock: FakeClock
) -> None:
    ctx = app.state.ctx
    node_b = make_token(engine, "agent", "node-b")
    node_a = make_token(engine, "agent", "node-a")
    (silent,) = [p for p in default_policies(channels=[]) if p.name == "node-silent"]
    admin = auth(make_token(engine, "admin"))
    r = http.post("/api/v1/policies", json=silent.document(), headers=admin)
    assert r.status_code == 201, r.text

    def report(token: str, node: str) -> None:
        ingest(http, token, start=clock() - timedelta(seconds=1), count=1,
               metrics={"sm_active": 0.5}, gpu_uuids=(f"GPU-{node}",), hostname=node)  # fmt: skip

    report(node_a, "node-a")
    report(node_b, "node-b")
    stopped_at = clock()
    seen = last_seen(http)
    assert seen["node-a"] == pytest.approx(stopped_at.timestamp())
    # node-a's agent stops; node-b goes on every 10 s.
    states = []
    for _ in range(40):
        clock.advance(10)
        report(node_b, "node-b")
        evaluate_once(ctx)
        alerts = http.get("/api/v1/alerts", params={"policy": "node-silent"}, headers=admin)
        states.append([(a["labels"]["node"], a["state"]) for a in alerts.json()])
    assert all(node == "node-a" for s in states for node, _ in s)
    first_pending = next(i for i, s in enumerate(states) if s == [("node-a", "pending")])
    first_firing = next(i for i, s in enumerate(states) if s == [("node-a", "firing")])
    # Pending once silent past the threshold, firing after the policy's for.
    assert first_pending * 10 <= silent.threshold < (first_pending + 1) * 10
    assert (first_firing - first_pending) * 10 >= silent.for_seconds
    assert states[-1] == [("node-a", "firing")]
    # The gauge still says when node-a was last heard of; node-b's moves on.
    seen = last_seen(http)
    assert seen["node-a"] == pytest.approx(stopped_at.timestamp())
    assert seen["node-b"] > seen["node-a"] + 300

    # It comes back: the alert resolves.
    report(node_a, "node-a")
    evaluate_once(ctx)
    (alert,) = http.get("/api/v1/alerts", params={"policy": "node-silent"}, headers=admin).json()
    assert alert["state"] == "resolved"


def shortened_rules(tmp_path: Path, *, threshold_s: int, for_: str) -> Path:
    """The shipped rule file with only GpuNodeSilent's threshold and ``for`` made short."""
    text = RULES.read_text()
    doc = yaml.safe_load(text)
    (rule,) = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == "GpuNodeSilent"]
    expr, count = re.subn(r"> \d+$", f"> {threshold_s}", rule["expr"].strip())
    assert count == 1, rule["expr"]
    rule["expr"], rule["for"] = expr, for_
    out = tmp_path / "rules.yml"
    out.write_text(yaml.safe_dump(doc))
    return out


def firing(prom: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{prom}/api/v1/alerts", timeout=5)
    r.raise_for_status()
    alerts: list[dict[str, Any]] = r.json()["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == "GpuNodeSilent"]


def test_the_shipped_rule_fires_in_prometheus_after_the_agent_is_killed(
    settings: Settings, engine: Engine, tokens: dict[str, str], tmp_path: Path
) -> None:
    rules = shortened_rules(tmp_path, threshold_s=10, for_="5s")
    metrics_port = free_port()
    with live_server(create_app(settings, engine=engine)) as central:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {"job_name": "gpuwarden",
                 "static_configs": [{"targets": [central.removeprefix("http://")]}]}
            ],
        }  # fmt: skip
        with prometheus_server(tmp_path, config) as prom:
            agent = start_agent(
                central_url=central, token=tokens["agent"], state=tmp_path,
                metrics_port=metrics_port,
                args=["--backend", "simulated", "--node-name", "node-a",
                      "--interval-seconds", "0.5", "--batch-seconds", "0.5"],
            )  # fmt: skip
            try:
                wait_until("the agent's metrics", lambda: bool(scrape(metrics_port)), timeout=60)

                def reporting() -> bool:
                    q = httpx.get(f"{prom}/api/v1/query", params={"query": GAUGE}, timeout=5)
                    result = q.json()["data"]["result"]
                    return bool(result) and time.time() - float(result[0]["value"][1]) < 10

                # Reporting: scraped, fresh, and nothing fires for some evaluation rounds.
                wait_until("node-a's gauge in Prometheus", reporting, timeout=60)
                for _ in range(5):
                    assert firing(prom) == []
                    assert reporting()
                    time.sleep(1)
            finally:
                stop(agent, signal.SIGKILL)
            killed_at = time.time()

            def fired() -> list[dict[str, Any]]:
                return [a for a in firing(prom) if a["state"] == "firing"]

            wait_until("GpuNodeSilent to fire", lambda: bool(fired()), timeout=90)
            (alert,) = fired()
            assert alert["labels"]["node"] == "node-a"
            assert alert["labels"]["policy"] == "node-silent"
            assert alert["labels"]["severity"] == "warning"
            assert "job" not in alert["labels"] and "instance" not in alert["labels"]
            assert (
                alert["annotations"]["summary"] == "Node node-a has stopped reporting to GPU Warden"
            )
            # It went pending only after the agent was gone.
            active = alert["activeAt"].replace("Z", "+00:00")
            assert datetime.fromisoformat(active).timestamp() > killed_at
