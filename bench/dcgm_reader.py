"""The agent's dcgm-exporter backend: CPU per GPU per cycle with its own line reader, beside
prometheus_client's text parser on the same text.

The text is what a stock dcgm-exporter (NVIDIA's default counters file,
tests/data/dcgm-exporter/default-counters.csv, plus SM_ACTIVE and SM_OCCUPANCY as
deploy/dcgm-exporter/gpuwarden-counters.csv adds them) writes for ``--gpus`` GPUs of one node
in Kubernetes mode, half of them held by a pod: a HELP and TYPE line per field, a line per GPU
per field with the exporter's labels. Each cycle is one ``sample`` of the backend (scrape over
an in-process transport, parse, map to readings); the two readers' readings are checked equal
first. Target: under 0.5 ms of CPU per GPU per cycle.

    .venv/bin/python -m bench.dcgm_reader
    .venv/bin/python -m bench.dcgm_reader --gpus 8 --cycles 300
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from unittest import mock

import httpx

from bench.common import machine
from service.collectors import dcgm_exporter
from service.collectors.dcgm_exporter import DcgmExporterBackend, parse_with_prometheus_client
from service.collectors.mig import MigIdentities

COUNTERS = Path(__file__).resolve().parents[1] / "tests/data/dcgm-exporter/default-counters.csv"
EXTRA = [
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge", "Ratio of cycles an SM has at least 1 warp assigned."),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "Ratio of number of warps resident on an SM."),
]
TARGET_MS = 0.5


def fields() -> list[tuple[str, str, str]]:
    """(field, type, help) of the default counters file and the two activity fields."""
    out = []
    for line in COUNTERS.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, kind, text = (part.strip() for part in line.split(",", 2))
        if kind != "label":
            out.append((name, kind, text))
    return out + EXTRA


def exposition(gpus: int) -> str:
    """dcgm-exporter's /metrics for ``gpus`` H100s of node ``gpu-node-017``."""
    lines = []
    for k, (name, kind, text) in enumerate(fields()):
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        for g in range(gpus):
            labels = (
                f'gpu="{g}",UUID="GPU-{g:08x}-79ca-0599-5140-4ffdb131ae93",'
                f'pci_bus_id="00000000:{0x1A + g:02X}:00.0",device="nvidia{g}",'
                f'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-017",'
                f'DCGM_FI_DRIVER_VERSION="550.54.15"'
            )
            if g % 2 == 0:
                labels += f',container="trainer",namespace="ml",pod="train-{g // 2}-0"'
            value = f"{(k * 7 + g * 13) % 100 / 100:.6f}" if "PROF" in name else str(k * g + 40)
            lines.append(f"{name}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


def cpu_ms_per_gpu(sample: Callable[[], object], gpus: int, cycles: int) -> float:
    """Best of five runs of ``cycles`` samples: CPU ms per GPU per cycle."""
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(cycles):
            sample()
        best = min(best, (time.process_time() - t0) * 1000 / cycles / gpus)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--cycles", type=int, default=100)
    args = parser.parse_args()
    text = exposition(args.gpus)
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text=text))
    backend = DcgmExporterBackend(
        url="http://exporter:9400/metrics", client=httpx.Client(transport=transport)
    )
    now = datetime.now(UTC)
    new = backend.sample(now)
    with mock.patch.object(dcgm_exporter, "parse_exposition", parse_with_prometheus_client):
        old = backend.sample(now)
        assert repr(old) == repr(new), "the two readers' readings differ"
        old_ms = cpu_ms_per_gpu(lambda: backend.sample(now), args.gpus, args.cycles)
    new_ms = cpu_ms_per_gpu(lambda: backend.sample(now), args.gpus, args.cycles)
    mig = MigIdentities()
    reader_ms = cpu_ms_per_gpu(
        lambda: dcgm_exporter.parse_exposition(text, mig), args.gpus, args.cycles
    )
    parser_ms = cpu_ms_per_gpu(
        lambda: parse_with_prometheus_client(text, mig), args.gpus, args.cycles
    )
    lines = sum(1 for line in text.splitlines() if not line.startswith("#"))
    print(f"dcgm-exporter backend, {args.gpus} GPUs, {lines} sample lines a scrape, {machine()}")
    print(f"load average: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    print(f"{'CPU ms per GPU per cycle (best of 5)':<44} {'reader':>8} {'parser':>8} {'ratio':>6}")
    print(f"{'backend sample (scrape, parse, readings)':<44} {new_ms:>8.3f} {old_ms:>8.3f} "
          f"{new_ms / old_ms:>6.2f}")  # fmt: skip
    print(f"{'parse alone':<44} {reader_ms:>8.3f} {parser_ms:>8.3f} "
          f"{reader_ms / parser_ms:>6.2f}")  # fmt: skip
    verdict = "met" if new_ms < TARGET_MS else "MISSED"
    print(f"target {TARGET_MS} ms per GPU per cycle: {verdict} ({new_ms:.3f} ms)")


if __name__ == "__main__":
    main()
