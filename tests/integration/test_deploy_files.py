"""The deployment files parse, carry what they need, and point at files and commands that exist."""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "kubernetes"
COMPOSE = DEPLOY / "docker" / "compose.yaml"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))


def subcommands() -> set[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    assert isinstance(action.choices, dict)
    return set(action.choices)


def gpuwarden_commands(text: str) -> list[str]:
    """The sub-command of every `gpuwarden <sub>` invocation in ``text``."""
    return re.findall(r"(?<![\w.-])gpuwarden[ \t]+([a-z][a-z-]*)", text)


def test_every_yaml_file_parses():
    files = sorted(DEPLOY.rglob("*.yml")) + sorted(DEPLOY.rglob("*.yaml"))
    files += sorted((REPO / "grafana").rglob("*.yaml"))
    assert len(files) >= 15
    for f in files:
        docs = list(yaml.safe_load_all(f.read_text()))
        assert docs and all(d is not None for d in docs), f


# --- systemd ------------------------------------------------------------------------------


def unit(path: Path) -> configparser.RawConfigParser:
    cp = configparser.RawConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(path.read_text())
    return cp


def test_systemd_units_run_the_right_commands():
    assert [u.name for u in UNITS] == ["gpuwarden-agent.service", "gpuwarden-central.service"]
    central = unit(DEPLOY / "systemd" / "gpuwarden-central.service")
    agent = unit(DEPLOY / "systemd" / "gpuwarden-agent.service")
    assert shlex.split(central["Service"]["ExecStart"])[1:] == ["serve"]
    assert shlex.split(central["Service"]["ExecStartPre"])[1:] == ["migrate"]
    assert shlex.split(agent["Service"]["ExecStart"])[1:] == ["agent"]
    for u in (central, agent):
        assert u["Install"]["WantedBy"] == "multi-user.target"
        assert u["Service"]["Restart"] in ("on-failure", "always")
        env_file = Path(u["Service"]["EnvironmentFile"].lstrip("-"))
        example = DEPLOY / "systemd" / env_file.name.replace(".env", ".env.example")
        assert example.exists(), example
    assert central["Service"]["User"] == "gpuwarden"  # the central service never runs as root
    # The agent's state goes to systemd's StateDirectory (it reads $STATE_DIRECTORY), the one
    # writable place under ProtectSystem=strict; no file path is set around it.
    assert agent["Service"]["ProtectSystem"] == "strict"
    assert agent["Service"]["StateDirectory"] == "gpuwarden-agent"
    assert "SPOOL_PATH" not in agent["Service"].get("Environment", "")
    assert "PrivateDevices" not in agent["Service"]  # the agent must see /dev/nvidia*


def test_systemd_analyze_verify(tmp_path: Path):
    tool = shutil.which("systemd-analyze")
    if tool is None:  # not in every container; CI (Debian) has it
        pytest.fail("systemd-analyze is needed (Debian package systemd)")
    gpuwarden = shutil.which("gpuwarden") or str(Path(__file__).parents[2] / ".venv/bin/gpuwarden")
    assert Path(gpuwarden).exists()
    for u in UNITS:
        # verify checks that ExecStart's binary exists: point it at the installed entry point.
        (tmp_path / u.name).write_text(
            u.read_text().replace("/opt/gpuwarden/bin/gpuwarden", gpuwarden)
        )
    proc = subprocess.run(
        [tool, "verify", "--man=no", *(str(tmp_path / u.name) for u in UNITS)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    problems = [line for line in out.splitlines() if str(tmp_path) in line or ".service" in line]
    assert problems == [], out


def test_agent_unit_takes_the_free_hardening_and_keeps_the_nvidia_devices():
    agent = unit(DEPLOY / "systemd" / "gpuwarden-agent.service")["Service"]
    for key in (
        "ProtectClock",
        "ProtectKernelLogs",
        "ProtectControlGroups",
        "RestrictNamespaces",
        "LockPersonality",
    ):
        assert agent[key] == "yes", key
    assert agent["SystemCallArchitectures"] == "native"
    # ProtectClock= implies DeviceAllow=char-rtc on systemd before 252 (Ubuntu 22.04 has 249),
    # which would close /dev/nvidia*: the NVIDIA device groups are allowed by name.
    assert agent["DeviceAllow"] == "char-nvidia* rw"
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.fail("systemd-analyze is needed (Debian package systemd)")
    out = subprocess.run(
        [tool, "security", "--offline=yes", str(DEPLOY / "systemd" / "gpuwarden-agent.service")],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    exposure = re.search(r"Overall exposure level for gpuwarden-agent.service: ([0-9.]+)", out)
    assert exposure is not None, out
    assert float(exposure.group(1)) <= 4.4, out  # 6.1 before this hardening (systemd 252)


# --- Kubernetes ---------------------------------------------------------------------------


def k8s_docs() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for f in sorted(K8S.glob("*.yaml")):
        if f.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(f.read_text()):
            for key in ("apiVersion", "kind", "metadata"):
                assert key in doc, (f, key)
            out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def test_kustomization_lists_every_manifest_and_builds():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {f.name for f in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files
    kubectl = shutil.which("kubectl")
    if kubectl:  # builds offline; not every CI image has kubectl
        proc = subprocess.run(
            [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        kinds = {d["kind"] for d in yaml.safe_load_all(proc.stdout)}
        assert {"Deployment", "DaemonSet", "Service", "Secret", "ServiceMonitor"} <= kinds


def test_agent_daemonset_selects_tolerates_and_runs_the_agent():
    # The rest of the DaemonSet's contract is in test_kubernetes_manifests.py.
    ds = k8s_docs()[("DaemonSet", "gpuwarden-agent")]
    spec = ds["spec"]["template"]["spec"]
    assert (
        ds["spec"]["selector"]["matchLabels"].items()
        <= ds["spec"]["template"]["metadata"]["labels"].items()
    )
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    (container,) = spec["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["GPUWARDEN_CENTRAL_URL"]["value"].startswith(
        "http://gpuwarden-central.gpuwarden.svc:"
    )
    assert volumes_secret(spec) in {n for k, n in k8s_docs() if k == "Secret"}
    assert "gpuwarden agent" in " ".join(container["args"])


def volumes_secret(pod_spec: dict[str, Any]) -> str:
    (name,) = [v["secret"]["secretName"] for v in pod_spec["volumes"] if "secret" in v]
    return str(name)


def test_central_deployment_service_and_servicemonitor_fit_together():
    docs = k8s_docs()
    dep = docs[("Deployment", "gpuwarden-central")]
    svc = docs[("Service", "gpuwarden-central")]
    mon = docs[("ServiceMonitor", "gpuwarden-central")]
    pod = dep["spec"]["template"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (c,) = pod["spec"]["containers"]
    assert c["args"][0] == "serve" and pod["spec"]["initContainers"][0]["args"] == ["migrate"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    port = {p["name"]: p["containerPort"] for p in c["ports"]}["http"]
    assert c["args"][c["args"].index("--port") + 1] == str(port)
    secret = c["envFrom"][0]["secretRef"]["name"]
    assert "GPUWARDEN_DATABASE_URL" in docs[("Secret", secret)]["stringData"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    # Service -> pods, ServiceMonitor -> Service.
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert {p["name"] for p in svc["spec"]["ports"]} >= {mon["spec"]["endpoints"][0]["port"]}
    assert mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert mon["spec"]["endpoints"][0]["path"] == "/metrics"


def test_prometheusrule_matches_the_rules_file():
    rule = k8s_docs()[("PrometheusRule", "gpuwarden")]
    plain = yaml.safe_load((DEPLOY / "prometheus" / "rules" / "gpuwarden-alerts.yml").read_text())
    assert rule["spec"] == plain


def test_manifests_use_existing_subcommands():
    known = subcommands()
    for f in [*K8S.glob("*.yaml"), *UNITS, COMPOSE]:
        for sub in gpuwarden_commands(f.read_text()):
            assert sub in known, (f.name, sub)
    for doc in k8s_docs().values():
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            if "args" in c and "command" not in c:  # the image's entry point is gpuwarden
                assert c["args"][0] in known, c


# --- Docker and compose -------------------------------------------------------------------


def test_dockerfile_copies_files_that_exist():
    text = DOCKERFILE.read_text()
    copies = re.findall(r"^COPY (?!--from)(.+)$", text, flags=re.M)
    assert copies
    for line in copies:
        *sources, _dest = line.split()
        for src in sources:
            assert (REPO / src).exists(), src
    assert re.search(r'^ENTRYPOINT \["gpuwarden"\]$', text, flags=re.M)
    assert re.search(r"^USER 10001$", text, flags=re.M)
    assert "EXPOSE 8000" in text
    ignore = (DEPLOY / "docker" / "Dockerfile.dockerignore").read_text()
    for needed in ("pyproject.toml", "README.md", "service/**", "migrations/**"):
        assert f"!{needed}" in ignore


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return doc


def test_compose_has_the_stack():
    services = compose()["services"]
    assert set(services) == {
        "postgres",
        "central",
        "agent-token",
        "agent",
        "prometheus",
        "alertmanager",
        "grafana",
    }
    assert "--backend simulated" in " ".join(services["agent"]["command"])
    assert services["central"]["command"][0] == "serve"


def test_compose_references_files_that_exist():
    doc = compose()
    base = COMPOSE.parent
    named = set(doc.get("volumes", {}))
    for name, svc in doc["services"].items():
        build = svc.get("build")
        if build:
            context = (base / build["context"]).resolve()
            assert context.is_dir(), name
            assert (context / build["dockerfile"]).is_file(), name
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith((".", "/")):
                assert (base / src).exists(), (name, src)
            else:
                assert src in named, (name, src)
        for dep in svc.get("depends_on", []):
            assert dep in doc["services"], (name, dep)


def test_compose_wiring_matches_the_prometheus_and_grafana_files():
    doc = compose()
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (target,) = prom["scrape_configs"][0]["static_configs"][0]["targets"]
    host, port = target.split(":")
    assert host in doc["services"]
    assert doc["services"][host]["environment"]["GPUWARDEN_PORT"] == port
    (am,) = prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert am.split(":")[0] in doc["services"]
    # The agent's own /metrics: listening beyond loopback, on the port Prometheus scrapes, under
    # the node name its token writes for.
    (agent_job,) = [sc for sc in prom["scrape_configs"] if sc["job_name"] == "gpuwarden-agent"]
    (static,) = agent_job["static_configs"]
    (agent_target,) = static["targets"]
    host, port = agent_target.split(":")
    agent = doc["services"][host]
    assert agent["environment"]["GPUWARDEN_AGENT_METRICS_HOST"] == "0.0.0.0"
    image_env = dict(
        w.split("=", 1) for w in re.findall(r"\b(GPUWARDEN_\w+=\S+)", DOCKERFILE.read_text())
    )
    assert image_env["GPUWARDEN_AGENT_METRICS_PORT"] == port
    assert static["labels"] == {"node": agent["hostname"]}
    ds = yaml.safe_load((REPO / "grafana/provisioning/datasources/gpuwarden.yaml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
    # The database URL of central and of the token job point at the compose postgres.
    for name in ("central", "agent-token"):
        url = doc["services"][name]["environment"]["GPUWARDEN_DATABASE_URL"]
        assert "@postgres:5432/" in url, name
    # Grafana's provisioning path is where compose mounts the dashboards.
    prov = yaml.safe_load((REPO / "grafana/provisioning/dashboards/gpuwarden.yaml").read_text())
    mounts = [v.split(":")[1] for v in doc["services"]["grafana"]["volumes"]]
    assert prov["providers"][0]["options"]["path"] in mounts


# --- Security settings of the shipped files -------------------------------------------------


def test_shipped_deploy_files_protect_metrics_and_scrape_with_a_token():
    docs = k8s_docs()
    (c,) = docs[("Deployment", "gpuwarden-central")]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["GPUWARDEN_METRICS_TOKEN_REQUIRED"] == "true"
    assert env["GPUWARDEN_WEBHOOK_ALLOW_NETS"]  # in-cluster Alertmanager is reachable
    auth = docs[("ServiceMonitor", "gpuwarden-central")]["spec"]["endpoints"][0]["authorization"]
    secret = docs[("Secret", auth["credentials"]["name"])]
    assert auth["credentials"]["key"] in secret["stringData"]
    assert secret["metadata"]["namespace"] == "gpuwarden"

    services = compose()["services"]
    central_env = services["central"]["environment"]
    assert central_env["GPUWARDEN_METRICS_TOKEN_REQUIRED"] == "true"
    assert central_env["GPUWARDEN_WEBHOOK_ALLOW_NETS"]
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    token_file = prom["scrape_configs"][0]["authorization"]["credentials_file"]
    mounts = dict(v.rsplit(":", 2)[:2] for v in services["prometheus"]["volumes"])
    assert mounts["prometheus-token"] == "/etc/prometheus/" + token_file.rsplit("/", 1)[0]
    assert "gpuwarden-reader.token" in " ".join(services["agent-token"]["command"])
    assert "--role reader" in " ".join(services["agent-token"]["command"])
