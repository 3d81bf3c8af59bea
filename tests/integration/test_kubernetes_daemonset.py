"""The agent DaemonSet, run as written: its command line and environment parsed from the manifest.

Only what a cluster provides is put in: the downward API's node name, the volumes (host paths
become temporary directories, the token Secret a file named after the node), the Service DNS name
of central (a real central on loopback) and a free metrics port. The GPU is the fake NVML, loaded
in place of pynvml; the kubelet's pod-resources socket is the fake kubelet.
"""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import Engine, func, select

from service.api.app import create_app
from service.clock import utc_now
from service.db.schema import gpus, jobs, samples
from service.settings import Settings
from tests.conftest import make_token
from tests.integration.cost_data import roll_up
from tests.k8s_support import apply_component, component, daemonset
from tests.kubelet_fake import FakeContainer, FakePod, fake_kubelet
from tests.support import free_port, iso, live_server

REPO = Path(__file__).resolve().parents[2]
DAEMONSET = REPO / "deploy" / "kubernetes" / "agent-daemonset.yaml"
DATA = REPO / "tests" / "data" / "dcgm-exporter"
NODE = "gpu-node-7"
GPU_UUID = "GPU-5d3f6a2c-7b1e-4c9a-9e0f-1a2b3c4d5e6f"

# Loaded instead of pynvml (first on PYTHONPATH): one H200 with a process on it.
FAKE_PYNVML = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
from tests.fake_nvml import FakeGpu, FakeNvml

_nvml = FakeNvml([FakeGpu({GPU_UUID!r}, pids=[(31337, 3 * 1024**3)])])


def __getattr__(name):
    return getattr(_nvml, name)
"""


def agent_container() -> tuple[dict[str, Any], dict[str, Any]]:
    ds = yaml.safe_load(DAEMONSET.read_text())
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def remount(text: str, mounts: dict[str, Path]) -> str:
    """``text`` with each volume's mount path replaced by its local directory."""
    for mount_path, local in mounts.items():
        text = text.replace(mount_path + "/", f"{local}/")
        if text == mount_path:
            text = str(local)
    return text


def pod_command(container: dict[str, Any], *, mounts: dict[str, Path]) -> list[str]:
    """The container's command and args, with mount paths moved to ``mounts``."""
    return [remount(a, mounts) for a in [*container["command"], *container["args"]]]


def pod_environment(container: dict[str, Any], *, mounts: dict[str, Path]) -> dict[str, str]:
    """The container's env as the kubelet would set it, with mount paths moved to ``mounts``."""
    env: dict[str, str] = {}
    for item in container["env"]:
        if "valueFrom" in item:
            field = item["valueFrom"]["fieldRef"]["fieldPath"]
            assert field == "spec.nodeName", field  # the only downward-API field this fakes
            env[item["name"]] = NODE
        else:
            env[item["name"]] = str(item["value"])
    return {name: remount(value, mounts) for name, value in env.items()}


@pytest.fixture
def central(engine: Engine) -> Iterator[str]:
    settings = Settings(
        database_url=str(engine.url.render_as_string(hide_password=False)), run_scheduler=False
    )
    with live_server(create_app(settings, engine=engine)) as url:
        yield url


