"""A seeded, deterministic simulated fleet: the same seed and poll times give the same readings.

Scenarios per GPU, one per cause of docs/diagnosis.md: ``training`` (high SM and tensor
activity: compute_tensor), ``memory-bound`` (SM busy, DRAM saturated, tensor idle),
``idle-held`` (a job's process holds memory and does nothing), ``idle`` (no process, nothing
running: idle_empty), ``launch-bound`` (tiny kernels: busy engine, nearly empty SMs),
``input-starved`` (full kernels a small part of the time), ``transfer-bound`` (host-device
copies, SMs waiting), ``no-tensor`` (fp32 without tensor cores) and ``xid-then-lost`` (trains,
raises XID 79, "GPU has fallen off the bus", in its last reading, and is lost from the next
poll). The figures follow what an H200 showed for each (docs/gpu-check). Readings depend only on
(seed, node, GPU, poll time), so a test can predict them.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from datetime import datetime

from service.collectors.backend import Device, GpuReading, ProcessReading, Snapshot
from service.collectors.scenarios import SCENARIO_CAUSES as SCENARIO_CAUSES
from service.collectors.scenarios import SCENARIOS as SCENARIOS
from service.vocabulary import ActivitySource

GIB = 1024**3
_FB_TOTAL = 80 * GIB
_MODEL = "NVIDIA H100 80GB HBM3"


@dataclass(frozen=True, slots=True)
class _Profile:
    sm: float
    tensor: float
    dram: float
    fb_gib: float
    power_watts: float
    has_job: bool
    engine: float | None = None  # share of time kernels ran; None: 1 while SMs are busy
    pcie_bytes_per_second: float | None = None  # each way; None: in step with SM activity


_PROFILES: dict[str, _Profile] = {
    "training": _Profile(0.93, 0.85, 0.30, 62.0, 640.0, True),
    "memory-bound": _Profile(0.96, 0.0, 0.86, 40.0, 520.0, True),
    "idle-held": _Profile(0.0, 0.0, 0.0, 20.0, 115.0, True),
    "idle": _Profile(0.0, 0.0, 0.0, 0.5, 70.0, False),
    "xid-then-lost": _Profile(0.90, 0.80, 0.35, 55.0, 600.0, True),
    "launch-bound": _Profile(0.02, 0.0, 0.0, 1.3, 122.0, True, engine=0.30),
    "input-starved": _Profile(0.11, 0.10, 0.03, 1.9, 230.0, True, engine=0.13),
    "transfer-bound": _Profile(
        0.0, 0.0, 0.02, 3.4, 135.0, True, engine=0.0, pcie_bytes_per_second=27e9
    ),
    "no-tensor": _Profile(0.96, 0.0, 0.05, 2.1, 650.0, True),
}

XID_CODE = 79  # "GPU has fallen off the bus": the GPU answers nothing after it


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "big")


class SimulatedBackend:
    """A node of simulated GPUs; scenarios are assigned round-robin unless given."""

    name = "simulated"

    def __init__(
        self,
        *,
        hostname: str = "sim-node-0",
        gpus: int = 4,
        seed: int = 0,
        scenarios: list[str] | None = None,
        start: datetime,
        xid_after_seconds: float = 600.0,
        job_base: int = 1000,
        model: str = _MODEL,
        extra_celsius: float = 0.0,
    ) -> None:
        picked = scenarios or [SCENARIOS[i % len(SCENARIOS)] for i in range(gpus)]
        unknown = set(picked) - set(SCENARIOS)
        if unknown:
            raise ValueError(f"unknown scenario(s) {sorted(unknown)}; choose from {SCENARIOS}")
        self.hostname = hostname
        self.seed = seed
        self.start = start
        self.xid_after_seconds = xid_after_seconds
        # Degrees above the usual reading: a node whose cooling is failing (the demo's hot rack).
        self.extra_celsius = extra_celsius
        node_tag = _seed(seed, hostname) % 0xFFFFFFFF
        self._devices = [
            Device(
                uuid=f"GPU-{node_tag:08x}-{seed:04x}-{i:04x}-sim0-{i:012x}",
                index=i,
                model=model,
                fb_total_bytes=_FB_TOTAL,
            )
            for i in range(len(picked))
        ]
        self.scenarios = list(picked)
        self._jobs = [
            f"slurm:{job_base + _seed(seed, hostname) % 9000 + i}" for i in range(len(picked))
        ]
        self._energy = [0.0] * len(picked)
        self._last_ts: datetime | None = None
        self._xid_sent = [False] * len(picked)
        self._forced_lost: set[int] = set()

    def lose(self, index: int) -> None:
        """Make GPU ``index`` fall off the bus now (for tests and demos)."""
        self._forced_lost.add(index)

    def devices(self) -> list[Device]:
        """The node's simulated GPUs; lost ones flagged."""
        return self._devices

    def job_of(self, index: int) -> str | None:
        """The job id the simulated GPU ``index`` is attributed to, if its scenario has a job."""
        return self._jobs[index] if _PROFILES[self.scenarios[index]].has_job else None

    def idle_job_of(self, index: int) -> str:
        """A job id for GPU ``index`` that no process of this node reports (for an allocation
        that runs nothing)."""
        return self._jobs[index]

    def user_of(self, index: int) -> str:
        """The user whose processes run on the simulated GPU ``index``."""
        return f"user{index % 3}"

    def sample(self, now: datetime) -> Snapshot:
        """Readings for every GPU still on the bus at ``now``."""
        elapsed = (now - self.start).total_seconds()
        first_poll = self._last_ts is None
        dt = 0.0 if self._last_ts is None else max(0.0, (now - self._last_ts).total_seconds())
        self._last_ts = now
        snap = Snapshot(ts=now)
        stamp = int(now.timestamp() * 1000)
        for i, dev in enumerate(self._devices):
            scenario = self.scenarios[i]
            if scenario == "xid-then-lost" and first_poll and elapsed > self.xid_after_seconds:
                self._xid_sent[i] = True  # a resumed fleet: it fell off before this run began
            # XID 79 is the GPU falling off the bus: after its reading, nothing more comes.
            if self._xid_sent[i] or i in self._forced_lost:
                dev.lost = True
            if dev.lost:
                continue
            prof = _PROFILES[scenario]
            m = self._metrics(i, prof, random.Random(_seed(self.seed, self.hostname, i, stamp)), dt)
            if scenario == "xid-then-lost" and elapsed >= self.xid_after_seconds:
                self._raise_xid_once(i, m)
            snap.readings.append(GpuReading(dev.uuid, m, ActivitySource.SIMULATED))
            if prof.has_job:
                snap.processes.append(self._process(i, dev, int(m["fb_used_bytes"])))
        return snap

    def _metrics(self, i: int, prof: _Profile, rng: random.Random, dt: float) -> dict[str, float]:
        """GPU ``i``'s reading in canonical units; adds its energy over the ``dt`` seconds since
        the last poll."""
        j = rng.random
        # The draws come in a fixed order (SM, power, memory, tensor, DRAM): same seed, same values.
        sm = _clip(prof.sm + (j() - 0.5) * min(0.06, prof.sm)) if prof.sm else 0.0
        engine, util = _duty(prof, sm)
        power = prof.power_watts + (j() - 0.5) * 20.0
        self._energy[i] += power * dt
        fb = int(prof.fb_gib * GIB) + int(j() * 64) * 1024 * 1024
        return {
            "sm_active": sm,
            "sm_occupancy": _clip(sm * 0.45),
            "tensor_active": _clip(prof.tensor + (j() - 0.5) * 0.06) if prof.tensor else 0.0,
            "dram_active": _clip(prof.dram + (j() - 0.5) * 0.06) if prof.dram else 0.0,
            "gr_engine_active": engine,
            "gpu_util": util,
            "mem_copy_util": _clip(prof.dram * 0.8),
            "fb_used_bytes": fb,
            "fb_total_bytes": _FB_TOTAL,
            "power_watts": power,
            "energy_joules": 1.0e6 * (i + 1) + self._energy[i],
            "temperature_celsius": 32.0 + power / 15.0 + self.extra_celsius,
            "sm_clock_hz": 1.98e9 if sm else 3.45e8,
            **_links(prof, sm),
        }

    def _raise_xid_once(self, i: int, m: dict[str, float]) -> None:
        """Put the XID into GPU ``i``'s reading ``m`` the first time it is due, never again."""
        if not self._xid_sent[i]:
            m["xid_last"] = XID_CODE
            self._xid_sent[i] = True

    def _process(self, i: int, dev: Device, fb_used_bytes: int) -> ProcessReading:
        """The job's process on GPU ``i``, holding all but 512 MiB of the GPU's used memory."""
        return ProcessReading(
            gpu_uuid=dev.uuid,
            pid=40_000 + i,
            fb_used_bytes=fb_used_bytes - 512 * 1024 * 1024,
            job_id=self._jobs[i],
            user=self.user_of(i),
            gpu_index=i,
        )

    def close(self) -> None:
        """Nothing to release."""


