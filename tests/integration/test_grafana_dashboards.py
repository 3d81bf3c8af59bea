"""The Grafana dashboards and Prometheus rules query only what /metrics really exports."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, insert

from service.db.schema import ladder_actions, prices
from service.vocabulary import METRICS
from tests.integration.metrics_support import add_job, ingest
from tests.process_support import agent_exposition
from tests.support import FakeClock, make_batch

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "grafana"
RULES = REPO / "deploy" / "prometheus" / "rules"

# Recording rules' names (level:metric:operation) contain colons; the rules define them.
METRIC_RE = re.compile(r"\b(gpuwarden_[a-z0-9_:]+|DCGM_FI_[A-Z0-9_]+)\b")
SELECTOR_RE = re.compile(r"\b(gpuwarden_[a-z0-9_]+)\{([^}]*)\}")
MATCHER_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
VARS = {"$__range": "1h", "${datasource}": "x", "$node": ".*", "$gpu_uuid": ".*"}
VARS |= {"$job_id": ".*", "$user": ".*", "$team": ".*"}


def builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "build_dashboards", GRAFANA / "build_dashboards.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dashboards() -> dict[str, dict[str, Any]]:
    files = sorted((GRAFANA / "dashboards").glob("*.json"))
    return {f.name: json.loads(f.read_text()) for f in files}


def dashboard_exprs() -> list[str]:
    exprs = []
    for board in dashboards().values():
        for panel in board["panels"]:
            exprs += [t["expr"] for t in panel.get("targets", [])]
        for var in board["templating"]["list"]:
            if var["type"] == "query":
                exprs.append(var["query"]["query"])
    return exprs


def recorded_names() -> set[str]:
    """The series the rule files record themselves."""
    return {
        rule["record"]
        for path in RULES.glob("*.yml")
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }


def rule_exprs() -> list[str]:
    out = []
    for path in RULES.glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            out += [rule["expr"] for rule in group["rules"]]
    return out


def test_dashboard_files_match_their_generator():
    assert {n: json.dumps(b, indent=2, sort_keys=True) + "\n" for n, b in dashboards().items()} == (
        builder().render_all()
    ), "run: python grafana/build_dashboards.py"


def test_four_dashboards_with_unique_uids_and_placed_panels():
    boards = dashboards()
    assert set(boards) == {
        "fleet-overview.json",
        "node-gpu-detail.json",
        "job-efficiency.json",
        "alerts.json",
    }
    uids = [b["uid"] for b in boards.values()]
    assert len(set(uids)) == len(uids)
    for name, board in boards.items():
        assert board["title"].startswith("GPU Warden / "), name
        ids = [p["id"] for p in board["panels"]]
        assert len(set(ids)) == len(ids), name
        for p in board["panels"]:
            pos = p["gridPos"]
            assert pos["x"] + pos["w"] <= 24, (name, p["title"])
            if p["type"] != "row":
                assert p["targets"] and all(t["expr"] for t in p["targets"]), (name, p["title"])
                assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_node_gpu_dashboard_covers_every_canonical_metric():
    text = json.dumps(dashboards()["node-gpu-detail.json"])
    from service.exposition.fleet import exported_name

    for spec in METRICS:
        assert exported_name(spec) in text, spec.name


def test_provisioning_points_at_the_dashboards():
    ds = yaml.safe_load((GRAFANA / "provisioning/datasources/gpuwarden.yaml").read_text())
    assert ds["datasources"][0]["type"] == "prometheus"
    prov = yaml.safe_load((GRAFANA / "provisioning/dashboards/gpuwarden.yaml").read_text())
    assert prov["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards/gpuwarden"


def test_every_expression_is_valid_promql(tmp_path: Path):
    exprs = dashboard_exprs() + rule_exprs()
    assert len(exprs) > 50
    rules = []
    for i, expr in enumerate(exprs):
        for var, value in VARS.items():
            expr = expr.replace(var, value)
        if expr.startswith("label_values("):
            inner = expr[len("label_values(") : expr.rindex(",")]
            expr = inner
        rules.append({"record": f"check:expr_{i}", "expr": expr})
    path = tmp_path / "exprs.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "exprs", "rules": rules}]}))
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture
def exported(http: httpx.Client, tokens, engine: Engine, clock: FakeClock) -> dict[str, set[str]]:
    """Sample name -> label names, from a /metrics scrape with every metric and a job present."""
    values = {m.name: (1 if m.kind == "int" else 0.5) for m in METRICS}
    ingest(http, tokens["agent"], make_batch(start=clock(), metrics=values))
    add_job(engine, job_id="j1", uuid="GPU-a0", started=clock(), user="u", team="t")
    with engine.begin() as conn:
        conn.execute(
            insert(prices).values(
                model_pattern="*",
                usd_per_gpu_hour=1.0,
                effective_from=datetime(2026, 1, 1, tzinfo=UTC),
            )
        )
        # gpuwarden_actions_total is read from the audit log: one recorded step makes it a series.
        conn.execute(
            insert(ladder_actions).values(
                at=clock(), policy="idle", job_id="j1", action="reclaim", outcome="failed"
            )
        )
    lost = make_batch(hostname="node-a", gpu_uuids=("GPU-a0", "GPU-a9"), start=clock())
    lost["gpus"][1]["lost"] = True
    lost["samples"] = []
    ingest(http, tokens["agent"], lost)
    return names_and_labels(http.get("/metrics").text)


@pytest.fixture(scope="module")
def agent_exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """Sample name -> label names, from a real agent's own /metrics."""
    return names_and_labels(agent_exposition(tmp_path_factory.mktemp("agent")))


def names_and_labels(exposition: str) -> dict[str, set[str]]:
    """Each sample name of ``exposition`` (with a family's suffixes) -> its label names."""
    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(exposition):
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
        for suffix in suffixes.get(fam.type, [""]):
            out.setdefault(fam.name + suffix, set())
        for s in fam.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


def test_every_queried_metric_and_label_is_exported(
    exported: dict[str, set[str]], agent_exported: dict[str, set[str]]
):
    queried = {m for expr in dashboard_exprs() + rule_exprs() for m in METRIC_RE.findall(expr)}
    assert "gpuwarden_gpu_sm_active_ratio" in queried
    # The agents' own series come from their /metrics, not the central's.
    agents = {m for m in queried if m.startswith("gpuwarden_agent_")}
    assert len(agents) >= 4 and agents <= set(agent_exported), agents - set(agent_exported)
    assert not set(exported) & set(agent_exported)  # one name, one source
    exported = exported | agent_exported
    missing = sorted(queried - set(exported) - recorded_names())
    assert missing == [], f"queried but not on /metrics: {missing}"
    for expr in dashboard_exprs() + rule_exprs():
        for metric, matchers in SELECTOR_RE.findall(expr):
            for label in MATCHER_RE.findall(matchers):
                assert label in exported[metric], f"{metric} has no label {label!r}: {expr}"
