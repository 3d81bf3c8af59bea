"""Turning backend snapshots into wire-format batches (``service.wire``), encoded as gzipped JSON.

Batches are built as plain dicts rather than pydantic models: this runs every cycle on every node,
and tests check that what it builds validates against ``service.wire.IngestBatch``.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from service.collectors.backend import Device, Snapshot
from service.delivery import rfc3339
from service.vocabulary import INT_METRICS
from service.wire import MAX_BATCH_PROCESSES, MAX_BATCH_SAMPLES


def device_item(d: Device) -> dict[str, Any]:
    """The wire ``gpus`` item of a device."""
    return {
        "uuid": d.uuid,
        "index": d.index,
        "model": d.model,
        "fb_total_bytes": d.fb_total_bytes,
        "mig_parent_uuid": d.mig_parent_uuid,
        "lost": d.lost,
        "retired": d.retired,
        "pci_bus_id": d.pci_bus_id,
        "driver_version": d.driver_version,
    }


def build_batch(
    *,
    hostname: str,
    labels: Mapping[str, str],
    devices: Iterable[Device],
    snapshots: Iterable[Snapshot],
) -> dict[str, Any]:
    """One wire batch with the node, its devices and every reading and process of ``snapshots``."""
    samples: list[dict[str, Any]] = []
    processes: list[dict[str, Any]] = []
    for snap in snapshots:
        ts = rfc3339(snap.ts)
        for r in snap.readings:
            metrics = {k: (int(v) if k in INT_METRICS else v) for k, v in r.metrics.items()}
            samples.append(
                {"gpu_uuid": r.uuid, "ts": ts, "source": r.source.value, "metrics": metrics}
            )
        for p in snap.processes:
            processes.append(
                {
                    "gpu_uuid": p.gpu_uuid,
                    "ts": ts,
                    "pid": p.pid,
                    "fb_used_bytes": p.fb_used_bytes,
                    "job_id": p.job_id,
                    "user": p.user,
                }
            )
    return {
        "node": {"hostname": hostname, "labels": dict(labels)},
        "gpus": [device_item(d) for d in devices],
        "samples": samples,
        "processes": processes,
    }


def split_to_limits(batch: dict[str, Any]) -> list[dict[str, Any]]:
    """``batch`` cut into batches within central's per-batch limits of samples and processes."""
    samples, processes = batch["samples"], batch["processes"]
    if len(samples) <= MAX_BATCH_SAMPLES and len(processes) <= MAX_BATCH_PROCESSES:
        return [batch]
    parts: list[dict[str, Any]] = []
    count = max(-(-len(samples) // MAX_BATCH_SAMPLES), -(-len(processes) // MAX_BATCH_PROCESSES))
    for k in range(count):
        parts.append(
            batch
            | {
                "samples": samples[k * MAX_BATCH_SAMPLES : (k + 1) * MAX_BATCH_SAMPLES],
                "processes": processes[k * MAX_BATCH_PROCESSES : (k + 1) * MAX_BATCH_PROCESSES],
            }
        )
    return parts


def merge(batches: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One batch of several, oldest first: their samples and processes, the newest node and GPUs."""
    newest = batches[-1]
    return {
        "node": newest["node"],
        "gpus": newest["gpus"],
        "samples": [s for b in batches for s in b["samples"]],
        "processes": [p for b in batches for p in b["processes"]],
    }


def encode(batch: Mapping[str, Any], *, level: int = 1) -> bytes:
    """The gzip-compressed compact JSON of ``batch``."""
    raw = json.dumps(batch, separators=(",", ":")).encode()
    # Level 1: JSON of numbers compresses ~4x even so, at a fraction of the CPU of level 6.
    return zlib.compress(raw, level, wbits=16 + zlib.MAX_WBITS)


def decode(body: bytes) -> dict[str, Any]:
    """The batch inside a gzipped body (for the dead-letter file and tests)."""
    data: dict[str, Any] = json.loads(zlib.decompress(body, 16 + zlib.MAX_WBITS))
    return data
