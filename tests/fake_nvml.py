"""A fake pynvml module for the NVML backend tests: scripted devices, values and failures."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_GPM_METRICS_GET_VERSION = 1
nvmlEventTypeXidCriticalError = 8

_GPM_IDS = {
    "GRAPHICS_UTIL": 1,
    "SM_UTIL": 2,
    "SM_OCCUPANCY": 3,
    "ANY_TENSOR_UTIL": 5,
    "DRAM_BW_UTIL": 10,
    "PCIE_TX_PER_SEC": 20,
    "PCIE_RX_PER_SEC": 21,
    "NVLINK_TOTAL_RX_PER_SEC": 60,
    "NVLINK_TOTAL_TX_PER_SEC": 61,
}
for _k, _v in _GPM_IDS.items():
    globals()[f"NVML_GPM_METRIC_{_k}"] = _v


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H200"
    gpm: bool = True
    used: int = 2 * 1024**3
    total: int = 141 * 1024**3
    gpm_values: dict[int, float] = field(
        default_factory=lambda: {2: 97.0, 3: 40.0, 5: 94.0, 10: 16.0, 1: 99.0, 20: 10.0, 21: 20.0}
    )
    power_mw: int = 650_000
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    pids: list[tuple[int, int | None]] = field(default_factory=list)
    migs: list[FakeGpu] = field(default_factory=list)
    gpu_instance_id: int = 0
    remapped_uncorrectable: int = 0
    pci_bus_id: str = "00000000:1A:00.0"
    remap_failed: bool = False
    pcie_replays: int = 0
    # Per-process utilisation samples NVML keeps: (pid, timestamp in us, SM %, memory %).
    proc_samples: list[tuple[int, int, int, int]] = field(default_factory=list)
    util: int = 100  # NVML duty cycle, percent
    minor: int | None = None  # /dev/nvidia<minor>; None: the position in the fake's list
    enc_util: int = 0  # video encoder (NVENC) utilisation, percent
    dec_util: int = 0  # video decoder (NVDEC) utilisation, percent
    # nvmlDeviceGetFieldValues: field id -> value; a field absent here answers NOT_SUPPORTED.
    # By default what an H100 SXM answered (docs/gpu-check/health_fields.json): double-bit ECC
    # only; no retired pages (Hopper remaps rows instead), no NVLink counters on a lone GPU.
    fields: dict[int, int] = field(default_factory=lambda: {4: 0})
    clocks_event_reasons: int = 0x1  # GPU idle


class _Metric:
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = 0
        self.value = 0.0


class c_nvmlGpmMetricsGet_t:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [_Metric() for _ in range(64)]


class FakeNvml:
    """Attributes mimic the pynvml module; ``gpus`` and the counters are for the test to script."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.initialised = False
        self.init_calls = 0
        self.init_fails = 0  # fail this many nvmlInit calls first
        self.driver_broken = False
        self.calls: dict[str, int] = {}
        self.events: list[tuple[str, int]] = []
        for k, v in globals().items():
            if k.startswith(("NVML_", "nvmlEventType")):
                setattr(self, k, v)
        self.c_nvmlGpmMetricsGet_t = c_nvmlGpmMetricsGet_t

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def _gpu(self, h: Any, what: str) -> FakeGpu:
        self._count(what)
        if not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if self.driver_broken:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        g: FakeGpu = h
        if g.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if what in g.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return g

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_fails > 0:
            self.init_fails -= 1
            raise NVMLError(9)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return h.uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return h.name

    def nvmlDeviceGetMinorNumber(self, h: FakeGpu) -> int:
        g = self._gpu(h, "minor")
        return g.minor if g.minor is not None else self.gpus.index(g)

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        g = self._gpu(h, "mem")
        return SimpleNamespace(used=g.used, total=g.total, free=g.total - g.used)

    def nvmlGpmQueryDeviceSupport(self, h: FakeGpu) -> Any:
        return SimpleNamespace(isSupportedDevice=int(h.gpm))

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> tuple[int, int]:
        if not h.migs:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return 1, 1

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeGpu) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeGpu, i: int) -> FakeGpu:
        if i >= len(h.migs):
            raise NVMLError(6)  # NOT_FOUND: slot not populated
        return h.migs[i]

    def nvmlDeviceGetGpuInstanceId(self, h: FakeGpu) -> int:
        return h.gpu_instance_id

    def nvmlGpmMigSampleGet(self, h: FakeGpu, gi: int, s: Any) -> Any:
        self._gpu(h, "gpm_sample")
        s.gpu = next(m for m in h.migs if m.gpu_instance_id == gi)
        return s

    def nvmlGpmSampleAlloc(self) -> Any:
        return SimpleNamespace(gpu=None)

    def nvmlGpmSampleFree(self, s: Any) -> None:
        pass

    def nvmlGpmSampleGet(self, h: Any, s: Any) -> Any:
        self._gpu(h, "gpm_sample")
        s.gpu = h
        return s

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        g = self._gpu(mg.sample2.gpu, "gpm_metrics")
        assert mg.sample1 is not mg.sample2, "GPM needs two distinct sample buffers"
        for i in range(mg.numMetrics):
            m = mg.metrics[i]
            if m.metricId in g.gpm_values:
                m.value = g.gpm_values[m.metricId]
                m.nvmlReturn = 0
            else:
                m.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return mg

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        g = self._gpu(h, "util")
        return SimpleNamespace(gpu=g.util, memory=30)

    def nvmlDeviceGetEncoderUtilization(self, h: Any) -> list[int]:
        # pynvml returns [utilization %, sampling period in us].
        return [self._gpu(h, "enc").enc_util, 167_000]

    def nvmlDeviceGetDecoderUtilization(self, h: Any) -> list[int]:
        return [self._gpu(h, "dec").dec_util, 167_000]

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return self._gpu(h, "power").power_mw

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        self._gpu(h, "temp")
        return 55

    def nvmlDeviceGetClockInfo(self, h: Any, clock: int) -> int:
        self._gpu(h, "clock")
        return 1980

    def nvmlDeviceGetTotalEnergyConsumption(self, h: Any) -> int:
        self._gpu(h, "energy")
        return 123_456_000

    def nvmlDeviceGetPciInfo(self, h: Any) -> Any:
        return SimpleNamespace(busId=h.pci_bus_id.encode())

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"570.124.06"

    def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, int, int]:
        g = self._gpu(h, "remap")
        return 0, g.remapped_uncorrectable, 0, int(g.remap_failed)

    def nvmlDeviceGetPcieReplayCounter(self, h: Any) -> int:
        return self._gpu(h, "replay").pcie_replays

    def nvmlDeviceGetFieldValues(self, h: Any, ids: list[int]) -> list[Any]:
        g = self._gpu(h, "health")
        return [
            SimpleNamespace(
                fieldId=i,
                nvmlReturn=0 if i in g.fields else NVML_ERROR_NOT_SUPPORTED,
                valueType=3,  # NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                value=SimpleNamespace(ullVal=g.fields.get(i, 0)),
            )
            for i in ids
        ]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return self._gpu(h, "clocks_event").clocks_event_reasons

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        g = self._gpu(h, "procs")
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in g.pids]

    def nvmlDeviceGetProcessUtilization(self, h: Any, since_us: int) -> list[Any]:
        g = self._gpu(h, "putil")
        rows = [
            SimpleNamespace(pid=p, timeStamp=ts, smUtil=sm, memUtil=mem, encUtil=0, decUtil=0)
            for p, ts, sm, mem in g.proc_samples
            if ts > since_us
        ]
        if not rows:
            raise NVMLError(NVML_ERROR_NOT_FOUND)  # what the driver answers with no new sample
        return rows

    def nvmlEventSetCreate(self) -> str:
        return "evset"

    def nvmlEventSetFree(self, s: Any) -> None:
        pass

    def nvmlDeviceRegisterEvents(self, h: Any, kind: int, s: Any) -> None:
        pass

    def nvmlEventSetWait_v2(self, s: Any, timeout_ms: int) -> Any:
        assert timeout_ms == 0, "the agent must never block on the event set"
        if not self.events:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        uuid, xid = self.events.pop(0)
        dev = next(g for g in self.gpus if g.uuid == uuid)
        return SimpleNamespace(device=dev, eventData=xid)