def _duty(prof: _Profile, sm: float) -> tuple[float, float]:
    """The engine's and the GPU's busy fractions (0..1) for a profile at SM activity ``sm``."""
    if prof.engine is None:
        return (_clip(sm + 0.03), 1.0) if sm else (0.0, 0.0)
    # A duty cycle of its own: kernels (or copies) run without filling the SMs.
    return prof.engine, 0.99 if prof.pcie_bytes_per_second else _clip(prof.engine * 1.1)


def _links(prof: _Profile, sm: float) -> dict[str, float]:
    """PCIe and NVLink bytes per second each way for a profile at SM activity ``sm``."""
    pcie = prof.pcie_bytes_per_second
    return {
        "pcie_tx_bytes_per_second": 2.0e8 * sm if pcie is None else pcie,
        "pcie_rx_bytes_per_second": 6.0e8 * sm if pcie is None else pcie,
        # Peer traffic of multi-GPU training; the single-GPU scenarios have none.
        "nvlink_tx_bytes_per_second": 4.0e10 * prof.tensor if prof.engine is None else 0.0,
        "nvlink_rx_bytes_per_second": 4.0e10 * prof.tensor if prof.engine is None else 0.0,
    }


def _clip(v: float) -> float:
    return 0.0 if v < 0.0 else 1.0 if v > 1.0 else v
