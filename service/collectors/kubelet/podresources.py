"""Read the kubelet pod-resources socket: GPU device id -> namespace, pod and container.

This is how dcgm-exporter attributes GPUs to pods, and it needs neither ``hostPID`` nor the
Kubernetes API: the kubelet answers ``List`` on a unix socket with every container's allocated
devices, those of device plugins (``devices``) and those of dynamic resource allocation
(``dynamic_resources``). The messages are decoded by the protobuf code generated from the
kubelet's own api.proto (podresources.proto and podresources_pb2.py beside this file); protobuf
and grpcio are imported when the socket is first used.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
# The gRPC method the client calls; podresources_pb2's service descriptor names the same.
LIST_METHOD = "/v1.PodResourcesLister/List"
# nvidia.com/gpu, and nvidia.com/mig-1g.10gb and friends under the "mixed" MIG strategy.
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
# DRA drivers whose devices are GPUs: NVIDIA's (k8s-dra-driver-gpu), which names a whole GPU
# gpu-<minor> in its ResourceSlices.
DRA_GPU_DRIVERS = ("gpu.nvidia.com",)


class PodResourcesError(Exception):
    """The kubelet socket could not be read or answered something unreadable."""


@dataclass(frozen=True, slots=True)
class PodDevice:
    """One device allocated to one container of one pod.

    A device plugin's device: ``resource`` is the resource name (nvidia.com/gpu) and
    ``device_id`` the plugin's id (a GPU or MIG UUID, or an index). A DRA device (``dra``):
    ``resource`` is the driver (gpu.nvidia.com) and ``device_id`` the device's name in the
    driver's ResourceSlice (gpu-<minor>).
    """

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str
    dra: bool = False

    @property
    def job_id(self) -> str:
        """The job id GPU Warden gives a pod: ``k8s:<namespace>/<pod>``."""
        return f"k8s:{self.namespace}/{self.pod}"


def decode_list_response(data: bytes) -> list[PodDevice]:
    """Every (pod, container, GPU device) of a ListPodResourcesResponse, DRA claims included."""
    from google.protobuf.message import DecodeError

    from service.collectors.kubelet import podresources_pb2 as pb

    try:
        response = pb.ListPodResourcesResponse.FromString(data)
    except DecodeError as exc:
        raise PodResourcesError(f"unreadable pod-resources List answer: {exc}") from exc
    out: list[PodDevice] = []
    for pod in response.pod_resources:
        for c in pod.containers:
            for dev in c.devices:
                if dev.resource_name.startswith(GPU_RESOURCE_PREFIXES):
                    out += [
                        PodDevice(pod.namespace, pod.name, c.name, dev.resource_name, i)
                        for i in dev.device_ids
                    ]
            for claim in c.dynamic_resources:
                out += [
                    PodDevice(pod.namespace, pod.name, c.name, r.driver_name, r.device_name, True)
                    for r in claim.claim_resources
                    if r.driver_name in DRA_GPU_DRIVERS and r.device_name
                ]
    return out


class PodResourcesClient:
    """Calls ``List`` on the kubelet's pod-resources socket (grpcio, loaded on first use)."""

    def __init__(self, socket_path: Path = DEFAULT_SOCKET, *, timeout_seconds: float = 2.0):
        self.socket_path = socket_path
        self.timeout_seconds = timeout_seconds
        self._channel: Any = None
        self._call: Any = None

    def available(self) -> bool:
        """Whether the socket exists (the agent runs on a Kubernetes node with it mounted)."""
        return self.socket_path.is_socket()

    def list(self) -> list[PodDevice]:
        """The GPU devices allocated to pods now; raises PodResourcesError when unreadable."""
        import grpc

        from service.collectors.kubelet import podresources_pb2 as pb

        if self._call is None:
            self._channel = grpc.insecure_channel(f"unix://{self.socket_path}")
            self._call = self._channel.unary_unary(
                LIST_METHOD,
                request_serializer=pb.ListPodResourcesRequest.SerializeToString,
                response_deserializer=lambda raw: raw,  # decoded below, errors ours
            )
        try:
            raw = self._call(pb.ListPodResourcesRequest(), timeout=self.timeout_seconds)
        except grpc.RpcError as exc:
            # The raised error is also a grpc.Call with code() and details().
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise PodResourcesError(
                f"kubelet pod-resources List on {self.socket_path} failed: "
                f"{getattr(code, 'name', code)}: {details}"
            ) from exc
        return decode_list_response(raw)

    def close(self) -> None:
        """Close the gRPC channel."""
        if self._channel is not None:
            self._channel.close()
        self._channel = self._call = None
