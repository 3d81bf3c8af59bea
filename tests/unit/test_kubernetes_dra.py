"""GPUs allocated through Kubernetes dynamic resource allocation (the NVIDIA DRA driver).

The kubelet lists a DRA allocation under a container's ``dynamic_resources``: driver
``gpu.nvidia.com`` and the device's name in the driver's ResourceSlice, ``gpu-<minor>`` (the
GPU's device minor number, /dev/nvidia<minor>, which need not be NVML's index). The fake kubelet
serialises its answer with the protobuf code generated from the kubelet's api.proto; the agent
must give each such GPU its pod, and a pod of another driver no GPU.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from service.collectors.agent import Agent
from service.collectors.kubelet.podresources import PodDevice, decode_list_response
from tests.fake_nvml import FakeGpu
from tests.kubelet_fake import FakeClaim, FakeContainer, FakePod, encode_list_response, node_agent

GPU_A = "GPU-aaaa0000-0000-4000-8000-000000000001"
GPU_B = "GPU-bbbb0000-0000-4000-8000-000000000002"
GIB = 2**30


def rows(agent: Agent) -> set[tuple[str, int, str | None]]:
    snap = agent.poll(datetime.now(UTC))
    assert snap is not None
    return {(p.gpu_uuid, p.pid, p.job_id) for p in snap.processes}


def dra_pod(name: str, *claims: FakeClaim) -> FakePod:
    return FakePod("ml", name, [FakeContainer("main", claims=list(claims))])


def test_a_dra_claim_is_read_from_the_kubelets_answer() -> None:
    raw = encode_list_response(
        [
            dra_pod("infer-0", FakeClaim("gpu-3", cdi_devices=["k8s.gpu.nvidia.com/device=gpu-3"])),
            dra_pod("nic", FakeClaim("eth1", driver_name="sriov.example.com")),
        ]
    )
    assert decode_list_response(raw) == [
        PodDevice("ml", "infer-0", "main", "gpu.nvidia.com", "gpu-3", dra=True),
    ]


def test_gpus_allocated_by_dra_get_their_pod_by_minor_number(tmp_path: Path) -> None:
    # NVML index 0 is minor 3, index 1 is minor 1: the claim names minors.
    a = FakeGpu(GPU_A, minor=3, pids=[(4242, 3 * GIB)])
    b = FakeGpu(GPU_B, minor=1)
    pods = [dra_pod("infer-0", FakeClaim("gpu-3")), dra_pod("notebook", FakeClaim("gpu-1"))]
    with node_agent(tmp_path, [a, b], pods) as (agent, _):
        assert rows(agent) == {
            (GPU_A, 4242, "k8s:ml/infer-0"),
            (GPU_B, 0, "k8s:ml/notebook"),  # held, running nothing: still its pod's
        }


def test_a_claim_of_another_driver_or_an_unknown_device_gives_no_pod(tmp_path: Path) -> None:
    a = FakeGpu(GPU_A, minor=0, pids=[(4242, 3 * GIB)])
    pods = [
        dra_pod("other", FakeClaim("gpu-0", driver_name="gpu.example.com")),
        dra_pod("gone", FakeClaim("gpu-7")),  # no GPU of this node has minor 7
    ]
    with node_agent(tmp_path, [a], pods) as (agent, _):
        assert rows(agent) == {(GPU_A, 4242, None)}
