"""The agent's Kubernetes parts: node name, state directory, /healthz and pod attribution."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.collectors.attribution import JobAttributor
from service.collectors.kubelet.podresources import (
    PodDevice,
    PodResourcesError,
    decode_list_response,
)
from service.collectors.runner import agent_state, build_agent, node_name, serve_metrics
from service.collectors.simulated import SimulatedBackend
from service.collectors.state_dir import state_paths
from service.collectors.telemetry import AgentTelemetry
from service.settings import Settings
from tests.kubelet_fake import FakeContainer, FakePod, encode_list_response
from tests.support import free_port


def test_node_name_comes_from_the_downward_api_as_for_dcgm_exporter(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.delenv("GPUWARDEN_NODE_NAME", raising=False)
    monkeypatch.setenv("NODE_NAME", "gpu-node-3")
    assert node_name(Settings()) == "gpu-node-3"
    monkeypatch.setenv("GPUWARDEN_NODE_NAME", "override")
    assert node_name(Settings()) == "override"
    assert node_name(Settings(node_name="flag")) == "flag"  # --node-name wins


@pytest.mark.parametrize(
    "env,expected,source",
    [
        (
            {"STATE_DIRECTORY": "/var/lib/gpuwarden-agent"},
            "/var/lib/gpuwarden-agent",
            "STATE_DIRECTORY",
        ),
        ({"STATE_DIRECTORY": "/var/lib/a:/var/lib/b"}, "/var/lib/a", "STATE_DIRECTORY"),
        (
            {"XDG_STATE_HOME": "/home/u/.local/state"},
            "/home/u/.local/state/gpuwarden",
            "XDG_STATE_HOME",
        ),
        ({"STATE_DIRECTORY": "/s", "XDG_STATE_HOME": "/x"}, "/s", "STATE_DIRECTORY"),
        ({}, "gpuwarden-data", "default"),
    ],
)
def test_state_directory_order(env: dict[str, str], expected: str, source: str):
    paths = state_paths(state_dir=None, env=env)
    assert paths.directory == Path(expected)
    assert paths.spool == Path(expected) / "spool.sqlite"
    assert paths.dead_letter == Path(expected) / "dead-letter.jsonl"
    assert paths.source == source


def test_explicit_state_dir_and_files_win():
    env = {"STATE_DIRECTORY": "/s"}
    assert state_paths(state_dir=Path("/pod/vol"), env=env).spool == Path("/pod/vol/spool.sqlite")
    p = state_paths(state_dir=None, env=env, dead_letter_path=Path("/tmp/dl.jsonl"))
    assert p.dead_letter == Path("/tmp/dl.jsonl") and p.spool == Path("/s/spool.sqlite")
    assert state_paths(state_dir=None, env={}, suffix="n1").spool.name == "spool-n1.sqlite"


def test_agent_writes_its_state_under_state_directory_even_from_cwd_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # systemd: cwd "/", read-only everywhere but StateDirectory.
    monkeypatch.chdir("/")
    settings = Settings(central_url="http://127.0.0.1:9", agent_token="t")
    state = agent_state(settings, env={"STATE_DIRECTORY": str(tmp_path / "state")})
    agent = build_agent(
        settings,
        backend=SimulatedBackend(hostname="n", gpus=1, start=datetime.now(UTC)),
        hostname="n",
        state=state,
    )
    try:
        assert agent.config.dead_letter_path == tmp_path / "state" / "dead-letter.jsonl"
        assert (tmp_path / "state" / "spool.sqlite").exists()
    finally:
        agent.close()


def test_healthz_fails_once_the_loop_stops_cycling():
    telemetry = AgentTelemetry()
    port = free_port()
    server = serve_metrics(telemetry, host="127.0.0.1", port=port, stale_after_seconds=60)
    try:
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(url + "/healthz").status_code == 200  # just started
        telemetry.cycle_done()
        assert httpx.get(url + "/healthz").status_code == 200
        assert "gpuwarden_agent_last_cycle_timestamp_seconds" in httpx.get(url + "/metrics").text
        telemetry.cycle_done(now=telemetry.last_cycle_at - 120)  # type: ignore[operator]
        assert httpx.get(url + "/healthz").status_code == 503
    finally:
        server.shutdown()
        server.server_close()


def test_list_response_is_decoded_to_gpu_devices_only():
    raw = encode_list_response(
        [
            FakePod(
                "ml",
                "trainer-0",
                [
                    FakeContainer(
                        "main",
                        {"nvidia.com/gpu": ["GPU-a", "GPU-b"], "example.com/nic": ["eth1"]},
                        cpu_ids=[2, 3, 300],
                    ),
                    FakeContainer("sidecar"),
                ],
            ),
            FakePod("ml", "slice", [FakeContainer("c", {"nvidia.com/mig-1g.10gb": ["MIG-x"]})]),
        ]
    )
    assert decode_list_response(raw) == [
        PodDevice("ml", "trainer-0", "main", "nvidia.com/gpu", "GPU-a"),
        PodDevice("ml", "trainer-0", "main", "nvidia.com/gpu", "GPU-b"),
        PodDevice("ml", "slice", "c", "nvidia.com/mig-1g.10gb", "MIG-x"),
    ]
    with pytest.raises(PodResourcesError):
        decode_list_response(raw[:-3])


class StubPods:
    """The pod-resources client's two calls, scripted."""

    def __init__(self, devices: list[PodDevice]) -> None:
        self.devices = devices
        self.fail = False

    def available(self) -> bool:
        return True

    def list(self) -> list[PodDevice]:
        if self.fail:
            raise PodResourcesError("kubelet restarting")
        return self.devices


