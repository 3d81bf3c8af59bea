"""Pods sharing a GPU on Kubernetes (time-slicing, MPS, MIG): every pod is a tenant of its GPU,
and a process goes to its own pod only where the agent can tell which one it is.

The kubelet is the fake one (real gRPC on a unix socket), the GPUs the fake NVML, the host's
/proc a directory written by the test; the agent runs as in production otherwise.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from service.collectors.agent import Agent
from service.collectors.attribution import hostname_from_environ, pod_hostname
from tests.fake_nvml import FakeGpu
from tests.kubelet_fake import node_agent, pod, write_proc

GPU = "GPU-5d3f6a2c-7b1e-4c9a-9e0f-1a2b3c4d5e6f"
GIB = 2**30


def rows(agent: Agent) -> set[tuple[str, int, str | None]]:
    """(GPU, pid, job) of every process row of one poll; pid 0 rows are holders."""
    snap = agent.poll(datetime.now(UTC))
    assert snap is not None
    return {(p.gpu_uuid.split("@")[0], p.pid, p.job_id) for p in snap.processes}


def test_two_pods_time_slicing_one_gpu_are_both_holders_and_no_process_is_guessed(
    tmp_path: Path,
):
    gpu = FakeGpu(GPU, pids=[(4001, 6 * GIB), (4002, 2 * GIB)])
    pods = [
        pod("trainer", "nvidia.com/gpu", f"{GPU}::0"),
        pod("notebook", "nvidia.com/gpu", f"{GPU}::3"),
    ]
    # No hostPID: the agent's /proc has none of these pids, so neither process has a known pod.
    with node_agent(tmp_path, [gpu], pods) as (agent, _):
        assert rows(agent) == {
            (GPU, 4001, None),
            (GPU, 4002, None),
            (GPU, 0, "k8s:ml/trainer"),
            (GPU, 0, "k8s:ml/notebook"),
        }


def test_with_the_host_proc_each_process_goes_to_the_pod_its_hostname_names(tmp_path: Path):
    proc = tmp_path / "proc"
    write_proc(proc, 4001, "trainer")
    write_proc(proc, 4002, "notebook")
    write_proc(proc, 4003, "gpuwarden-agent-x7k2p")  # a pid of another pod: no tenant's name
    gpu = FakeGpu(GPU, pids=[(4001, 6 * GIB), (4002, 2 * GIB), (4003, GIB), (4004, GIB)])
    pods = [
        pod("trainer", "nvidia.com/gpu", f"{GPU}::0"),
        pod("notebook", "nvidia.com/gpu", f"{GPU}::1"),
        pod("idle", "nvidia.com/gpu", f"{GPU}::2"),  # holds a replica, runs nothing
    ]
    with node_agent(tmp_path, [gpu], pods, proc=proc) as (agent, _):
        assert rows(agent) == {
            (GPU, 4001, "k8s:ml/trainer"),
            (GPU, 4002, "k8s:ml/notebook"),
            (GPU, 4003, None),
            (GPU, 4004, None),  # no /proc entry (ended, or another pid namespace)
            (GPU, 0, "k8s:ml/idle"),
        }


def test_a_pod_name_in_two_namespaces_on_one_gpu_names_neither(tmp_path: Path):
    proc = tmp_path / "proc"
    write_proc(proc, 4001, "worker")
    gpu = FakeGpu(GPU, pids=[(4001, GIB)])
    pods = [
        pod("worker", "nvidia.com/gpu", f"{GPU}::0", namespace="team-a"),
        pod("worker", "nvidia.com/gpu", f"{GPU}::1", namespace="team-b"),
    ]
    with node_agent(tmp_path, [gpu], pods, proc=proc) as (agent, _):
        assert rows(agent) == {
            (GPU, 4001, None),
            (GPU, 0, "k8s:team-a/worker"),
            (GPU, 0, "k8s:team-b/worker"),
        }


def test_replicas_renamed_shared_are_tenants_too(tmp_path: Path):
    # The device plugin's renameByDefault advertises time-sliced GPUs as nvidia.com/gpu.shared.
    gpu = FakeGpu(GPU, pids=[(4001, GIB)])
    pods = [
        pod("a", "nvidia.com/gpu.shared", f"{GPU}::0"),
        pod("b", "nvidia.com/gpu.shared", f"{GPU}::1"),
    ]
    with node_agent(tmp_path, [gpu], pods) as (agent, _):
        assert rows(agent) == {(GPU, 4001, None), (GPU, 0, "k8s:ml/a"), (GPU, 0, "k8s:ml/b")}


def test_one_pod_with_two_replicas_is_one_tenant_and_owns_every_process(tmp_path: Path):
    gpu = FakeGpu(GPU, pids=[(4001, GIB)])
    pods = [pod("big", "nvidia.com/gpu", f"{GPU}::0", f"{GPU}::1")]
    with node_agent(tmp_path, [gpu], pods) as (agent, _):
        assert rows(agent) == {(GPU, 4001, "k8s:ml/big")}


def mig_gpu(*, pids_a: list[tuple[int, int | None]]) -> tuple[FakeGpu, FakeGpu, FakeGpu]:
    a = FakeGpu(
        "MIG-aaaa0001-0000-0000-0000-000000000000",
        name="NVIDIA H100 80GB HBM3 MIG 3g.40gb",
        gpu_instance_id=1,
        pids=pids_a,
    )
    b = FakeGpu(
        "MIG-bbbb0002-0000-0000-0000-000000000000",
        name="NVIDIA H100 80GB HBM3 MIG 3g.40gb",
        gpu_instance_id=2,
        pids=[(5001, GIB)],
    )
    return FakeGpu("GPU-p", name="NVIDIA H100 80GB HBM3", migs=[a, b]), a, b


def test_mig_instances_each_held_by_a_pod(tmp_path: Path):
    parent, a, b = mig_gpu(pids_a=[])
    pods = [
        pod("holds-a", "nvidia.com/mig-3g.40gb", a.uuid),
        pod("runs-b", "nvidia.com/mig-3g.40gb", b.uuid),
    ]
    with node_agent(tmp_path, [parent], pods) as (agent, _):
        assert rows(agent) == {
            ("MIG-GPU-p/1/3g.40gb", 0, "k8s:ml/holds-a"),
            ("MIG-GPU-p/2/3g.40gb", 5001, "k8s:ml/runs-b"),
        }


def test_one_mig_instance_time_sliced_by_two_pods(tmp_path: Path):
    proc = tmp_path / "proc"
    write_proc(proc, 4001, "slice-user-1")
    parent, a, b = mig_gpu(pids_a=[(4001, 3 * GIB), (4002, GIB)])
    pods = [
        pod("slice-user-1", "nvidia.com/mig-3g.40gb", f"{a.uuid}::0"),
        pod("slice-user-2", "nvidia.com/mig-3g.40gb", f"{a.uuid}::1"),
        pod("runs-b", "nvidia.com/mig-3g.40gb", b.uuid),
    ]
    with node_agent(tmp_path, [parent], pods, proc=proc) as (agent, _):
        assert rows(agent) == {
            ("MIG-GPU-p/1/3g.40gb", 4001, "k8s:ml/slice-user-1"),
            ("MIG-GPU-p/1/3g.40gb", 4002, None),  # its pod cannot be read: not guessed
            ("MIG-GPU-p/1/3g.40gb", 0, "k8s:ml/slice-user-2"),
            ("MIG-GPU-p/2/3g.40gb", 5001, "k8s:ml/runs-b"),
        }


def test_holders_follow_the_kubelet_as_pods_come_and_go(tmp_path: Path):
    gpu = FakeGpu(GPU, pids=[(4001, GIB)])
    first = [pod("a", "nvidia.com/gpu", f"{GPU}::0")]
    with node_agent(tmp_path, [gpu], first) as (agent, kubelet):
        assert rows(agent) == {(GPU, 4001, "k8s:ml/a")}
        kubelet.pods = [*first, pod("b", "nvidia.com/gpu", f"{GPU}::1")]  # b is scheduled
        assert rows(agent) == {(GPU, 4001, None), (GPU, 0, "k8s:ml/a"), (GPU, 0, "k8s:ml/b")}
        kubelet.pods = first[:0]  # both ended: the GPU has no holder
        assert rows(agent) == {(GPU, 4001, None)}


def test_hostname_reading_and_the_kubelets_63_character_cut():
    assert hostname_from_environ(b"A=1\0HOSTNAME=trainer-0\0B=2\0") == "trainer-0"
    assert hostname_from_environ(b"A=1\0") is None
    long = "x" * 60 + "-ab-cdef"
    assert pod_hostname(long) == "x" * 60 + "-ab"
    assert pod_hostname("x" * 62 + "-y") == "x" * 62  # no trailing dash
    assert pod_hostname("short") == "short"


def test_a_reused_pid_is_read_afresh(tmp_path: Path):
    proc = tmp_path / "proc"
    write_proc(proc, 4001, "trainer")
    gpu = FakeGpu(GPU, pids=[(4001, GIB)])
    pods = [pod("trainer", "nvidia.com/gpu", f"{GPU}::0"), pod("nb", "nvidia.com/gpu", f"{GPU}::1")]
    with node_agent(tmp_path, [gpu], pods, proc=proc) as (agent, _):
        assert (GPU, 4001, "k8s:ml/trainer") in rows(agent)
        gpu.pids = []  # the trainer's process ends; the pid comes back in the notebook's pod
        assert rows(agent) == {(GPU, 0, "k8s:ml/trainer"), (GPU, 0, "k8s:ml/nb")}
        (proc / "4001" / "environ").write_bytes(b"HOSTNAME=nb\0")
        gpu.pids = [(4001, GIB)]
        assert rows(agent) == {(GPU, 4001, "k8s:ml/nb"), (GPU, 0, "k8s:ml/trainer")}
