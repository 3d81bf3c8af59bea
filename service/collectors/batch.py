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
from service.collectors.host_proc import host_fields
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
                    "sm_util": p.sm_util,
                    "mem_util": p.mem_util,
                    "job_id": p.job_id,
                    "user": p.user,
                    **host_fields(p.host),
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


_SAMPLES = b',"samples":['
_PROCESSES = b'],"processes":['


def poll_json(batch: Mapping[str, Any]) -> bytes:
    """The compact JSON of a batch built by ``build_batch`` (keys in its order), uncompressed."""
    return json.dumps(batch, separators=(",", ":")).encode()


def join_polls(bodies: Sequence[bytes]) -> bytes:
    """One batch of several ``poll_json`` bodies, oldest first, without parsing them.

    The node and GPUs come from the newest; samples and processes are concatenated. The markers
    cannot occur inside a JSON string (its quotes are escaped), and no other key holds a list
    named so, so the first occurrence of each is the top-level one.
    """
    if len(bodies) == 1:
        return bodies[0]
    samples: list[bytes] = []
    processes: list[bytes] = []
    head = b""
    for body in bodies:
        i = body.index(_SAMPLES) + len(_SAMPLES)
        j = body.index(_PROCESSES, i)
        head = body[:i]
        if j > i:
            samples.append(body[i:j])
        if len(body) - 2 > j + len(_PROCESSES):
            processes.append(body[j + len(_PROCESSES) : -2])
    return head + b",".join(samples) + _PROCESSES + b",".join(processes) + b"]}"


def gzip_body(raw: bytes) -> bytes:
    """``raw`` gzip-compressed at level 1, as the ingest endpoint takes it."""
    # Level 1: JSON of numbers compresses ~4x even so, at a fraction of the CPU of level 6.
    return zlib.compress(raw, 1, wbits=16 + zlib.MAX_WBITS)


def raw_json(body: bytes) -> bytes:
    """The JSON of a shipped or spooled body, gzip or plain."""
    return zlib.decompress(body, 16 + zlib.MAX_WBITS) if body[:2] == b"\x1f\x8b" else body


def encode(batch: Mapping[str, Any]) -> bytes:
    """The gzip-compressed compact JSON of ``batch``, as shipped."""
    return gzip_body(poll_json(batch))


def decode(body: bytes) -> dict[str, Any]:
    """The batch inside a shipped or spooled body, gzip or plain (dead letters, tests)."""
    data: dict[str, Any] = json.loads(raw_json(body))
    return data
