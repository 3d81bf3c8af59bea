"""Helpers shared by the benchmarks: fresh databases, a served central process, RSS readings."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg

PG_ADMIN = os.environ.get("GPUWARDEN_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def machine() -> str:
    """A one-line description of the machine the numbers came from."""
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}"


@contextmanager
def fresh_database(kind: str, admin_url: str = PG_ADMIN) -> Iterator[str]:
    """A new, empty database URL of ``kind`` (sqlite or postgresql), removed afterwards."""
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as d:
            yield f"sqlite:///{d}/bench.db"
        return
    name = f"gpuwarden_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield (
            admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
            + "/"
            + name
        )
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gpuwarden(url: str, *args: str) -> str:
    """Run a gpuwarden sub-command against ``url`` and return its stdout."""
    env = {**os.environ, "GPUWARDEN_DATABASE_URL": url}
    out = subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout


@contextmanager
def served(url: str, **env_extra: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``gpuwarden serve`` on a free loopback port (one uvicorn worker); yields (base URL, process)."""
    port = free_port()
    env = {
        **os.environ,
        "GPUWARDEN_DATABASE_URL": url,
        "GPUWARDEN_PORT": str(port),
        "GPUWARDEN_LOG_LEVEL": "WARNING",
        **env_extra,
    }
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve"], env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120  # a loaded machine starts it slowly
    while True:
        try:
            if httpx.get(f"{base}/readyz").status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError("central service did not start")
        time.sleep(0.1)
    try:
        yield base, proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)  # a rollup in progress finishes its transaction first
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def peak_rss_mb(pid: int) -> float:
    """The peak resident set size of process ``pid`` so far, in MiB (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) of ``values`` by nearest rank."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]
