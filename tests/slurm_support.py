"""Helpers for the Slurm tests: NVIDIA driver stand-ins built from captured output, known GPUs."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy import Engine

from service.clock import utc_now
from tests.integration.cost_data import store_series
from tests.support import FakeClock

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "nvidia"
CAPTURED_CSV = DATA / "nvidia-smi-index-uuid-bus.csv"
CAPTURED_PROC = DATA / "proc-gpus"
# The two GPUs of the captured host, in nvidia-smi's index order (PCI order).
GTX_1080_TI = "GPU-e953c3c5-dba7-029e-ce44-7b51417131df"
TITAN_X = "GPU-4ce175fe-a313-4c4a-d620-560e96e8ef2e"
_TEMPLATE = (CAPTURED_PROC / "0000:17:00.0" / "information").read_text().splitlines()


def smi_stub(bin_dir: Path, csv: Path = CAPTURED_CSV, *, sleep: float = 0) -> Path:
    """A stand-in nvidia-smi in ``bin_dir`` printing ``csv`` for the prolog's one query."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    stub = bin_dir / "nvidia-smi"
    stub.write_text(
        "#!/bin/bash\n"
        f"sleep {sleep}\n"
        'case "$*" in *--query-gpu=index,uuid,pci.bus_id*--format=csv,noheader*) ;;'
        ' *) echo "unexpected arguments: $*" >&2; exit 2;; esac\n'
        f"cat {csv}\n"
    )
    stub.chmod(0o755)
    return stub


def fake_driver(out: Path, gpus: list[tuple[str, str, int]]) -> tuple[Path, Path]:
    """/proc/driver/nvidia/gpus and nvidia-smi CSV for ``gpus`` (uuid, bus, device minor).

    Each information file is the captured one with its UUID, bus and minor lines replaced;
    nvidia-smi numbers the GPUs in the order given (PCI order). Returns (proc dir, csv file).
    """
    proc = out / "proc-gpus"
    rows = []
    for index, (uuid, bus, minor) in enumerate(gpus):
        values = {"GPU UUID:": uuid, "Bus Location:": bus, "Device Minor:": str(minor)}
        lines = []
        for line in _TEMPLATE:
            key = next((k for k in values if line.startswith(k)), None)
            lines.append(f"{key} \t {values[key]}" if key else line)
        (proc / bus).mkdir(parents=True)
        (proc / bus / "information").write_text("\n".join(lines) + "\n")
        rows.append(f"{index}, {uuid}, 0000{bus.upper()}\n")
    csv = out / "nvidia-smi.csv"
    csv.write_text("".join(rows))
    return proc, csv


def know_gpus(engine: Engine, clock: FakeClock, uuids: list[str], hostname: str = "node-a") -> None:
    """The central has seen ``uuids`` on ``hostname``; its clock then follows the real one."""
    # The scripts date a job with the machine's clock; an agent token may only register a start
    # within the last hour, for GPUs its node has reported.
    clock.set(utc_now().replace(microsecond=0) - timedelta(minutes=5))
    for i, uuid in enumerate(uuids):
        store_series(
            engine, clock, uuid=uuid, index=i, start=clock(), metrics=[{"sm_active": 0.1}],
            hostname=hostname,
        )  # fmt: skip
    clock.advance(300)
