"""A few KB of gzip that expands to megabytes of bad samples: cost to the central service.

Starts ``gpuwarden serve`` on SQLite in a subprocess, sends N such bodies at once with an agent
token, and prints per-request seconds, answer bytes, the server's peak RSS and the slowest
``/healthz`` answer while they ran.

Run: .venv/bin/python bench/ingest_bomb.py [--parallel 4] [--target-gzip-bytes 2986]
(with PYTHONPATH pointing at another checkout it measures that code instead).
"""

from __future__ import annotations

import argparse
import gzip
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

# service.cli.main:main today; service.cli:main in older checkouts (to measure "before").
SERVE = (
    "import sys\n"
    "try:\n    from service.cli.main import main\n"
    "except ImportError:\n    from service.cli import main\n"
    "sys.exit(main(sys.argv[1:]))"
)
BAD = '{"gpu_uuid":"GPU-a0","ts":"not a time","metrics":{"sm_active":"x"}},'


def bomb(kind: str, target_gzip_bytes: int) -> tuple[bytes, int]:
    """A gzip body of about ``target_gzip_bytes`` and its expanded size.

    ``string``: one long invalid hostname (a 422 that used to echo all of it back);
    ``label``: one long node label value (used to be stored); ``items``: many invalid samples;
    ``empty``: a million empty samples (3 KB of gzip, 150 MiB once parsed).
    """
    n = 1000
    while True:
        if kind == "empty":
            text = '{"node":{"hostname":"node-a"},"samples":[' + "{}," * n * 100 + "{}]}"
        elif kind == "items":
            text = '{"node":{"hostname":"node-a"},"samples":[' + BAD * n + BAD[:-1] + "]}"
        elif kind == "container":
            text = '{"node":{"hostname":"node-a"},"samples":{"a":"' + "a" * n * 100 + '"}}'
        elif kind == "label":
            text = '{"node":{"hostname":"node-a","labels":{"a":"' + "a" * n * 100 + '"}}}'
        else:
            text = '{"node":{"hostname":"' + "a" * n * 100 + '"}}'
        body = gzip.compress(text.encode(), 9)
        if len(body) >= target_gzip_bytes:
            return body, len(text)
        n = int(n * 1.05) + 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--target-gzip-bytes", type=int, default=2986)
    ap.add_argument(
        "--kind", choices=("string", "container", "label", "items", "empty"), default="items"
    )
    args = ap.parse_args()

    body, expanded = bomb(args.kind, args.target_gzip_bytes)
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GPUWARDEN_DATABASE_URL": f"sqlite:///{tmp}/bomb.db"}
        run = [sys.executable, "-c", SERVE]
        # cwd=tmp: ``python -c`` puts the working directory first on sys.path, ahead of PYTHONPATH.
        subprocess.run([*run, "migrate"], env=env, check=True, capture_output=True, cwd=tmp)
        made = subprocess.run(
            [*run, "token", "create", "--role", "agent", "--node", "node-a"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
            cwd=tmp,
        )
        token = made.stdout.strip().splitlines()[-1]
        port = free_port()
        server = subprocess.Popen(
            [*run, "serve", "--port", str(port)],
            env={**env, "GPUWARDEN_RUN_SCHEDULER": "false", "GPUWARDEN_LOG_LEVEL": "WARNING"},
            cwd=tmp,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            rss_before = rss_mib(server.pid)
            results: list[tuple[float, int, int]] = []
            health: list[float] = []
            done = threading.Event()

            def send() -> None:
                headers = {"Authorization": f"Bearer {token}", "Content-Encoding": "gzip",
                           "Content-Type": "application/json"}  # fmt: skip
                t0 = time.monotonic()
                r = httpx.post(base + "/api/v1/ingest", content=body, headers=headers, timeout=120)
                results.append((time.monotonic() - t0, r.status_code, len(r.content)))

            def probe() -> None:
                while not done.is_set():
                    t0 = time.monotonic()
                    httpx.get(base + "/healthz", timeout=120)
                    health.append(time.monotonic() - t0)
                    time.sleep(0.05)

            prober = threading.Thread(target=probe)
            prober.start()
            senders = [threading.Thread(target=send) for _ in range(args.parallel)]
            t0 = time.monotonic()
            for s in senders:
                s.start()
            for s in senders:
                s.join()
            wall = time.monotonic() - t0
            done.set()
            prober.join()
            print(f"{args.kind} body: {len(body)} bytes gzip, {expanded / 1e6:.1f} MB expanded")
            print(f"{args.parallel} at once: wall {wall:.2f} s")
            for seconds, code, size in results:
                print(f"  {code} in {seconds:.2f} s, answer {size} bytes")
            print(
                f"server RSS: {rss_before:.0f} MiB before, peak {peak_rss_mib(server.pid):.0f} MiB"
            )
            slowest = max(health, default=float("nan"))
            print(f"/healthz meanwhile: slowest {slowest:.3f} s over {len(health)} probes")
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
