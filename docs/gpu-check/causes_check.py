"""Real-GPU check of the causes: the real agent (NVML + GPM, 1 s) and a real central (SQLite).

Run on the device machine from the repository root (see docs/gpu-check/README.md):

    PHASES=idle_empty,idle_held,launch_bound PHASE_SECONDS=62 PART=a \
        python3 docs/gpu-check/causes_check.py OUT_DIR

A recording proxy between the agent and the central keeps every batch the agent shipped
(``causes_agent_output_<PART>.jsonl``, the raw samples). After the workload the causes the
central stored at ingest are read back and, leaving out the samples at phase boundaries, the
share of each phase's covered seconds in the expected cause is computed
(``causes_result_<PART>.json``).
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from service.costs.integrals import ActivityPoint, Thresholds, integrate
from service.core.diagnosis import Cause

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-check-out")
PART = os.environ.get("PART", "a")
PHASE_SECONDS = float(os.environ.get("PHASE_SECONDS", "62"))
PHASES = os.environ.get("PHASES", "idle_empty,idle_held").split(",")
TMP = Path("/tmp/gwc-" + PART)
BACKEND = os.environ.get("BACKEND", "nvml")  # "simulated" for a dry run without a GPU
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# A sample at ts describes the second before it (GPM differences two snapshots; the NVML
# duty cycle averages its last period): leave out the first LEAD seconds of each phase.
LEAD, TRAIL = 3.0, 0.5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli(*args: str, env: dict[str, str]) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "service.cli", *args], env=env, capture_output=True, text=True
    )
    if r.returncode != 0:
        raise SystemExit(f"gpuwarden {' '.join(args)} failed: {r.stderr}")
    return r.stdout.strip().splitlines()[-1]


def recording_proxy(central: str, record: Path) -> tuple[ThreadingHTTPServer, int]:
    """An HTTP server that writes each ingest batch (decompressed) to ``record`` and passes
    it on to the central service unchanged."""
    client = httpx.Client(timeout=30)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            data = gzip.decompress(body) if self.headers.get("Content-Encoding") == "gzip" else body
            with lock, record.open("ab") as fh:
                fh.write(data.strip() + b"\n")
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            try:
                r = client.post(central + self.path, content=body, headers=headers)
            except httpx.TransportError:  # a kept-alive connection the central closed: again
                r = client.post(central + self.path, content=body, headers=headers)
            self.send_response(r.status_code)
            self.send_header("Content-Type", r.headers.get("content-type", "application/json"))
            self.send_header("Content-Length", str(len(r.content)))
            self.end_headers()
            self.wfile.write(r.content)

        def log_message(self, *args: Any) -> None:
            pass

    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, port


def wait_healthy(url: str, tries: int = 150) -> None:
    """Poll ``url``/healthz, 0.2 s apart, until the central service answers 200."""
    for _ in range(tries):
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)


def start_agent(
    url: str,
    record: Path,
    *,
    token: str,
    node: str,
    backend: str,
    batch_seconds: int,
    tmp: Path,
    env: dict[str, str],
) -> tuple[ThreadingHTTPServer, subprocess.Popen[bytes]]:
    """The agent, polling every second and shipping every ``batch_seconds`` to ``url`` through
    a proxy that records its batches to ``record`` (emptied first); the proxy and the agent."""
    record.unlink(missing_ok=True)
    proxy, proxy_port = recording_proxy(url, record)
    agent = subprocess.Popen(
        [
            sys.executable, "-m", "service.cli", "agent",
            "--central-url", f"http://127.0.0.1:{proxy_port}", "--agent-token", token,
            "--backend", backend, "--interval-seconds", "1",
            "--batch-seconds", str(batch_seconds), "--node-name", node,
            "--spool-path", str(tmp / "spool.sqlite"),
            "--dead-letter-path", str(tmp / "dead.jsonl"),
        ],
        env=env,
    )  # fmt: skip
    return proxy, agent


def nvidia_smi_cards() -> str:
    """What ``nvidia-smi -L`` lists: the cards a check ran on (empty without a driver)."""
    return subprocess.run(
        "nvidia-smi -L || true", shell=True, capture_output=True, text=True
    ).stdout.strip()


def parse_ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def stored_samples(db: Path) -> list[dict[str, Any]]:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    rows = [dict(r) for r in con.execute("SELECT * FROM samples ORDER BY gpu_id, ts")]
    con.close()
    for r in rows:
        r["t"] = parse_ts(r["ts"])
    return rows


def judge(rows: list[dict[str, Any]], phases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per phase: covered seconds by stored cause, leaving out the boundary samples."""
    points = [
        ActivityPoint(r["t"], r["activity"], r["activity_rung"], r["cause"], r["power_watts"])
        for r in rows
    ]
    th = Thresholds()
    table = []
    for ph in phases:
        lo, hi = ph["start"] + LEAD, ph["end"] - TRAIL
        inside = [p for p in points if lo <= p.ts <= hi]
        integ = integrate(inside, lo, hi, th)
        by_cause = {k: round(v, 1) for k, v in integ.cause_seconds().items() if v}
        want = ph["cause"]
        right = integ.cause_seconds()[want]
        cov = integ.covered_seconds

        def median(name: str, members: list[dict[str, Any]]) -> float | None:
            vals = sorted(r[name] for r in members if r.get(name) is not None)
            return round(vals[len(vals) // 2], 4) if vals else None

        members = [r for r in rows if lo <= r["t"] <= hi]
        table.append(
            {
                "phase": ph["phase"],
                "expected": want,
                "samples": len(inside),
                "covered_seconds": round(cov, 1),
                "right_share": round(right / cov, 4) if cov else None,
                "by_cause": by_cause,
                "medians": {
                    m: median(m, members)
                    for m in (
                        "sm_active",
                        "gr_engine_active",
                        "gpu_util",
                        "tensor_active",
                        "dram_active",
                        "pcie_tx_bytes_per_second",
                        "pcie_rx_bytes_per_second",
                        "fb_used_bytes",
                        "power_watts",
                    )
                },  # fmt: skip
            }
        )
    return table


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    TMP.mkdir(parents=True, exist_ok=True)
    db = TMP / "gw.db"
    port = free_port()
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        GPUWARDEN_DATABASE_URL=f"sqlite:///{db}",
        GPUWARDEN_PORT=str(port),
        GPUWARDEN_ROLLUP_INTERVAL_SECONDS="5",
    )
    cli("migrate", env=env)
    agent_token = cli("token", "create", "--role", "agent", "--node", "h200-check", env=env)
    reader = cli("token", "create", "--role", "reader", env=env)
    central = subprocess.Popen([sys.executable, "-m", "service.cli", "serve"], env=env)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url)
    proxy, agent = start_agent(
        url, OUT / f"causes_agent_output_{PART}.jsonl", token=agent_token, node="h200-check",
        backend=BACKEND, batch_seconds=5, tmp=TMP, env=env,
    )  # fmt: skip
    time.sleep(4)  # the first poll primes GPM
    phases: list[dict[str, Any]] = []
    rest = [p for p in PHASES if p != "idle_empty"]
    if "idle_empty" in PHASES:  # before any CUDA context exists: nothing runs, nothing held
        t0 = time.time()
        time.sleep(PHASE_SECONDS)
        phases.append(
            {"phase": "idle_empty", "cause": "idle_empty", "start": t0, "end": time.time()}
        )
    if rest:
        phases_file = TMP / "phases.json"
        wl_env = dict(env, SLURM_JOB_ID="777", SLURM_JOB_USER="alice")
        subprocess.run(
            [sys.executable, str(HERE / "causes_workload.py"), str(PHASE_SECONDS),
             str(phases_file), *rest],
            env=wl_env, check=True,
        )  # fmt: skip
        phases += json.loads(phases_file.read_text())
    time.sleep(3)
    agent.send_signal(signal.SIGTERM)  # ships what it holds, then exits
    agent.wait(30)
    time.sleep(7)  # a rollup round
    jobs = httpx.get(url + "/api/v1/jobs", headers={"Authorization": f"Bearer {reader}"}).json()
    details = [
        httpx.get(
            f"{url}/api/v1/jobs/{j['id']}", headers={"Authorization": f"Bearer {reader}"}
        ).json()
        for j in jobs
    ]
    central.send_signal(signal.SIGTERM)
    central.wait(30)
    proxy.shutdown()
    rows = stored_samples(db)
    table = judge(rows, phases)
    result = {
        "part": PART,
        "phase_seconds": PHASE_SECONDS,
        "lead_seconds": LEAD,
        "nvidia_smi_L": nvidia_smi_cards(),
        "phases": phases,
        "table": table,
        "jobs": details,
        "stored_samples": len(rows),
        "causes": {int(c): c.label for c in Cause},
    }
    (OUT / f"causes_result_{PART}.json").write_text(json.dumps(result, indent=1, default=str))
    for t in table:
        print(
            f"{t['phase']:<24} want {t['expected']:<18} {t['samples']:>3} samples "
            f"{t['covered_seconds']:>6.1f} s right {t['right_share']}  {t['by_cause']}"
        )
        print("   ", t["medians"])


if __name__ == "__main__":
    main()
