"""The shipped Prometheus and Alertmanager files pass the real tools' checks and unit tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROM = REPO / "deploy" / "prometheus"


def run(*cmd: str, cwd: Path = REPO) -> str:
    assert shutil.which(cmd[0]), (
        f"{cmd[0]} is needed (Debian packages prometheus, prometheus-alertmanager)"
    )
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    return out


def test_promtool_check_config(tmp_path: Path):
    # promtool wants the reader token file prometheus.yml points at; it is a secret, so it is
    # not shipped: check a copy beside a stand-in token, laid out as compose mounts it.
    shutil.copy(PROM / "prometheus.yml", tmp_path / "prometheus.yml")
    shutil.copytree(PROM / "rules", tmp_path / "rules")
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "gpuwarden-reader.token").write_text("gw_stand-in\n")
    out = run("promtool", "check", "config", str(tmp_path / "prometheus.yml"))
    assert "SUCCESS" in out and "1 rule files found" in out


def test_promtool_check_rules():
    out = run("promtool", "check", "rules", *map(str, sorted((PROM / "rules").glob("*.yml"))))
    assert "SUCCESS: 21 rules found" in out


def test_the_hardware_xid_rule_pages_exactly_the_hardware_codes():
    import re

    import yaml

    from service.vocabulary import HARDWARE_XIDS

    groups = yaml.safe_load((PROM / "rules" / "gpuwarden-alerts.yml").read_text())["groups"]
    (rule,) = [
        r for g in groups for r in g["rules"] if r.get("record") == "gpuwarden_gpu:xid_hardware"
    ]
    codes = {int(c) for c in re.findall(r"gpuwarden_gpu_xid_last == (\d+)", rule["expr"])}
    assert codes == set(HARDWARE_XIDS) and not {13, 31, 43, 45} & codes


def test_promtool_rule_unit_tests():
    tests = sorted((PROM / "tests").glob("*.test.yml"))
    assert tests
    out = run("promtool", "test", "rules", *map(str, tests), cwd=PROM)
    assert "SUCCESS" in out and "FAILED" not in out


def test_amtool_check_config():
    out = run("amtool", "check-config", str(REPO / "deploy" / "alertmanager" / "alertmanager.yml"))
    assert "SUCCESS" in out and "1 inhibit rules" in out
