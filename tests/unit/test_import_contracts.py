"""The import contracts cover every module: each sits in a layer, and the agent's contract forbids
every top-level module of the service but the few it may use."""

from __future__ import annotations

import pkgutil
import re
import tomllib
from pathlib import Path

import service

ROOT = Path(__file__).resolve().parents[2]
AGENT_MAY_IMPORT = {
    "service.settings",
    "service.clientsettings",  # the CLI's part of the settings, which settings derives from
    "service.configfile",  # the settings' YAML file reader, which settings imports
    "service.vocabulary",
    "service.errors",
    "service.clock",
    "service.wire",
    "service.delivery",
    "service.families",  # the metric families its telemetry shares with the service's
}


def test_agent_contract_forbids_every_other_module() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (agent,) = [c for c in contracts if c.get("source_modules") == ["service.collectors"]]
    top_level = {f"service.{m.name}" for m in pkgutil.iter_modules(service.__path__)}
    expected = top_level - AGENT_MAY_IMPORT - {"service.collectors"}
    missing = sorted(expected - set(agent["forbidden_modules"]))
    assert not missing, f"add {missing} to the agent contract's forbidden_modules in pyproject.toml"
    assert set(agent["forbidden_modules"]) == expected


def test_every_module_sits_in_a_layer():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    listed = {name.strip() for layer in layers for name in re.split(r"[:|]", layer)}
    modules = [
        m.name
        for m in pkgutil.walk_packages(service.__path__, "service.")
        if not m.ispkg or m.name.count(".") > 1  # top-level packages are placed by their parts
    ]
    unplaced = sorted(
        m for m in modules if not any(m == p or m.startswith(p + ".") for p in listed)
    )
    assert not unplaced, f"place {unplaced} in a layer of the layers contract in pyproject.toml"
