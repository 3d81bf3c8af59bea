"""The one small Protocol every collector backend implements, and the data it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from service.collectors.host_proc import HostTotals
from service.vocabulary import ActivitySource


@dataclass(slots=True)
class Device:
    """A GPU (or MIG instance) on this node, as the backend sees it now."""

    uuid: str
    index: int
    model: str
    fb_total_bytes: int | None = None
    mig_parent_uuid: str | None = None
    lost: bool = False
    # A MIG instance destroyed while its parent stays healthy (a reconfiguration): not lost.
    retired: bool = False
    # The backend's own id where ``uuid`` is GPU Warden's (NVML's MIG-<uuid> of a MIG instance):
    # what the kubelet's device plugin names the device by.
    alias: str | None = None
    pci_bus_id: str | None = None  # "00000000:1A:00.0", as nvidia-smi and dcgm-exporter write it
    driver_version: str | None = None
    # The device minor number (/dev/nvidia<minor>): how the NVIDIA DRA driver names a GPU
    # (gpu-<minor>) in its ResourceSlices and so in the kubelet's DRA allocations.
    minor: int | None = None


@dataclass(slots=True)
class GpuReading:
    """One GPU's metrics (canonical names and units) at one instant; absent means unsupported."""

    uuid: str
    metrics: dict[str, float]
    source: ActivitySource


@dataclass(slots=True)
class ProcessReading:
    """A process seen on a GPU, with its memory in bytes, its SM and memory-controller
    utilisation (ratios over the last poll; None where the GPU does not say) and the job it
    belongs to if known."""

    gpu_uuid: str
    pid: int
    fb_used_bytes: int | None = None
    job_id: str | None = None
    user: str | None = None
    gpu_index: int | None = None
    sm_util: float | None = None
    mem_util: float | None = None
    # The process's host side from /proc (service.collectors.host_proc.HostTotals), or None.
    host: HostTotals | None = None


@dataclass(slots=True)
class Snapshot:
    """Everything one backend poll returned, stamped with the poll's time (UTC)."""

    ts: datetime
    readings: list[GpuReading] = field(default_factory=list)
    processes: list[ProcessReading] = field(default_factory=list)


class BackendError(Exception):
    """The backend as a whole failed (driver gone, exporter unreachable); the agent retries."""


class Backend(Protocol):
    """A source of GPU readings: the node's devices, and one poll of all of them."""

    name: str

    def devices(self) -> list[Device]:
        """The GPUs on this node now, lost ones flagged."""
        ...

    def sample(self, now: datetime) -> Snapshot:
        """Poll every GPU once; raises BackendError when the whole backend is unusable."""
        ...

    def close(self) -> None:
        """Release what the backend holds (NVML handles, HTTP clients)."""
        ...
