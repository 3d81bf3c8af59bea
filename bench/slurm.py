"""How long the Slurm prolog and epilog hold a job when central or nvidia-smi hangs.

The scripts (deploy/slurm) promise to delay a job by their budget (4 s) at most: against a
central that accepts connections and never answers, and an nvidia-smi that never returns,
each is run ``--runs`` times and its wall time printed (min / median / max). The tests check
that they return at all (tests/integration/test_slurm_scripts.py); this measures how fast.

Run: flock /tmp/bench.lock .venv/bin/python -m bench.slurm [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.slurm_support import CAPTURED_PROC, smi_stub

ROOT = Path(__file__).resolve().parents[1]
BUDGET_SECONDS = 4.0  # deploy/slurm/*.sh: the GPUWARDEN_SLURM_TIMEOUT_SECONDS default


@contextmanager
def hung_central() -> Iterator[str]:
    """A TCP server on loopback that accepts connections and never answers; yields its URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        sock.close()


def timed(script: str, env: dict[str, str]) -> float:
    """Seconds one run of deploy/slurm/``script`` took."""
    started = time.monotonic()
    subprocess.run(["bash", str(ROOT / "deploy" / "slurm" / script)], env=env,
                   capture_output=True, timeout=120, check=False)  # fmt: skip
    return time.monotonic() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    print(f"load average: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp, hung_central() as url:
        base = {"GPUWARDEN_ENV_FILE": f"{tmp}/missing.env", "GPUWARDEN_CENTRAL_URL": url,
                "GPUWARDEN_AGENT_TOKEN": "gw_x", "GPUWARDEN_NVIDIA_PROC": str(CAPTURED_PROC),
                "GPUWARDEN_SLURM_ACCOUNTS": f"{tmp}/no-accounts", "SLURM_JOB_ID": "17",
                "GPUWARDEN_JOB_END_DIR": f"{tmp}/job-ends",
                "SLURM_JOB_USER": "gina", "SLURM_JOB_GPUS": "0,1"}  # fmt: skip
        cases = {
            "prolog, hung central": ("prolog.sh", smi_stub(Path(tmp) / "ok")),
            "epilog, hung central": ("epilog.sh", smi_stub(Path(tmp) / "ok")),
            "prolog, hung nvidia-smi": ("prolog.sh", smi_stub(Path(tmp) / "hung", sleep=600)),
        }
        for name, (script, smi) in cases.items():
            env = base | {"GPUWARDEN_NVIDIA_SMI": str(smi)}
            runs = sorted(timed(script, env) for _ in range(args.runs))
            verdict = "met" if runs[-1] <= BUDGET_SECONDS + 1.5 else "MISSED"
            print(f"{name:26s} min {runs[0]:.2f} s  median {statistics.median(runs):.2f} s  "
                  f"max {runs[-1]:.2f} s  ({verdict}: budget {BUDGET_SECONDS:g} s + 1.5 s "
                  "for process starts)")  # fmt: skip
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
