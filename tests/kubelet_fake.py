"""A stand-in for the kubelet's pod-resources gRPC socket (the one Kubernetes part we fake), and
an NVML agent on a node served by it.

It serves ``/v1.PodResourcesLister/List`` on a unix socket with real grpcio, answering with a
ListPodResourcesResponse built and serialised by the protobuf code generated from the kubelet's
own api.proto (service/collectors/kubelet/podresources_pb2.py), so the bytes are what a kubelet
sends, device-plugin devices and DRA claims alike.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from service.collectors.agent import Agent, AgentConfig
from service.collectors.attribution import JobAttributor
from service.collectors.kubelet import podresources_pb2 as pb
from service.collectors.kubelet.podresources import PodResourcesClient
from service.collectors.mig import MigIdentities
from service.collectors.nvml import NvmlBackend
from service.collectors.shipper import Shipper
from service.collectors.spool import Spool
from tests.fake_nvml import FakeGpu, FakeNvml


@dataclass
class FakeClaim:
    """One device of a DRA ResourceClaim allocated to a container (one ClaimResource)."""

    device_name: str  # "gpu-0": the NVIDIA DRA driver names a GPU by its minor number
    driver_name: str = "gpu.nvidia.com"
    pool_name: str = "n"
    claim_name: str = "gpu-claim"
    cdi_devices: list[str] = field(default_factory=list)


@dataclass
class FakeContainer:
    name: str
    devices: dict[str, list[str]] = field(default_factory=dict)  # resource name -> device ids
    cpu_ids: list[int] = field(default_factory=list)  # encoded, so the decoder must skip them
    claims: list[FakeClaim] = field(default_factory=list)  # DRA: dynamic_resources


@dataclass
class FakePod:
    namespace: str
    name: str
    containers: list[FakeContainer]


def _container(c: FakeContainer, namespace: str) -> pb.ContainerResources:
    out = pb.ContainerResources(name=c.name, cpu_ids=c.cpu_ids)
    for resource, ids in c.devices.items():
        out.devices.add(resource_name=resource, device_ids=ids)
    for claim in c.claims:
        dyn = out.dynamic_resources.add(claim_name=claim.claim_name, claim_namespace=namespace)
        res = dyn.claim_resources.add(
            driver_name=claim.driver_name, pool_name=claim.pool_name, device_name=claim.device_name
        )
        for name in claim.cdi_devices:
            res.cdi_devices.add(name=name)
    return out


def encode_list_response(pods: list[FakePod]) -> bytes:
    """A ListPodResourcesResponse as the kubelet would send it (generated protobuf code)."""
    response = pb.ListPodResourcesResponse()
    for p in pods:
        response.pod_resources.add(
            name=p.name,
            namespace=p.namespace,
            containers=[_container(c, p.namespace) for c in p.containers],
        )
    raw: bytes = response.SerializeToString()
    return raw


class FakeKubelet:
    """The pods the fake kubelet reports; change ``pods`` while it runs."""

    def __init__(self, pods: list[FakePod]) -> None:
        self.pods = pods
        self.calls = 0
        self.fail = False

    def list(self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext) -> bytes:
        self.calls += 1
        if self.fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet restarting")
        return encode_list_response(self.pods)


@contextmanager
def fake_kubelet(socket_path: Path, pods: list[FakePod]) -> Iterator[FakeKubelet]:
    """Serve pod-resources List on ``socket_path`` until the block ends."""
    kubelet = FakeKubelet(pods)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister",
        {
            "List": grpc.unary_unary_rpc_method_handler(
                kubelet.list, request_deserializer=pb.ListPodResourcesRequest.FromString
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    try:
        yield kubelet
    finally:
        server.stop(grace=None).wait(5)


def pod(name: str, resource: str, *device_ids: str, namespace: str = "ml") -> FakePod:
    """A pod of one container holding ``device_ids`` of ``resource``."""
    return FakePod(namespace, name, [FakeContainer("main", {resource: list(device_ids)})])


def write_proc(root: Path, pid: int, hostname: str) -> None:
    """A host /proc entry as the agent sees it with hostPID: the process's environment."""
    (root / str(pid)).mkdir(parents=True)
    env = [b"PATH=/usr/bin", f"HOSTNAME={hostname}".encode(), b"NVIDIA_VISIBLE_DEVICES=all"]
    (root / str(pid) / "environ").write_bytes(b"\0".join(env) + b"\0")


@contextmanager
def node_agent(
    state: Path,
    gpus: list[FakeGpu],
    pods: list[FakePod],
    *,
    proc: Path | None = None,
    hostname: str = "n",
) -> Iterator[tuple[Agent, FakeKubelet]]:
    """An NVML agent (the fake NVML's ``gpus``) on a node whose kubelet lists ``pods`` (change
    them on the kubelet); ``proc`` is the host's /proc it reads, none by default (no hostPID)."""
    # A unix socket path must stay under ~100 bytes; pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="kl") as short:
        sock = Path(short) / "kubelet.sock"
        with fake_kubelet(sock, pods) as kubelet:
            agent = Agent(
                config=AgentConfig(hostname=hostname, labels={}, dead_letter_path=state / "dl"),
                backend=NvmlBackend(lib=FakeNvml(gpus), mig=MigIdentities()),
                shipper=Shipper(central_url="http://127.0.0.1:9", token="t"),
                spool=Spool(state / "spool.sqlite"),
                attributor=JobAttributor(
                    proc_root=proc or state / "no-host-proc", pods=PodResourcesClient(sock)
                ),
            )
            try:
                yield agent, kubelet
            finally:
                agent.close()
