"""The canonical metric vocabulary (design section 3), declared once as data.

Storage columns, ingest validation, series queries and exporters are all generated
from ``METRICS``; adding a metric here is the only change a new field needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal


class ActivitySource(StrEnum):
    """Where a sample's activity figures (sm_active and friends) came from."""

    GPM = "gpm"  # NVML GPM profiling counters (Hopper and newer)
    DCGM = "dcgm"  # DCGM profiling fields, read from dcgm-exporter
    NVML = "nvml"  # the coarse NVML duty cycle only (gpu_util); sm_active is absent
    SIMULATED = "simulated"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One canonical metric: its name, unit, valid range and storage type."""

    name: str
    unit: str
    help: str
    minimum: float = 0.0
    maximum: float | None = None
    kind: Literal["float", "int"] = "float"
    counter: bool = False


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "sm_active", "ratio", "Fraction of time at least one warp was active on an SM", maximum=1.0
    ),
    MetricSpec(
        "sm_occupancy", "ratio", "Resident warps as a fraction of the SM maximum", maximum=1.0
    ),
    MetricSpec(
        "tensor_active", "ratio", "Fraction of time any tensor pipe was active", maximum=1.0
    ),
    MetricSpec(
        "dram_active",
        "ratio",
        "Fraction of time device memory was being read or written",
        maximum=1.0,
    ),
    MetricSpec(
        "gr_engine_active",
        "ratio",
        "Fraction of time the graphics/compute engine was busy",
        maximum=1.0,
    ),
    MetricSpec(
        "gpu_util", "ratio", "NVML duty cycle: fraction of time any kernel ran", maximum=1.0
    ),
    MetricSpec(
        "mem_copy_util",
        "ratio",
        "NVML fraction of time memory was being read or written",
        maximum=1.0,
    ),
    MetricSpec("fb_used_bytes", "bytes", "Frame buffer memory in use", kind="int"),
    MetricSpec("fb_total_bytes", "bytes", "Frame buffer memory in total", kind="int"),
    MetricSpec("power_watts", "watts", "Board power draw", maximum=5000.0),
    MetricSpec("energy_joules", "joules", "Energy used since the driver loaded", counter=True),
    MetricSpec("temperature_celsius", "celsius", "GPU core temperature", -50.0, 200.0),
    MetricSpec("sm_clock_hz", "hertz", "SM clock frequency", maximum=1e10),
    MetricSpec("pcie_tx_bytes_per_second", "bytes_per_second", "PCIe transmit throughput"),
    MetricSpec("pcie_rx_bytes_per_second", "bytes_per_second", "PCIe receive throughput"),
    MetricSpec("nvlink_tx_bytes_per_second", "bytes_per_second", "NVLink transmit throughput"),
    MetricSpec("nvlink_rx_bytes_per_second", "bytes_per_second", "NVLink receive throughput"),
    MetricSpec("xid_last", "code", "Most recent XID error code seen in the interval", kind="int"),
)

METRICS_BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}
METRIC_NAMES: tuple[str, ...] = tuple(m.name for m in METRICS)
