"""dcgm-exporter compatible families (names, labels and units as NVIDIA's exporter writes them).

Pure. With GPUWARDEN_METRICS_DCGM_COMPAT=true these sit beside the gpuwarden_* families so
dashboards written for dcgm-exporter (NVIDIA's Grafana dashboard 12239 among them) work unchanged.
dcgm-exporter's labels are gpu, UUID, device, modelName and Hostname (plus pci_bus_id and
DCGM_FI_DRIVER_VERSION, which the wire format does not carry, and pod labels on Kubernetes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client.core import Metric

from service.exposition.families import GpuFamily
from service.exposition.types import GpuReading

DCGM_LABELS: tuple[str, ...] = ("gpu", "UUID", "device", "modelName", "Hostname")

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class DcgmField:
    """A dcgm-exporter field: its name, the canonical metric it comes from and the unit factor."""

    name: str
    metric: str
    factor: float
    help: str


# Units as dcgm-exporter's default-counters.csv and dcp-metrics-included.csv state them.
DCGM_FIELDS: tuple[DcgmField, ...] = (
    DcgmField("DCGM_FI_DEV_GPU_UTIL", "gpu_util", 100.0, "GPU utilization (in %)."),
    DcgmField("DCGM_FI_DEV_MEM_COPY_UTIL", "mem_copy_util", 100.0, "Memory utilization (in %)."),
    DcgmField("DCGM_FI_DEV_FB_USED", "fb_used_bytes", 1 / MIB, "Framebuffer memory used (in MiB)."),
    DcgmField("DCGM_FI_DEV_POWER_USAGE", "power_watts", 1.0, "Power draw (in W)."),
    DcgmField(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "energy_joules",
        1000.0,
        "Total energy consumption since boot (in mJ).",
    ),
    DcgmField("DCGM_FI_DEV_GPU_TEMP", "temperature_celsius", 1.0, "GPU temperature (in C)."),
    DcgmField("DCGM_FI_DEV_SM_CLOCK", "sm_clock_hz", 1e-6, "SM clock frequency (in MHz)."),
    DcgmField(
        "DCGM_FI_DEV_XID_ERRORS", "xid_last", 1.0, "Value of the last XID error encountered."
    ),
    DcgmField(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gr_engine_active",
        1.0,
        "Ratio of time the graphics engine is active.",
    ),
    DcgmField(
        "DCGM_FI_PROF_SM_ACTIVE",
        "sm_active",
        1.0,
        "The ratio of cycles an SM has at least 1 warp assigned.",
    ),
    DcgmField(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "sm_occupancy",
        1.0,
        "The ratio of number of warps resident on an SM.",
    ),
    DcgmField(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "tensor_active",
        1.0,
        "Ratio of cycles the tensor (HMMA) pipe is active.",
    ),
    DcgmField(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "dram_active",
        1.0,
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    DcgmField(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "pcie_tx_bytes_per_second",
        1.0,
        "The rate of data transmitted over the PCIe bus, in bytes per second.",
    ),
    DcgmField(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "pcie_rx_bytes_per_second",
        1.0,
        "The rate of data received over the PCIe bus, in bytes per second.",
    ),
    DcgmField(
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "nvlink_tx_bytes_per_second",
        1.0,
        "The rate of data transmitted over NVLink, in bytes per second.",
    ),
    DcgmField(
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "nvlink_rx_bytes_per_second",
        1.0,
        "The rate of data received over NVLink, in bytes per second.",
    ),
)


def dcgm_families(readings: Sequence[GpuReading]) -> list[Metric]:
    """One gauge family per dcgm-exporter field, plus DCGM_FI_DEV_FB_FREE, over ``readings``.

    TOTAL_ENERGY_CONSUMPTION is a counter in dcgm-exporter, but its name has no ``_total``;
    it is exposed as a gauge so the name stays exactly the same (rate() works on either).
    """
    label_sets: list[dict[str, str]] = []
    fams = [(f, GpuFamily(f.name, f.help, "gauge", label_sets)) for f in DCGM_FIELDS]
    fb_free = GpuFamily(
        "DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "gauge", label_sets
    )
    slots = [(f.metric, f.factor, fam.rows) for f, fam in fams]
    for i, r in enumerate(readings):
        label_sets.append(
            {
                "gpu": str(r.index),
                "UUID": r.uuid,
                "device": f"nvidia{r.index}",
                "modelName": r.model,
                "Hostname": r.node,
            }
        )
        values = r.values
        for metric, factor, rows in slots:
            v = values.get(metric)
            if v is not None:
                rows.append((i, v * factor))
        total = values.get("fb_total_bytes", r.fb_total_bytes)
        used = values.get("fb_used_bytes")
        if total is not None and used is not None:
            fb_free.rows.append((i, max(total - used, 0) / MIB))
    out: list[Metric] = [fam for _, fam in fams]
    out.append(fb_free)
    return out
