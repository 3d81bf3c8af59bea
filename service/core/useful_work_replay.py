"""The useful-work verdicts replayed over recorded agent batches (docs/gpu-check/useful/): the
real-GPU check and CI read the same recording through these functions.

Pure: the recording's text (one wire batch per line) and the phases in; per GPU its samples and
its processes' host side, and per phase the share of its GPU-seconds after the hold that the
sliding verdict called sham or hung.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from service.core.useful_work import GpuPoint, HostPoint, Kind, Rules, Verdict, sliding

Recorded = dict[str, tuple[list[GpuPoint], list[HostPoint]]]


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def recorded_points(text: str) -> Recorded:
    """Per GPU uuid, its samples and its processes' host readings, each in time order."""
    out: Recorded = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        batch = json.loads(line)
        for s in batch["samples"]:
            out.setdefault(s["gpu_uuid"], ([], []))[0].append(GpuPoint(_ts(s["ts"]), s["metrics"]))
        for p in batch["processes"]:
            if p.get("host_read_bytes") is None:
                continue
            out.setdefault(p["gpu_uuid"], ([], []))[1].append(
                HostPoint(
                    ts=_ts(p["ts"]),
                    cpu_seconds=p["host_cpu_seconds"],
                    read_bytes=p["host_read_bytes"],
                    write_bytes=p["host_write_bytes"],
                    voluntary_switches=p["host_voluntary_switches"],
                    children=p["host_children"],
                    pid=p["pid"],
                )
            )
    for gpu, host in out.values():
        gpu.sort(key=lambda g: g.ts)
        host.sort(key=lambda h: h.ts)
    return out


def verdicts_of(recorded: Recorded, rules: Rules) -> list[tuple[GpuPoint, Verdict]]:
    """Every sample of every GPU with the verdict on the window that ends there."""
    out: list[tuple[GpuPoint, Verdict]] = []
    for gpu, host in recorded.values():
        out += zip(gpu, sliding(gpu, host, rules=rules), strict=True)
    return out


def phase_shares(
    recorded: Recorded, phases: Sequence[Mapping[str, Any]], rules: Rules
) -> list[dict[str, Any]]:
    """Per phase: its samples from ``hold_seconds`` after its start to its end, how many of
    each kind, and the share sham or hung; with the words of the last such verdict."""
    judged = verdicts_of(recorded, rules)
    table = []
    for ph in phases:
        lo, hi = ph["start"] + rules.hold_seconds, ph["end"] - 0.5
        inside = [(p, v) for p, v in judged if lo <= p.ts <= hi]
        kinds = Counter(v.kind.value for _, v in inside)
        waste = sum(1 for _, v in inside if v.kind in (Kind.SHAM, Kind.HUNG))
        said = [v.words for _, v in inside if v.kind in (Kind.SHAM, Kind.HUNG)]
        other = [v.words for _, v in inside if v.kind not in (Kind.SHAM, Kind.HUNG)]
        table.append(
            {
                "phase": ph["phase"],
                "want": ph["want"],
                "samples": len(inside),
                "kinds": dict(sorted(kinds.items())),
                "waste_share": round(waste / len(inside), 4) if inside else None,
                "words": said[-1] if said else (other[-1] if other else ""),
            }
        )
    return table