def test_pods_win_over_proc_and_unallocated_gpus_get_no_job(tmp_path: Path):
    # /proc says Slurm (a pid from another namespace would say anything): ignored on Kubernetes.
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text("0::/slurm/uid_1/job_7/step_0\n")
    pods: Any = StubPods(
        [
            PodDevice("ml", "trainer-0", "main", "nvidia.com/gpu", "GPU-a"),
            PodDevice("ml", "shared", "c", "nvidia.com/gpu", "GPU-b::3"),  # time-slicing replica
            PodDevice("ml", "by-index", "c", "nvidia.com/gpu", "2"),  # DEVICE_ID_STRATEGY=index
        ]
    )
    a = JobAttributor(proc_root=tmp_path, pods=pods)
    assert a.attribute(42, 0, "GPU-a").job_id == "slurm:7"  # before the first List: /proc
    a.refresh()
    assert a.attribute(42, 0, "GPU-a").job_id == "k8s:ml/trainer-0"
    assert a.attribute(42, 1, "GPU-b").job_id == "k8s:ml/shared"
    assert a.attribute(42, 2, "GPU-c").job_id == "k8s:ml/by-index"
    assert a.attribute(42, 5, "GPU-z").job_id is None
    assert a.reports_held_gpus and a.device_jobs("GPU-a", 0) == ["k8s:ml/trainer-0"]
    pods.fail = True  # the kubelet restarts: the last allocations stay
    a.refresh()
    assert a.device_jobs("GPU-a", 0) == ["k8s:ml/trainer-0"]


def test_mig_instances_are_attributed_by_the_kubelets_mig_uuid(tmp_path: Path):
    from service.collectors.agent import Agent, AgentConfig
    from service.collectors.mig import MigIdentities
    from service.collectors.nvml import NvmlBackend
    from service.collectors.shipper import Shipper
    from service.collectors.spool import Spool
    from tests.fake_nvml import FakeGpu, FakeNvml

    slice_a = FakeGpu(
        "MIG-aaaa0001-0000-0000-0000-000000000000",
        name="NVIDIA H100 80GB HBM3 MIG 1g.10gb",
        gpu_instance_id=7,
        pids=[(4242, 2**30)],
    )
    slice_b = FakeGpu(
        "MIG-bbbb0002-0000-0000-0000-000000000000",
        name="NVIDIA H100 80GB HBM3 MIG 1g.10gb",
        gpu_instance_id=8,
    )
    parent = FakeGpu("GPU-p", name="NVIDIA H100 80GB HBM3", migs=[slice_a, slice_b])
    pods: Any = StubPods(
        [
            PodDevice("ml", "runs-a", "c", "nvidia.com/mig-1g.10gb", slice_a.uuid),
            PodDevice("ml", "holds-b", "c", "nvidia.com/mig-1g.10gb", slice_b.uuid),
        ]
    )
    agent = Agent(
        config=AgentConfig(hostname="n", labels={}, dead_letter_path=tmp_path / "dl"),
        backend=NvmlBackend(lib=FakeNvml([parent]), mig=MigIdentities()),
        shipper=Shipper(central_url="http://127.0.0.1:9", token="t"),
        spool=Spool(tmp_path / "spool.sqlite"),
        attributor=JobAttributor(proc_root=tmp_path, pods=pods),
    )
    try:
        snap = agent.poll(datetime.now(UTC))
        assert snap is not None
        jobs = {(p.gpu_uuid.split("@")[0], p.pid, p.job_id) for p in snap.processes}
        assert jobs == {
            ("MIG-GPU-p/7/1g.10gb", 4242, "k8s:ml/runs-a"),
            ("MIG-GPU-p/8/1g.10gb", 0, "k8s:ml/holds-b"),  # held, running nothing: still its job
        }
    finally:
        agent.close()
