"""A seeded, deterministic simulated fleet: the same seed and poll times give the same readings.

Scenarios per GPU: ``training`` (high SM and tensor activity), ``memory-bound`` (SM busy, DRAM
saturated, tensor idle), ``idle-held`` (a job's process holds memory and does nothing), ``idle``
(no process, nothing running) and ``xid-then-lost`` (trains, raises an XID, then falls off the bus).
Readings depend only on (seed, node, GPU, poll time), so a test can predict them.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from datetime import datetime

from service.collectors.backend import Device, GpuReading, ProcessReading, Snapshot
from service.vocabulary import ActivitySource

SCENARIOS: tuple[str, ...] = ("training", "memory-bound", "idle-held", "idle", "xid-then-lost")
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


_PROFILES: dict[str, _Profile] = {
    "training": _Profile(0.93, 0.85, 0.30, 62.0, 640.0, True),
    "memory-bound": _Profile(0.96, 0.0, 0.86, 40.0, 520.0, True),
    "idle-held": _Profile(0.0, 0.0, 0.0, 20.0, 115.0, True),
    "idle": _Profile(0.0, 0.0, 0.0, 0.5, 70.0, False),
    "xid-then-lost": _Profile(0.90, 0.80, 0.35, 55.0, 600.0, True),
}

XID_CODE = 79  # "GPU has fallen off the bus" is usually preceded by XID 79 itself


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
        lost_after_seconds: float = 900.0,
        job_base: int = 1000,
        model: str = _MODEL,
    ) -> None:
        picked = scenarios or [SCENARIOS[i % len(SCENARIOS)] for i in range(gpus)]
        unknown = set(picked) - set(SCENARIOS)
        if unknown:
            raise ValueError(f"unknown scenario(s) {sorted(unknown)}; choose from {SCENARIOS}")
        self.hostname = hostname
        self.seed = seed
        self.start = start
        self.xid_after_seconds = xid_after_seconds
        self.lost_after_seconds = lost_after_seconds
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
        self._jobs = [f"slurm:{job_base + _seed(seed, hostname) % 9000 + i}" for i in range(gpus)]
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

    def sample(self, now: datetime) -> Snapshot:
        """Readings for every GPU still on the bus at ``now``."""
        elapsed = (now - self.start).total_seconds()
        dt = 0.0 if self._last_ts is None else max(0.0, (now - self._last_ts).total_seconds())
        self._last_ts = now
        snap = Snapshot(ts=now)
        stamp = int(now.timestamp() * 1000)
        for i, dev in enumerate(self._devices):
            scenario = self.scenarios[i]
            if scenario == "xid-then-lost" and elapsed >= self.lost_after_seconds:
                dev.lost = True
            if i in self._forced_lost:
                dev.lost = True
            if dev.lost:
                continue
            prof = _PROFILES[scenario]
            rng = random.Random(_seed(self.seed, self.hostname, i, stamp))
            j = rng.random
            sm = _clip(prof.sm + (j() - 0.5) * 0.06) if prof.sm else 0.0
            power = prof.power_watts + (j() - 0.5) * 20.0
            self._energy[i] += power * dt
            fb = int(prof.fb_gib * GIB) + int(j() * 64) * 1024 * 1024
            m: dict[str, float] = {
                "sm_active": sm,
                "sm_occupancy": _clip(sm * 0.45),
                "tensor_active": _clip(prof.tensor + (j() - 0.5) * 0.06) if prof.tensor else 0.0,
                "dram_active": _clip(prof.dram + (j() - 0.5) * 0.06) if prof.dram else 0.0,
                "gr_engine_active": _clip(sm + 0.03) if sm else 0.0,
                "gpu_util": 1.0 if sm else 0.0,
                "mem_copy_util": _clip(prof.dram * 0.8),
                "fb_used_bytes": fb,
                "fb_total_bytes": _FB_TOTAL,
                "power_watts": power,
                "energy_joules": 1.0e6 * (i + 1) + self._energy[i],
                "temperature_celsius": 32.0 + power / 15.0,
                "sm_clock_hz": 1.98e9 if sm else 3.45e8,
                "pcie_tx_bytes_per_second": 2.0e8 * sm,
                "pcie_rx_bytes_per_second": 6.0e8 * sm,
                "nvlink_tx_bytes_per_second": 4.0e10 * prof.tensor,
                "nvlink_rx_bytes_per_second": 4.0e10 * prof.tensor,
            }
            if (
                scenario == "xid-then-lost"
                and elapsed >= self.xid_after_seconds
                and not self._xid_sent[i]
            ):
                m["xid_last"] = XID_CODE
                self._xid_sent[i] = True
            snap.readings.append(GpuReading(dev.uuid, m, ActivitySource.SIMULATED))
            if prof.has_job:
                snap.processes.append(
                    ProcessReading(
                        gpu_uuid=dev.uuid,
                        pid=40_000 + i,
                        fb_used_bytes=fb - 512 * 1024 * 1024,
                        job_id=self._jobs[i],
                        user=f"user{i % 3}",
                        gpu_index=i,
                    )
                )
        return snap

    def close(self) -> None:
        """Nothing to release."""


def _clip(v: float) -> float:
    return 0.0 if v < 0.0 else 1.0 if v > 1.0 else v
