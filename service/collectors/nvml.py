"""The NVML backend: GPM profiling metrics, simple getters, XID events, processes and MIG.

This is the only module that imports pynvml; nvml_fields holds the tables of what is asked.
Faults stay where they happen: a field a GPU does not support is remembered and never asked for
again (absent, not 0); a lost GPU is flagged while the others keep reporting; a driver-level
failure raises BackendError so the agent re-initialises NVML with backoff.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from service.collectors.backend import BackendError, Device, GpuReading, ProcessReading, Snapshot
from service.collectors.mig import MigIdentities, profile_of
from service.collectors.nvml_events import open_xid_events, poll_xids
from service.collectors.nvml_fields import GETTERS, GPM_FIELDS, NOT_SUPPORTED, text
from service.vocabulary import ActivitySource

log = logging.getLogger(__name__)

# Errors after which NVML as a whole is unusable and must be re-initialised.
_DRIVER_ERRORS = {1, 9, 12, 18, 19, 999}  # UNINITIALIZED, DRIVER_NOT_LOADED, LIB_NOT_FOUND,
# LIB_RM_VERSION_MISMATCH, IN_USE... and UNKNOWN
_GPU_IS_LOST = 15
_NOT_FOUND = 6  # per-process utilisation: no sample since the timestamp asked for
GPM_MIN_INTERVAL_SECONDS = 0.1  # NVML needs this much between two GPM samples
# Energy is a counter and its call costs ~5 ms: read every N-th cycle only.
ENERGY_EVERY_CYCLES = 6


def _load_pynvml() -> Any:
    import pynvml

    return pynvml


@dataclass(slots=True)
class _Gpu:
    """What the backend keeps per GPU between polls."""

    device: Device
    handle: Any
    parent_handle: Any = None  # MIG: the physical GPU the GPM sample is taken from
    gpu_instance_id: int | None = None
    gpm: bool = False
    bufs: list[Any] = field(default_factory=list)  # two GPM sample buffers, used in turn
    cur: int = 0
    have_prev: bool = False
    metrics_get: Any = None
    prev_at: float = 0.0  # monotonic time of the last GPM sample
    parent_model: str = ""  # MIG: the physical GPU's model name
    unsupported: set[str] = field(default_factory=set)
    cycle: int = 0
    util_since_us: int = 0  # NVML's timestamp of the newest per-process sample already read


class NvmlBackend:
    """Reads every GPU (and MIG instance) on this node through NVML; GPM on Hopper and newer."""

    name = "nvml"

    def __init__(
        self,
        *,
        energy_every_cycles: int = ENERGY_EVERY_CYCLES,
        lib: Any = None,
        mig: MigIdentities | None = None,
        mig_rescan_cycles: int = 6,
    ) -> None:
        self.lib = lib if lib is not None else _load_pynvml()
        self.energy_every_cycles = max(1, energy_every_cycles)
        self.mig = mig or MigIdentities()
        self.mig_rescan_cycles = max(1, mig_rescan_cycles)
        self._polls = 0
        self._retired: list[Device] = []  # listed until the next rescan, so a batch carries them
        self._gpus: list[_Gpu] = []
        self._events: Any = None
        self._open = False

    # --- lifecycle --------------------------------------------------------------------
    def open(self) -> None:
        """Initialise NVML and enumerate devices; raises BackendError if NVML is unusable."""
        lib = self.lib
        try:
            lib.nvmlInit()
        except lib.NVMLError as exc:
            raise BackendError(f"NVML init failed: {exc}") from exc
        self._open = True
        try:
            count = lib.nvmlDeviceGetCount()
            gpus: list[_Gpu] = []
            for index in range(count):
                gpus.extend(self._open_device(index))
        except lib.NVMLError as exc:
            self.close()
            raise BackendError(f"NVML enumeration failed: {exc}") from exc
        self._gpus = gpus
        self._events = open_xid_events(
            self.lib, [(g.handle, g.device.uuid) for g in gpus if g.device.mig_parent_uuid is None]
        )

    def _open_device(self, index: int) -> list[_Gpu]:
        lib = self.lib
        handle = lib.nvmlDeviceGetHandleByIndex(index)
        uuid = text(lib.nvmlDeviceGetUUID(handle))
        model = text(lib.nvmlDeviceGetName(handle))
        try:
            total = int(lib.nvmlDeviceGetMemoryInfo(handle).total)
        except lib.NVMLError:
            total = None
        gpm = self._gpm_supported(handle)
        migs = self._mig_devices(handle)
        pci, driver = self._pci_bus_id(handle), self._driver_version()
        if not migs:
            dev = Device(uuid, index, model, total, pci_bus_id=pci, driver_version=driver)
            dev.minor = self._minor(handle)
            return [self._make(dev, handle, gpm=gpm)]
        out = [self._open_mig(mig, index, handle, uuid, model, gpm) for mig in migs]
        for g in out:
            g.device.pci_bus_id, g.device.driver_version = pci, driver
        return out

    def _pci_bus_id(self, handle: Any) -> str | None:
        """The GPU's PCI bus id, as nvidia-smi and dcgm-exporter spell it (00000000:1A:00.0)."""
        lib = self.lib
        try:
            return text(lib.nvmlDeviceGetPciInfo(handle).busId)
        except (lib.NVMLError, AttributeError):
            return None

    def _minor(self, handle: Any) -> int | None:
        """The GPU's device minor number (/dev/nvidia<minor>), None where NVML does not say."""
        lib = self.lib
        try:
            return int(lib.nvmlDeviceGetMinorNumber(handle))
        except (lib.NVMLError, AttributeError):
            return None

    def _driver_version(self) -> str | None:
        lib = self.lib
        try:
            return text(lib.nvmlSystemGetDriverVersion())
        except (lib.NVMLError, AttributeError):
            return None

    def _mig_identity(self, mig: Any, parent_uuid: str, model: str) -> tuple[str, str, int | None]:
        """(GPU Warden identity, model name, GPU instance id) of a MIG device handle."""
        lib = self.lib
        mig_uuid = text(lib.nvmlDeviceGetUUID(mig))
        try:
            name = text(lib.nvmlDeviceGetName(mig))
        except lib.NVMLError:
            name = ""
        profile = profile_of(name)
        try:
            gi: int | None = int(lib.nvmlDeviceGetGpuInstanceId(mig))
        except lib.NVMLError:
            gi = None
        label = f"{model} MIG {profile}" if profile else f"{model} MIG"
        if gi is None or profile is None:
            return mig_uuid, label, gi  # no slot to key on: NVML's own id
        return self.mig.identity(parent_uuid, gi, profile), label, gi

    def _open_mig(
        self, mig: Any, index: int, parent: Any, parent_uuid: str, model: str, gpm: bool
    ) -> _Gpu:
        lib = self.lib
        identity, label, gi = self._mig_identity(mig, parent_uuid, model)
        try:
            mig_total: int | None = int(lib.nvmlDeviceGetMemoryInfo(mig).total)
        except lib.NVMLError:
            mig_total = None
        alias = text(lib.nvmlDeviceGetUUID(mig))
        dev = Device(
            identity,
            index,
            label,
            mig_total,
            mig_parent_uuid=parent_uuid,
            alias=alias if alias != identity else None,
        )
        dev.pci_bus_id, dev.driver_version = self._pci_bus_id(parent), self._driver_version()
        g = self._make(dev, mig, gpm=gpm and gi is not None, parent=parent, gi=gi)
        g.parent_model = model
        return g

    def _rescan_migs(self) -> None:
        """Find MIG instances created or destroyed since the last look (reconfigurations).

        A destroyed instance whose parent still answers is retired (listed once more with
        ``retired``), never lost; one whose parent is gone is left to the lost-GPU path.
        """
        lib = self.lib
        self._retired = []
        parents: dict[str, tuple[Any, int, str, bool]] = {}
        for g in self._gpus:
            if g.parent_handle is not None and g.device.mig_parent_uuid is not None:
                parents[g.device.mig_parent_uuid] = (
                    g.parent_handle,
                    g.device.index,
                    g.parent_model,
                    g.gpm or g.gpu_instance_id is None,
                )
        for parent_uuid, (parent, index, model, gpm) in parents.items():
            if not self._answers(parent):
                continue
            mine = [g for g in self._gpus if g.device.mig_parent_uuid == parent_uuid]
            now_there: dict[str, Any] = {}
            for h in self._mig_devices(parent):
                try:
                    now_there[self._mig_identity(h, parent_uuid, model)[0]] = h
                except lib.NVMLError:
                    continue
            for g in mine:
                if g.device.uuid not in now_there:
                    log.info("MIG instance %s was destroyed; retiring it", g.device.uuid)
                    self._free(g)
                    self._gpus.remove(g)
                    g.device.retired = True
                    self.mig.retire(g.device.uuid)
                    self._retired.append(g.device)
            known = {g.device.uuid for g in mine}
            for identity, h in now_there.items():
                if identity not in known:
                    log.info("MIG instance %s appeared", identity)
                    self._gpus.append(self._open_mig(h, index, parent, parent_uuid, model, gpm))

    def _answers(self, handle: Any) -> bool:
        """Whether a GPU still answers NVML (anything but lost or a driver failure)."""
        lib = self.lib
        try:
            lib.nvmlDeviceGetMemoryInfo(handle)
        except lib.NVMLError as exc:
            code = getattr(exc, "value", None)
            return not (code == _GPU_IS_LOST or code in _DRIVER_ERRORS)
        return True

    def _free(self, g: _Gpu) -> None:
        for buf in g.bufs:
            with contextlib.suppress(self.lib.NVMLError):
                self.lib.nvmlGpmSampleFree(buf)
        g.bufs = []

    def _make(
        self, dev: Device, handle: Any, *, gpm: bool, parent: Any = None, gi: int | None = None
    ) -> _Gpu:
        g = _Gpu(device=dev, handle=handle, parent_handle=parent, gpu_instance_id=gi, gpm=gpm)
        if gpm:
            lib = self.lib
            try:
                g.bufs = [lib.nvmlGpmSampleAlloc(), lib.nvmlGpmSampleAlloc()]
                mg = lib.c_nvmlGpmMetricsGet_t()
                mg.version = lib.NVML_GPM_METRICS_GET_VERSION
                mg.numMetrics = len(GPM_FIELDS)
                for i, f in enumerate(GPM_FIELDS):
                    mg.metrics[i].metricId = getattr(lib, f"NVML_GPM_METRIC_{f.gpm}")
                g.metrics_get = mg
                self._gpm_take(g)  # the first poll then already has an interval to report
            except lib.NVMLError as exc:
                log.warning("GPM unavailable on %s (%s); using NVML duty cycle", dev.uuid, exc)
                g.gpm = False
        return g

    def _gpm_supported(self, handle: Any) -> bool:
        lib = self.lib
        if not hasattr(lib, "nvmlGpmQueryDeviceSupport"):
            return False
        try:
            return bool(lib.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except lib.NVMLError:
            return False

    def _mig_devices(self, handle: Any) -> list[Any]:
        lib = self.lib
        try:
            current, _pending = lib.nvmlDeviceGetMigMode(handle)
        except lib.NVMLError:
            return []
        if current != 1:
            return []
        out = []
        for i in range(int(lib.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                out.append(lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, i))
            except lib.NVMLError:
                continue  # slot not populated
        return out

    def close(self) -> None:
        """Free GPM buffers and the event set, and shut NVML down (errors ignored)."""
        lib = self.lib
        if not self._open:
            return
        for g in self._gpus:
            self._free(g)
        if self._events is not None:
            with contextlib.suppress(lib.NVMLError):
                lib.nvmlEventSetFree(self._events)
        self._events = None
        self._gpus = []
        with contextlib.suppress(lib.NVMLError):
            lib.nvmlShutdown()
        self._open = False

    # --- polling ----------------------------------------------------------------------
    def devices(self) -> list[Device]:
        """The GPUs and MIG instances on this node; lost ones flagged."""
        if not self._open:
            self.open()
        return [g.device for g in self._gpus] + self._retired

    def sample(self, now: datetime) -> Snapshot:
        """Read every GPU once; a lost GPU is flagged, the others still report."""
        if not self._open:
            self.open()
        self._polls += 1
        if self._polls % self.mig_rescan_cycles == 0:
            self._rescan_migs()
        snap = Snapshot(ts=now)
        xids = poll_xids(self.lib, self._events)
        for g in self._gpus:
            if g.device.lost:
                continue
            try:
                reading = self._read(g)
            except self.lib.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code == _GPU_IS_LOST:
                    log.error("GPU %s is lost (fallen off the bus)", g.device.uuid)
                    g.device.lost = True
                    continue
                if code in _DRIVER_ERRORS:
                    self.close()
                    raise BackendError(f"NVML failed on {g.device.uuid}: {exc}") from exc
                log.warning("reading %s failed: %s", g.device.uuid, exc)
                continue
            xid = xids.get(g.device.uuid) or xids.get(g.device.mig_parent_uuid or "")
            if xid is not None:
                reading.metrics["xid_last"] = xid
            snap.readings.append(reading)
            self._processes(g, snap.processes)
        return snap

    def _gpm_take(self, g: _Gpu) -> bool:
        """Take a GPM sample into the free buffer; True if metrics over an interval were read."""
        lib = self.lib
        mono = time.monotonic()
        if g.have_prev and mono - g.prev_at < GPM_MIN_INTERVAL_SECONDS:
            return False  # too soon after the last sample for GPM to measure an interval
        buf = g.bufs[g.cur]
        if g.parent_handle is not None:
            lib.nvmlGpmMigSampleGet(g.parent_handle, g.gpu_instance_id, buf)
        else:
            lib.nvmlGpmSampleGet(g.handle, buf)
        if g.have_prev:
            mg = g.metrics_get
            mg.sample1 = g.bufs[1 - g.cur]
            mg.sample2 = buf
            lib.nvmlGpmMetricsGet(mg)
        had_prev = g.have_prev
        g.cur ^= 1  # the next poll writes into the other buffer: no sleep, no re-alloc
        g.have_prev = True
        g.prev_at = mono
        return had_prev

    def _read(self, g: _Gpu) -> GpuReading:
        lib = self.lib
        m: dict[str, float] = {}
        source = ActivitySource.NVML
        if g.gpm and self._gpm_take(g):
            source = ActivitySource.GPM
            metrics = g.metrics_get.metrics
            for i, f in enumerate(GPM_FIELDS):
                entry = metrics[i]
                if entry.nvmlReturn == 0:
                    v = entry.value * f.scale
                    m[f.metric] = min(max(v, 0.0), 1.0) if f.scale < 1 else max(v, 0.0)
        for getter in GETTERS:
            if getter.key in g.unsupported and not getter.ask_again:
                continue
            if getter.sparse and g.cycle % self.energy_every_cycles:
                continue
            try:
                m.update(getter.read(lib, g.handle))
            except lib.NVMLError as exc:
                self._field_failed(g, getter.key, exc)
        g.cycle += 1
        return GpuReading(g.device.uuid, m, source)

    def _field_failed(self, g: _Gpu, key: str, exc: Any) -> None:
        code = getattr(exc, "value", None)
        if code == NOT_SUPPORTED:
            g.unsupported.add(key)  # absent from now on, never asked again
            return
        if code == _GPU_IS_LOST or code in _DRIVER_ERRORS:
            raise exc
        # Absent this poll only; asked again next time.
        log.warning("reading %s of %s failed: %s", key, g.device.uuid, exc)

    def _processes(self, g: _Gpu, out: list[ProcessReading]) -> None:
        lib = self.lib
        if "procs" in g.unsupported:
            return
        try:
            procs = lib.nvmlDeviceGetComputeRunningProcesses(g.handle)
        except lib.NVMLError as exc:
            self._field_failed(g, "procs", exc)
            return
        # Per-process figures only tell something when processes share the GPU; the call costs
        # ~2 ms of CPU on an H200 (against 0.1 ms for a GPM sample), so a GPU with one process
        # is not asked.
        util = self._process_util(g) if len(procs) >= 2 else None
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            sm, mem = (None, None) if util is None else util.get(int(p.pid), (0.0, 0.0))
            out.append(
                ProcessReading(
                    gpu_uuid=g.device.uuid,
                    pid=int(p.pid),
                    fb_used_bytes=int(used) if used is not None else None,
                    gpu_index=g.device.index,
                    sm_util=sm,
                    mem_util=mem,
                )
            )

    def _process_util(self, g: _Gpu) -> dict[int, tuple[float, float]] | None:
        """Mean SM and memory utilisation (ratios) per pid over the samples NVML took since the
        last poll, in one call; a listed pid absent from them ran no kernels. None when the GPU
        (or a MIG instance) does not report them."""
        lib = self.lib
        if "putil" in g.unsupported:
            return None
        try:
            samples = lib.nvmlDeviceGetProcessUtilization(g.handle, g.util_since_us)
        except lib.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in (_NOT_FOUND, 0):  # no sample since the last poll: nothing ran
                return {}
            self._field_failed(g, "putil", exc)
            return None
        except AttributeError:  # an nvidia-ml-py without the call
            g.unsupported.add("putil")
            return None
        sums: dict[int, list[float]] = {}
        for s in samples:
            acc = sums.setdefault(int(s.pid), [0.0, 0.0, 0.0])
            acc[0] += float(s.smUtil)
            acc[1] += float(s.memUtil)
            acc[2] += 1.0
            g.util_since_us = max(g.util_since_us, int(s.timeStamp))
        return {
            pid: (min(sm / n / 100.0, 1.0), min(mem / n / 100.0, 1.0))
            for pid, (sm, mem, n) in sums.items()
        }


def gpu_present(lib: Any = None) -> bool:
    """Whether NVML loads and sees at least one GPU."""
    try:
        lib = lib if lib is not None else _load_pynvml()
        lib.nvmlInit()
    except Exception:
        return False
    try:
        return int(lib.nvmlDeviceGetCount()) > 0
    except Exception:
        return False
    finally:
        with contextlib.suppress(Exception):
            lib.nvmlShutdown()
