"""Read the kubelet pod-resources socket: GPU device id -> namespace, pod and container.

This is how dcgm-exporter attributes GPUs to pods, and it needs neither ``hostPID`` nor the
Kubernetes API: the kubelet answers ``List`` on a unix socket with every container's allocated
devices. The messages (podresources.proto beside this file) are small enough to decode by hand,
so only grpcio is needed for the transport, imported when the socket is first used.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
LIST_METHOD = "/v1.PodResourcesLister/List"
# nvidia.com/gpu, and nvidia.com/mig-1g.10gb and friends under the "mixed" MIG strategy.
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")


class PodResourcesError(Exception):
    """The kubelet socket could not be read or answered something unreadable."""


@dataclass(frozen=True, slots=True)
class PodDevice:
    """One device allocated to one container of one pod."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str

    @property
    def job_id(self) -> str:
        """The job id GPU Warden gives a pod: ``k8s:<namespace>/<pod>``."""
        return f"k8s:{self.namespace}/{self.pod}"


# --- protobuf wire format (only what these messages use) ---------------------------------


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise PodResourcesError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise PodResourcesError("varint too long")


def _fields(buf: bytes) -> Iterator[tuple[int, bytes | int]]:
    """(field number, bytes for length-delimited fields or int for varints); others skipped."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, value
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise PodResourcesError("truncated field")
            yield number, buf[pos : pos + size]
            pos += size
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise PodResourcesError(f"unsupported wire type {wire}")


def _text(value: bytes | int) -> str:
    if isinstance(value, int):
        raise PodResourcesError("expected a string, got a number")
    return value.decode()


def _msg(value: bytes | int) -> bytes:
    if isinstance(value, int):
        raise PodResourcesError("expected a message, got a number")
    return value


def decode_list_response(data: bytes) -> list[PodDevice]:
    """Every (pod, container, device) of a ListPodResourcesResponse, GPU resources only."""
    out: list[PodDevice] = []
    for n, pod_raw in _fields(data):
        if n != 1:
            continue
        name = namespace = ""
        containers: list[bytes] = []
        for pn, pv in _fields(_msg(pod_raw)):
            if pn == 1:
                name = _text(pv)
            elif pn == 2:
                namespace = _text(pv)
            elif pn == 3:
                containers.append(_msg(pv))
        for c_raw in containers:
            container = ""
            devices: list[tuple[str, list[str]]] = []
            for cn, cv in _fields(c_raw):
                if cn == 1:
                    container = _text(cv)
                elif cn == 2:
                    resource, ids = "", []
                    for dn, dv in _fields(_msg(cv)):
                        if dn == 1:
                            resource = _text(dv)
                        elif dn == 2:
                            ids.append(_text(dv))
                    devices.append((resource, ids))
            for resource, ids in devices:
                if resource.startswith(GPU_RESOURCE_PREFIXES):
                    out.extend(PodDevice(namespace, name, container, resource, i) for i in ids)
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

        if self._call is None:
            self._channel = grpc.insecure_channel(f"unix://{self.socket_path}")
            self._call = self._channel.unary_unary(
                LIST_METHOD,
                request_serializer=lambda _req: b"",  # ListPodResourcesRequest is empty
                response_deserializer=lambda raw: raw,
            )
        try:
            raw = self._call(b"", timeout=self.timeout_seconds)
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
