"""Every Kubernetes manifest passes a real schema validator, and the parts agree with each other.

Built-in kinds are checked with the Kubernetes JSON schemas of ``kubernetes-validate`` in strict
mode (an unknown or misspelt field fails, as ``kubectl apply --validate=strict`` would); the
Prometheus Operator's kinds against the openAPIV3Schema of their CRDs (tests/data/kubernetes-crds).
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.k8s_support import apply_component, component, daemonset, strict

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "kubernetes"
CRDS = REPO / "tests" / "data" / "kubernetes-crds"
# The oldest Kubernetes still in common support and the newest the schemas know.
VERSIONS = ("1.29", kubernetes_validate.utils.latest_version())


def manifests() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for f in sorted(K8S.glob("*.yaml")):
        if f.name == "kustomization.yaml":
            continue
        out += [(f.name, d) for d in yaml.safe_load_all(f.read_text()) if d]
    return out


def by_kind() -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for _, d in manifests()}


def crd_schema(kind: str) -> dict[str, Any]:
    for f in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(f.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
            schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
            return schema
    raise KeyError(kind)


def validate(doc: dict[str, Any]) -> None:
    """Raise if ``doc`` is not a valid object of its kind."""
    if doc["apiVersion"].startswith("monitoring.coreos.com/"):
        # Not jsonschema.validate: it checks the schema first, and the CRD's Go regexes
        # ("(?i)" mid-pattern) are not Python's; fields we use have plain patterns.
        schema = strict(crd_schema(doc["kind"]))
        jsonschema.Draft7Validator(schema).validate(doc)
        return
    for version in VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("name,doc", manifests(), ids=lambda v: v if isinstance(v, str) else "")
def test_manifest_is_valid(name: str, doc: dict[str, Any]):
    validate(doc)


def test_the_validators_have_teeth():
    docs = by_kind()
    ds = copy.deepcopy(docs[("DaemonSet", "gpuwarden-agent")])
    ds["spec"]["template"]["spec"]["hostPIDD"] = True  # a typo kubectl --validate=strict refuses
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(ds)
    mon = copy.deepcopy(docs[("ServiceMonitor", "gpuwarden-central")])
    mon["spec"]["endpoints"][0]["interval"] = "15 seconds"  # not a Prometheus duration
    with pytest.raises(jsonschema.ValidationError):
        validate(mon)
    rule = copy.deepcopy(docs[("PrometheusRule", "gpuwarden")])
    rule["spec"]["groups"][0]["rules"][0]["for"] = 15
    with pytest.raises(jsonschema.ValidationError):
        validate(rule)
    rule = copy.deepcopy(docs[("PrometheusRule", "gpuwarden")])
    rule["spec"]["groups"][0]["rules"][0]["severity"] = "warning"  # belongs under labels
    with pytest.raises(jsonschema.ValidationError):
        validate(rule)


def test_runtime_class_component_patches_a_valid_daemonset():
    ds = by_kind()[("DaemonSet", "gpuwarden-agent")]
    assert "runtimeClassName" not in ds["spec"]["template"]["spec"]  # optional, not hard-coded
    patched = apply_component(ds, component("nvidia-runtime-class"))
    assert patched["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    validate(patched)


def test_dcgm_exporter_component_switches_the_backend_only():
    ds = by_kind()[("DaemonSet", "gpuwarden-agent")]
    patched = apply_component(ds, component("dcgm-exporter-backend"))
    validate(patched)
    (c,) = patched["spec"]["template"]["spec"]["containers"]
    (before,) = ds["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["GPUWARDEN_BACKEND"] == "dcgm-exporter"
    assert env["GPUWARDEN_DCGM_EXPORTER_URL"].endswith(":9400/metrics")
    assert len(c["env"]) == len(before["env"]) + 1  # merged by name, nothing else lost


def test_host_pid_component_lets_the_agent_read_other_pods_environments_only():
    ds = by_kind()[("DaemonSet", "gpuwarden-agent")]
    assert "hostPID" not in ds["spec"]["template"]["spec"]  # off unless a site asks
    patched = apply_component(ds, component("host-pid"))
    validate(patched)
    spec = patched["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    (c,) = spec["containers"]
    assert c["securityContext"]["capabilities"] == {
        "drop": ["ALL"],
        "add": ["SYS_PTRACE", "DAC_READ_SEARCH"],
    }
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False


def test_components_are_documented_where_they_are_switched_on():
    kust = (K8S / "kustomization.yaml").read_text()
    for name in ("nvidia-runtime-class", "dcgm-exporter-backend", "host-pid", "reclaim"):
        assert f"#   - components/{name}" in kust


def test_reclaim_component_runs_the_central_under_its_own_least_privilege_account():
    rbac = [
        d for d in yaml.safe_load_all((K8S / "components" / "reclaim" / "rbac.yaml").read_text())
    ]
    for doc in rbac:
        validate(doc)
    (account,) = [d for d in rbac if d["kind"] == "ServiceAccount"]
    (role,) = [d for d in rbac if d["kind"] == "ClusterRole"]
    (binding,) = [d for d in rbac if d["kind"] == "ClusterRoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "gpuwarden"}
    ]
    central = by_kind()[("Deployment", "gpuwarden-central")]
    assert "serviceAccountName" not in central["spec"]["template"]["spec"]  # opt-in
    patched = apply_component(central, component("reclaim"))
    validate(patched)
    assert patched["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    # Which verbs on which resources: test_kubernetes_driver.py checks them against the requests.


def test_kustomize_builds_with_the_components(tmp_path: Path):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (the components are also applied by hand above)")
    overlay = tmp_path / "overlay"
    shutil.copytree(K8S, overlay)
    kust = overlay / "kustomization.yaml"
    kust.write_text(
        kust.read_text().replace("# components:", "components:").replace("#   - comp", "  - comp")
    )
    proc = subprocess.run(
        [kubectl, "kustomize", str(overlay)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    (ds,) = [d for d in yaml.safe_load_all(proc.stdout) if d["kind"] == "DaemonSet"]
    assert ds["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    # kustomize's own strategic merge agrees with the one the tests apply by hand (env order
    # aside: kustomize puts patched entries first).
    by_hand = daemonset()
    for name in ("nvidia-runtime-class", "dcgm-exporter-backend", "host-pid"):
        by_hand = apply_component(by_hand, component(name))

    def keyed(containers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [c | {"env": sorted(c["env"], key=lambda e: e["name"])} for c in containers]

    built, hand = ds["spec"]["template"]["spec"], by_hand["spec"]["template"]["spec"]
    assert keyed(built["containers"]) == keyed(hand["containers"])
    for doc in yaml.safe_load_all(proc.stdout):
        validate(doc)


def test_agent_daemonset_follows_the_dcgm_exporter_chart():
    ds = by_kind()[("DaemonSet", "gpuwarden-agent")]
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e for e in c["env"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    # Attribution through the kubelet, like dcgm-exporter: no host pid namespace or /proc.
    assert not pod.get("hostPID") and "proc" not in volumes and "cgroup" not in volumes
    sock = Path(env["GPUWARDEN_POD_RESOURCES_SOCKET"]["value"])
    assert mounts["pod-resources"]["mountPath"] == str(sock.parent)
    assert mounts["pod-resources"]["readOnly"] is True
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # The node name the agent reports comes from the downward API.
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # The state directory is the writable volume; the root file system is read-only.
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert env["GPUWARDEN_STATE_DIR"]["value"] == mounts["state"]["mountPath"]
    assert "readOnly" not in mounts["state"]
    # Probes on the agent's own metrics port, which listens on the pod IP.
    port = next(p for p in c["ports"] if p["name"] == "metrics")
    assert env["GPUWARDEN_AGENT_METRICS_PORT"]["value"] == str(port["containerPort"])
    assert env["GPUWARDEN_AGENT_METRICS_HOST"]["value"] == "0.0.0.0"
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert {"cpu", "memory"} <= set(c["resources"]["requests"]) and c["resources"]["limits"]
    # Schedules on GPU nodes with or without GPU Feature Discovery.
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = {t["matchExpressions"][0]["key"] for t in terms["nodeSelectorTerms"]}
    assert "nvidia.com/gpu.present" in keys and len(keys) >= 2
    assert "nodeSelector" not in pod  # a GFD-only selector would leave other clusters empty
    # NVML without requesting a GPU.
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert "nvidia.com/gpu" not in str(c["resources"])


def rule_jobs() -> set[str]:
    rule = by_kind()[("PrometheusRule", "gpuwarden")]
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    return {m for e in exprs for m in re.findall(r'\bjob="([^"]+)"', e)}


def test_the_monitors_give_the_jobs_the_rules_select():
    docs = by_kind()
    mon = docs[("ServiceMonitor", "gpuwarden-central")]
    svc = docs[("Service", "gpuwarden-central")]
    # Without jobLabel the Operator names the job after the Service ("gpuwarden-central").
    job = svc["metadata"]["labels"][mon["spec"]["jobLabel"]]
    pods = docs[("PodMonitor", "gpuwarden-agent")]
    ds = docs[("DaemonSet", "gpuwarden-agent")]["spec"]["template"]["metadata"]["labels"]
    agent_job = ds[pods["spec"]["jobLabel"]]
    assert rule_jobs() == {job, agent_job}
    # prometheus.yml (compose, bare metal) names its scrape jobs alike.
    prom = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    assert {job, agent_job} <= {sc["job_name"] for sc in prom["scrape_configs"]}


def test_servicemonitor_and_rule_carry_the_same_release_label():
    docs = by_kind()
    mon = docs[("ServiceMonitor", "gpuwarden-central")]["metadata"]["labels"]
    rule = docs[("PrometheusRule", "gpuwarden")]["metadata"]["labels"]
    assert mon["release"] == rule["release"] == "kube-prometheus-stack"


def test_podmonitor_scrapes_the_agents_metrics_port():
    docs = by_kind()
    mon = docs[("PodMonitor", "gpuwarden-agent")]
    ds = docs[("DaemonSet", "gpuwarden-agent")]
    pod = ds["spec"]["template"]
    assert mon["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert mon["spec"]["namespaceSelector"]["matchNames"] == [ds["metadata"]["namespace"]]
    (agent,) = [c for c in pod["spec"]["containers"] if c["name"] == "agent"]
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    env = {e["name"]: e.get("value") for e in agent["env"]}
    (endpoint,) = mon["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
    # The port the agent's own /metrics listens on, on every address of the pod.
    assert str(ports[endpoint["port"]]) == env["GPUWARDEN_AGENT_METRICS_PORT"]
    assert env["GPUWARDEN_AGENT_METRICS_HOST"] == "0.0.0.0"
    assert pod["metadata"]["labels"][mon["spec"]["jobLabel"]] == "gpuwarden-agent"
    rule = docs[("PrometheusRule", "gpuwarden")]["metadata"]["labels"]
    assert mon["metadata"]["labels"]["release"] == rule["release"]


def pod_templates() -> dict[str, dict[str, Any]]:
    return {
        f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]["spec"]
        for _, d in manifests()
        if d["kind"] in {"DaemonSet", "Deployment"}
    }


def test_every_pod_runs_under_the_runtime_default_seccomp_profile():
    pods = pod_templates()
    assert {"DaemonSet/gpuwarden-agent", "Deployment/gpuwarden-central"} <= set(pods)
    for name, pod in pods.items():
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for c in pod.get("initContainers", []) + pod["containers"]:
            # A container's own profile would override the pod's: none does.
            assert "seccompProfile" not in c.get("securityContext", {}), (name, c["name"])


def test_namespace_carries_pod_security_labels_that_admit_the_agent():
    labels = by_kind()[("Namespace", "gpuwarden")]["metadata"]["labels"]
    levels = ("privileged", "baseline", "restricted")
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] in levels, mode
        assert labels[f"pod-security.kubernetes.io/{mode}-version"] == "latest", mode
    # The agent reads the kubelet's socket through a hostPath volume as root, which the
    # baseline level refuses: enforcing baseline or restricted would keep it off every node.
    pods = pod_templates()
    assert any("hostPath" in v for v in pods["DaemonSet/gpuwarden-agent"]["volumes"])
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    # ... while the audit log and kubectl's warnings still measure against restricted.
    assert labels["pod-security.kubernetes.io/audit"] == "restricted"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"


def test_central_meets_the_restricted_pod_security_level():
    pod = pod_templates()["Deployment/gpuwarden-central"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert not any("hostPath" in v for v in pod.get("volumes", []))
    for c in pod.get("initContainers", []) + pod["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["capabilities"] == {"drop": ["ALL"]}, c["name"]


def quantity(text: str) -> float:
    """A Kubernetes quantity (``128Mi``, ``1Gi``, ``250m``, ``2``) as a number of units."""
    factors = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "m": 1e-3, "": 1}
    number, suffix = re.fullmatch(r"([0-9.]+)(Ki|Mi|Gi|m|)", text).groups()  # type: ignore[union-attr]
    return float(number) * factors[suffix]


def test_every_container_and_init_container_requests_and_caps_its_resources():
    pods = pod_templates()
    assert "migrate" in [c["name"] for c in pods["Deployment/gpuwarden-central"]["initContainers"]]
    for name, pod in pods.items():
        for c in pod.get("initContainers", []) + pod["containers"]:
            res = c.get("resources", {})
            requests, limits = res.get("requests", {}), res.get("limits", {})
            assert {"cpu", "memory"} <= set(requests), (name, c["name"])
            assert quantity(limits["memory"]) >= quantity(requests["memory"]), (name, c["name"])


def test_a_real_migrate_fits_the_init_container_s_memory_request():
    from tests.conftest import new_pg_database

    pod = pod_templates()["Deployment/gpuwarden-central"]
    (migrate,) = [c for c in pod["initContainers"] if c["name"] == "migrate"]
    assert migrate["args"] == ["migrate"]
    request = quantity(migrate["resources"]["requests"]["memory"])
    # A parent of its own, so that the peak resident size is the migrate's alone.
    measure = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True,"
        " stdout=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    with new_pg_database("gpuwarden_migrate") as url:
        done = subprocess.run(
            [sys.executable, "-c", measure, sys.executable, "-m", "service.cli", "migrate"],
            env={**os.environ, "GPUWARDEN_DATABASE_URL": url},
            capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
    peak = int(done.stdout.split()[-1]) * 1024  # Linux reports KiB
    assert 20 * 2**20 < peak < request, peak
