"""What the agent asks NVML for and how each answer becomes canonical metrics.

GPM fields and getters: each getter takes the pynvml module as ``lib`` and a device handle;
none imports pynvml.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.vocabulary import MIB

NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED


@dataclass(frozen=True, slots=True)
class GpmField:
    """A canonical metric read from GPM: NVML_GPM_METRIC_<gpm> x ``scale`` is its value."""

    metric: str
    gpm: str
    scale: float


# Read in one nvmlGpmMetricsGet per GPU per cycle. Percentages become ratios; MiB/s bytes/s.
GPM_FIELDS: tuple[GpmField, ...] = (
    GpmField("sm_active", "SM_UTIL", 0.01),
    GpmField("sm_occupancy", "SM_OCCUPANCY", 0.01),
    GpmField("tensor_active", "ANY_TENSOR_UTIL", 0.01),
    GpmField("dram_active", "DRAM_BW_UTIL", 0.01),
    GpmField("gr_engine_active", "GRAPHICS_UTIL", 0.01),
    GpmField("pcie_tx_bytes_per_second", "PCIE_TX_PER_SEC", MIB),
    GpmField("pcie_rx_bytes_per_second", "PCIE_RX_PER_SEC", MIB),
    GpmField("nvlink_tx_bytes_per_second", "NVLINK_TOTAL_TX_PER_SEC", MIB),
    GpmField("nvlink_rx_bytes_per_second", "NVLINK_TOTAL_RX_PER_SEC", MIB),
)


def _utilization(lib: Any, h: Any) -> dict[str, float]:
    u = lib.nvmlDeviceGetUtilizationRates(h)
    return {"gpu_util": u.gpu / 100.0, "mem_copy_util": u.memory / 100.0}


def _memory(lib: Any, h: Any) -> dict[str, float]:
    mem = lib.nvmlDeviceGetMemoryInfo(h)
    return {
        "fb_used_bytes": int(mem.used),
        "fb_total_bytes": int(mem.total),
        "fb_free_bytes": int(mem.free),
    }


def _encoder(lib: Any, h: Any) -> dict[str, float]:
    util, _period_us = lib.nvmlDeviceGetEncoderUtilization(h)
    return {"enc_util": util / 100.0}


def _decoder(lib: Any, h: Any) -> dict[str, float]:
    util, _period_us = lib.nvmlDeviceGetDecoderUtilization(h)
    return {"dec_util": util / 100.0}


def _power(lib: Any, h: Any) -> dict[str, float]:
    return {"power_watts": lib.nvmlDeviceGetPowerUsage(h) / 1000.0}


def _temperature(lib: Any, h: Any) -> dict[str, float]:
    return {"temperature_celsius": float(lib.nvmlDeviceGetTemperature(h, lib.NVML_TEMPERATURE_GPU))}


def _sm_clock(lib: Any, h: Any) -> dict[str, float]:
    return {"sm_clock_hz": lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_SM) * 1e6}


def _energy(lib: Any, h: Any) -> dict[str, float]:
    return {"energy_joules": lib.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0}


def _remapped_rows(lib: Any, h: Any) -> dict[str, float]:
    _corr, unc, _pending, failed = lib.nvmlDeviceGetRemappedRows(h)
    return {"remapped_rows_uncorrectable": int(unc), "row_remap_failure": int(bool(failed))}


def _pcie_replays(lib: Any, h: Any) -> dict[str, float]:
    return {"pcie_replays": int(lib.nvmlDeviceGetPcieReplayCounter(h))}


# NVML field ids (nvml.h NVML_FI_DEV_*) of the health counters read in one
# nvmlDeviceGetFieldValues call, as DCGM reads them: field id -> canonical metric.
HEALTH_FIELDS: dict[int, str] = {
    4: "ecc_dbe_errors",  # NVML_FI_DEV_ECC_DBE_VOL_TOTAL
    30: "retired_pages_dbe",  # NVML_FI_DEV_RETIRED_DBE
    31: "retired_pages_pending",  # NVML_FI_DEV_RETIRED_PENDING
    38: "nvlink_crc_errors",  # NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL
    52: "nvlink_replay_errors",  # NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL
    59: "nvlink_recovery_errors",  # NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL
}
# nvmlValue_t's member for each nvmlValueType_t (DOUBLE, UNSIGNED_INT, ... UNSIGNED_SHORT).
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _health(lib: Any, h: Any) -> dict[str, float]:
    """The health counters the GPU supports; NOT_SUPPORTED (never asked again) if none."""
    ids = list(HEALTH_FIELDS)
    out: dict[str, float] = {}
    for fv in lib.nvmlDeviceGetFieldValues(h, ids)[: len(ids)]:
        metric = HEALTH_FIELDS.get(int(fv.fieldId))
        if metric is None or fv.nvmlReturn != 0 or not 0 <= fv.valueType < len(_VALUE_MEMBERS):
            continue
        out[metric] = int(getattr(fv.value, _VALUE_MEMBERS[fv.valueType]))
    if not out:
        raise lib.NVMLError(NOT_SUPPORTED)
    return out


def _clock_events(lib: Any, h: Any) -> dict[str, float]:
    # Renamed from "throttle reasons" in driver 535; older nvidia-ml-py has the old name only.
    get = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if get is None:
        get = lib.nvmlDeviceGetCurrentClocksThrottleReasons
    return {"clocks_event_reasons": int(get(h))}


@dataclass(frozen=True, slots=True)
class Getter:
    """One NVML call and the canonical metrics it yields.

    ``key`` names the call once the GPU has said it does not support it (then it is never asked
    again, unless ``ask_again``); a ``sparse`` call runs every ``energy_every_cycles``-th poll.
    """

    key: str
    metrics: tuple[str, ...]
    read: Callable[[Any, Any], dict[str, float]]
    ask_again: bool = False
    sparse: bool = False


GETTERS: tuple[Getter, ...] = (
    Getter("util", ("gpu_util", "mem_copy_util"), _utilization),
    Getter("mem", ("fb_used_bytes", "fb_total_bytes", "fb_free_bytes"), _memory, ask_again=True),
    # The video engines: nvmlDeviceGetUtilizationRates counts kernels only.
    Getter("enc", ("enc_util",), _encoder),
    Getter("dec", ("dec_util",), _decoder),
    Getter("power", ("power_watts",), _power),
    Getter("temp", ("temperature_celsius",), _temperature),
    Getter("clock", ("sm_clock_hz",), _sm_clock),
    Getter("energy", ("energy_joules",), _energy, sparse=True),
    # Health counters change rarely; read with energy, every few polls.
    Getter(
        "remap",
        ("remapped_rows_uncorrectable", "row_remap_failure"),
        _remapped_rows,
        sparse=True,
    ),
    Getter("replay", ("pcie_replays",), _pcie_replays, sparse=True),
    Getter("health", tuple(HEALTH_FIELDS.values()), _health, sparse=True),
    # The clocks' reasons change with the load: read every poll.
    Getter("clocks_event", ("clocks_event_reasons",), _clock_events),
)
# Read from XID events, not a getter.
EVENT_METRICS: tuple[str, ...] = ("xid_last",)


def text(value: Any) -> str:
    """An NVML string as str: older pynvml answers bytes."""
    return value.decode() if isinstance(value, bytes) else str(value)
