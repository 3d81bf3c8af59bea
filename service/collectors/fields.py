"""What each backend collects, declared once as data: canonical name, unit and where it comes from.

The NVML backend builds its GPM metric list from ``GPM_FIELDS``, the dcgm-exporter backend its
mapping from ``DCGM_FIELDS``; ``FIELDS`` is the human-readable table both are checked against.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.vocabulary import METRICS_BY_NAME

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class CollectedField:
    """One canonical metric, its unit, its NVML/GPM source and its dcgm-exporter field."""

    name: str
    unit: str
    nvml: str  # the NVML call or GPM metric it is read from
    dcgm: str | None  # the dcgm-exporter field, None where dcgm-exporter has none
    dcgm_scale: float = 1.0  # multiply the dcgm-exporter value by this to get ``unit``
    every_cycles: int = 1  # read every N-th cycle only (counters need not be read each time)


FIELDS: tuple[CollectedField, ...] = (
    CollectedField("sm_active", "ratio", "gpm:SM_UTIL/100", "DCGM_FI_PROF_SM_ACTIVE"),
    CollectedField("sm_occupancy", "ratio", "gpm:SM_OCCUPANCY/100", "DCGM_FI_PROF_SM_OCCUPANCY"),
    CollectedField(
        "tensor_active", "ratio", "gpm:ANY_TENSOR_UTIL/100", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
    ),
    CollectedField("dram_active", "ratio", "gpm:DRAM_BW_UTIL/100", "DCGM_FI_PROF_DRAM_ACTIVE"),
    CollectedField(
        "gr_engine_active", "ratio", "gpm:GRAPHICS_UTIL/100", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
    ),
    CollectedField(
        "gpu_util", "ratio", "nvmlDeviceGetUtilizationRates.gpu/100", "DCGM_FI_DEV_GPU_UTIL", 0.01
    ),
    CollectedField(
        "mem_copy_util",
        "ratio",
        "nvmlDeviceGetUtilizationRates.memory/100",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        0.01,
    ),
    CollectedField(
        "fb_used_bytes", "bytes", "nvmlDeviceGetMemoryInfo.used", "DCGM_FI_DEV_FB_USED", MIB
    ),
    CollectedField(
        "fb_total_bytes", "bytes", "nvmlDeviceGetMemoryInfo.total", None
    ),  # dcgm: FB_USED + FB_FREE + FB_RESERVED
    CollectedField(
        "power_watts", "watts", "nvmlDeviceGetPowerUsage/1000", "DCGM_FI_DEV_POWER_USAGE"
    ),
    CollectedField(
        "energy_joules",
        "joules",
        "nvmlDeviceGetTotalEnergyConsumption/1000",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        0.001,
        every_cycles=6,
    ),
    CollectedField(
        "temperature_celsius", "celsius", "nvmlDeviceGetTemperature", "DCGM_FI_DEV_GPU_TEMP"
    ),
    CollectedField(
        "sm_clock_hz", "hertz", "nvmlDeviceGetClockInfo(SM)*1e6", "DCGM_FI_DEV_SM_CLOCK", 1e6
    ),
    CollectedField(
        "pcie_tx_bytes_per_second",
        "bytes_per_second",
        "gpm:PCIE_TX_PER_SEC*MiB",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
    ),
    CollectedField(
        "pcie_rx_bytes_per_second",
        "bytes_per_second",
        "gpm:PCIE_RX_PER_SEC*MiB",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
    ),
    CollectedField(
        "nvlink_tx_bytes_per_second",
        "bytes_per_second",
        "gpm:NVLINK_TOTAL_TX_PER_SEC*MiB",
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
    ),
    CollectedField(
        "nvlink_rx_bytes_per_second",
        "bytes_per_second",
        "gpm:NVLINK_TOTAL_RX_PER_SEC*MiB",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
    ),
    CollectedField("xid_last", "code", "nvmlEventSetWait(timeout=0)", "DCGM_FI_DEV_XID_ERRORS"),
)

FIELDS_BY_NAME: dict[str, CollectedField] = {f.name: f for f in FIELDS}

# GPM metrics read in one nvmlGpmMetricsGet per GPU per cycle: (canonical name, GPM id suffix,
# scale to the canonical unit). Percentages become ratios; MiB/s become bytes per second.
GPM_FIELDS: tuple[tuple[str, str, float], ...] = tuple(
    (
        f.name,
        f.nvml[4:].split("/")[0].split("*")[0],
        0.01 if f.nvml.endswith("/100") else float(MIB),
    )
    for f in FIELDS
    if f.nvml.startswith("gpm:")
)

# dcgm-exporter field -> (canonical name, scale).
DCGM_FIELDS: dict[str, tuple[str, float]] = {
    f.dcgm: (f.name, f.dcgm_scale) for f in FIELDS if f.dcgm is not None
}

ENERGY_EVERY_CYCLES = FIELDS_BY_NAME["energy_joules"].every_cycles

assert set(FIELDS_BY_NAME) == set(METRICS_BY_NAME), "FIELDS must cover the vocabulary exactly"