def test_daemonset_as_written_delivers_samples_and_pod_jobs(
    engine: Engine, central: str, tmp_path: Path
):
    pod, container = agent_container()
    assert "hostPID" not in pod  # attribution comes from the kubelet, not the host's /proc
    mounts = {m["mountPath"]: tmp_path / m["name"] for m in container["volumeMounts"]}
    for local in mounts.values():
        local.mkdir()
    # The token Secret, mounted as one file per node name.
    volumes = {v["name"]: v for v in pod["volumes"]}
    token_mount = next(
        m["mountPath"] for m in container["volumeMounts"] if "secret" in volumes[m["name"]]
    )
    (mounts[token_mount] / NODE).write_text(make_token(engine, "agent", NODE))

    env = pod_environment(container, mounts=mounts)
    # What the cluster would resolve: the central Service, a free port for the metrics port.
    env["GPUWARDEN_CENTRAL_URL"] = central
    metrics_port = free_port()
    assert env["GPUWARDEN_AGENT_METRICS_PORT"] == str(
        next(p["containerPort"] for p in container["ports"] if p["name"] == "metrics")
    )
    env["GPUWARDEN_AGENT_METRICS_PORT"] = str(metrics_port)
    env["GPUWARDEN_INTERVAL_SECONDS"] = "0.5"  # the default 10 s, sped up for the test
    env["GPUWARDEN_AGENT_BATCH_SECONDS"] = "0"
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "pynvml.py").write_text(FAKE_PYNVML)
    env["PYTHONPATH"] = str(shim)
    # `gpuwarden` on PATH, as in the image; nothing else from this process's environment.
    env["PATH"] = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    env["HOME"] = str(tmp_path)

    socket_env = env["GPUWARDEN_POD_RESOURCES_SOCKET"]
    kubelet_pods = [
        FakePod("ml", "trainer-0", [FakeContainer("main", {"nvidia.com/gpu": [GPU_UUID]})])
    ]
    argv = pod_command(container, mounts=mounts)
    state_dir = Path(env["GPUWARDEN_STATE_DIR"])
    with fake_kubelet(Path(socket_env), kubelet_pods):
        proc = subprocess.Popen(
            argv, env=env, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            stored = 0
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                with engine.connect() as conn:
                    stored = conn.execute(
                        select(func.count())
                        .select_from(samples.join(gpus, samples.c.gpu_id == gpus.c.id))
                        .where(gpus.c.uuid == GPU_UUID)
                    ).scalar_one()
                if stored >= 3:
                    break
                time.sleep(0.2)
            assert proc.poll() is None, proc.communicate()[0]
            # The probes' path and port answer as the kubelet would ask them.
            probe = container["livenessProbe"]["httpGet"]
            assert probe["port"] == "metrics"
            r = httpx.get(f"http://127.0.0.1:{metrics_port}{probe['path']}", timeout=5)
            assert r.status_code == 200, r.text
            metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
            assert "gpuwarden_agent_batches_sent_total" in metrics
        finally:
            proc.terminate()
            out, _ = proc.communicate(timeout=20)
    assert stored >= 3, out
    assert f"agent for node {NODE}" in out, out
    with engine.connect() as conn:
        node_jobs = conn.execute(select(jobs.c.id)).scalars().all()
    assert "k8s:ml/trainer-0" in node_jobs, out
    # State lives in the mounted volume; nothing was written anywhere else.
    assert (state_dir / "spool.sqlite").exists()
    assert not (tmp_path / "gpuwarden-data").exists()


def test_daemonset_on_a_node_without_gpu_fails_clearly(engine: Engine, tmp_path: Path):
    _, container = agent_container()
    mounts = {m["mountPath"]: tmp_path / m["name"] for m in container["volumeMounts"]}
    for local in mounts.values():
        local.mkdir()
    token_dir = next(p for m, p in mounts.items() if m.startswith("/etc/gpuwarden"))
    (token_dir / NODE).write_text("gw_agent_token")
    env = pod_environment(container, mounts=mounts)
    env["PATH"] = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    shim = tmp_path / "shim"
    shim.mkdir()
    # NVML that does not load, as on a node where the runtime hides the driver.
    (shim / "pynvml.py").write_text("raise ImportError('libnvidia-ml.so.1: not found')\n")
    env["PYTHONPATH"] = str(shim)
    argv = pod_command(container, mounts=mounts)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "no NVIDIA GPU found" in proc.stderr and "--backend simulated" in proc.stderr
    assert "simulated fleet" not in proc.stdout


def test_the_shell_in_the_command_exists():
    _, container = agent_container()
    assert shutil.which(container["command"][0]) or os.path.exists(container["command"][0])


class CapturedExporter:
    """Serves a real dcgm-exporter capture on loopback, as the node's exporter would."""

    def __init__(self, text: str) -> None:
        self.text = text
        body = text.encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_daemonset_with_the_dcgm_exporter_component_delivers_mig_instances_and_their_cost(
    engine: Engine, central: str, tmp_path: Path
):
    ds = apply_component(daemonset(), component("dcgm-exporter-backend"))
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    mounts = {m["mountPath"]: tmp_path / m["name"] for m in container["volumeMounts"]}
    for local in mounts.values():
        local.mkdir()
    node = "gsrh100-074"  # the capture's node
    (mounts["/etc/gpuwarden/tokens"] / node).write_text(make_token(engine, "agent", node))
    env = pod_environment(container, mounts=mounts) | {"NODE_NAME": node}
    exporter = CapturedExporter((DATA / "h100-mig-kserve.prom").read_text())
    assert env["GPUWARDEN_DCGM_EXPORTER_URL"].startswith("http://nvidia-dcgm-exporter.")
    # What the cluster resolves: the central Service, the node's exporter, a free metrics port.
    env |= {
        "GPUWARDEN_CENTRAL_URL": central,
        "GPUWARDEN_DCGM_EXPORTER_URL": exporter.url,
        "GPUWARDEN_AGENT_METRICS_PORT": str(free_port()),
        "GPUWARDEN_INTERVAL_SECONDS": "0.5",
        "GPUWARDEN_AGENT_BATCH_SECONDS": "0",
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
    }
    httpx.put(
        f"{central}/api/v1/prices",
        json=[
            {
                "model_pattern": "*H100*",
                "usd_per_gpu_hour": 7.0,
                "effective_from": "2026-01-01T00:00:00Z",
            }
        ],
        headers={"Authorization": f"Bearer {make_token(engine, 'admin')}"},
    ).raise_for_status()
    start = utc_now()
    proc = subprocess.Popen(
        pod_command(container, mounts=mounts),
        env=env,
        cwd="/",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        stored = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and stored < 9:
            with engine.connect() as conn:
                stored = conn.execute(select(func.count()).select_from(samples)).scalar_one()
            time.sleep(0.2)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
        exporter.close()
    assert stored >= 9, out
    with engine.connect() as conn:
        rows = conn.execute(select(gpus.c.uuid, gpus.c.mig_parent_uuid, gpus.c.model)).all()
    parent = "GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"
    assert {(r.mig_parent_uuid, r.model) for r in rows} == {
        (parent, "NVIDIA H100 80GB HBM3 MIG 1g.10gb")
    }
    assert sorted(r.uuid.split("@")[0] for r in rows) == [
        f"MIG-{parent}/{gi}/1g.10gb" for gi in (7, 8, 9)
    ]
    assert (mounts["/var/lib/gpuwarden-agent"] / "mig-instances.json").exists()
    # The pods the exporter named hold their instances: activity from GR_ENGINE_ACTIVE (0.0,
    # idle, not "no data"), priced as 1/7 of the H100.
    roll_up(engine)
    reader = {"Authorization": f"Bearer {make_token(engine, 'reader')}"}
    params = {
        "start": iso(start - timedelta(seconds=5)),
        "end": iso(utc_now()),
        "group_by": "job",
    }
    rep = httpx.get(f"{central}/api/v1/reports/cost", params=params, headers=reader).json()
    rows_by_job = {r["key"]: r for r in rep["rows"]}
    job = "k8s:model-playground-stg/tts-predictor-00011-deployment-5554f75554-8j8pl"
    row = rows_by_job[job]
    assert row["allocated_seconds"] > 0  # covered by samples: not "no data"
    assert row["idle_seconds"] == pytest.approx(row["allocated_seconds"])
    assert row["cost_usd"] == pytest.approx(7.0 / 7 * row["allocated_seconds"] / 3600)
