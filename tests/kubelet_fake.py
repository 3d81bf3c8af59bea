"""A stand-in for the kubelet's pod-resources gRPC socket (the one Kubernetes part we fake), and
an NVML agent on a node served by it.

It serves ``/v1.PodResourcesLister/List`` on a unix socket with real grpcio, answering with a
ListPodResourcesResponse encoded here field by field (podresources.proto's numbers), so the
agent's client and decoder run exactly as against a kubelet.
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
from service.collectors.kubelet.podresources import PodResourcesClient
from service.collectors.mig import MigIdentities
from service.collectors.nvml import NvmlBackend
from service.collectors.shipper import Shipper
from service.collectors.spool import Spool
from tests.fake_nvml import FakeGpu, FakeNvml


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


@dataclass
class FakeContainer:
    name: str
    devices: dict[str, list[str]] = field(default_factory=dict)  # resource name -> device ids
    cpu_ids: list[int] = field(default_factory=list)  # encoded, so the decoder must skip them


@dataclass
class FakePod:
    namespace: str
    name: str
    containers: list[FakeContainer]


def encode_list_response(pods: list[FakePod]) -> bytes:
    """A ListPodResourcesResponse as the kubelet would send it."""
    out = b""
    for pod in pods:
        body = _field(1, pod.name.encode()) + _field(2, pod.namespace.encode())
        for c in pod.containers:
            cbody = _field(1, c.name.encode())
            for resource, ids in c.devices.items():
                dev = _field(1, resource.encode()) + b"".join(_field(2, i.encode()) for i in ids)
                cbody += _field(2, dev)
            if c.cpu_ids:  # packed repeated int64, field 3
                cbody += _field(3, b"".join(_varint(i) for i in c.cpu_ids))
            body += _field(3, cbody)
        out += _field(1, body)
    return out


class FakeKubelet:
    """The pods the fake kubelet reports; change ``pods`` while it runs."""

    def __init__(self, pods: list[FakePod]) -> None:
        self.pods = pods
        self.calls = 0
        self.fail = False

    def list(self, request: bytes, context: grpc.ServicerContext) -> bytes:
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
        {"List": grpc.unary_unary_rpc_method_handler(kubelet.list)},  # raw bytes both ways
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
