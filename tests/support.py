"""Test helpers shared by the suites: a scripted clock, a live server, batch builders."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import yaml
from fastapi import FastAPI
from sqlalchemy import Engine, insert

from service.db.schema import gpus, job_gpus, jobs, nodes
from service.delivery import rfc3339


class FakeClock:
    """A clock that only moves when a test moves it."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 12, 2, 8, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now

    def set(self, when: datetime) -> None:
        self.now = when


@contextmanager
def every(seconds: float, step: Callable[[], None], *, first_after: float = 0.0) -> Iterator[None]:
    """Call ``step`` in a daemon thread every ``seconds`` (the first time after ``first_after``)
    while the block runs; stopped and joined (15 s at most) when it ends."""
    stop_event = threading.Event()

    def run() -> None:
        wait = first_after
        while not stop_event.wait(wait):
            step()
            wait = seconds

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop_event.set()
        thread.join(15)


# Under pytest-xdist each worker hands out ports from its own block below the kernel's
# ephemeral range (32768 and up), so a port one worker picked and has not bound yet is never
# picked by another; each block is walked in turn, so a test's second port is not its first.
_PORT_BLOCK = 3000
_PORT_BASE = 20000
_next_port: list[int] = []


def _worker_index() -> int | None:
    """This process's pytest-xdist worker number (gw0 -> 0), None when not under xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else None


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port on loopback that is free right now (and, under pytest-xdist, one no other
    worker is handed)."""
    index = _worker_index()
    if index is None or index >= (32768 - _PORT_BASE) // _PORT_BLOCK:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    low = _PORT_BASE + index * _PORT_BLOCK
    if not _next_port:
        _next_port.append(low + os.getpid() % _PORT_BLOCK)
    for _ in range(_PORT_BLOCK):
        port = low + (_next_port[0] - low) % _PORT_BLOCK
        _next_port[0] = port + 1
        if _bindable(port):
            return port
    raise RuntimeError(f"no free port in {low}-{low + _PORT_BLOCK - 1}")


class _QuickStopServer(uvicorn.Server):
    """uvicorn's server that notices ``should_exit`` within 10 ms and drains its connections by
    polling every 5 ms; uvicorn ticks every 100 ms and sleeps another 100 ms on the way out,
    about 0.15 s a test that serves the app."""

    async def main_loop(self) -> None:
        """uvicorn's loop at a 10 ms tick (its date header still follows the wall clock)."""
        counter = 0
        while not await self.on_tick(counter):
            await asyncio.sleep(0.01)
            counter = (counter + 1) % 864000

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's graceful shutdown: stop listening, close idle connections, let requests in
        flight finish, then the app's lifespan shutdown."""
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        while self.server_state.connections or self.server_state.tasks:
            await asyncio.sleep(0.005)
        for server in self.servers:
            await server.wait_closed()
        await self.lifespan.shutdown()


@contextmanager
def live_server(app: FastAPI, port: int | None = None) -> Iterator[str]:
    """Serve ``app`` with uvicorn on loopback in a thread; yields its base URL."""
    port = port or free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        proxy_headers=False,  # as `gpuwarden serve`: GPUWARDEN_TRUSTED_PROXIES decides
    )
    server = _QuickStopServer(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def iso(ts: datetime) -> str:
    """RFC 3339 text of ``ts`` (the service's one formatter)."""
    return rfc3339(ts)


def make_batch(
    *,
    hostname: str = "node-a",
    gpu_uuids: tuple[str, ...] = ("GPU-a0",),
    start: datetime,
    count: int = 1,
    interval_seconds: float = 10.0,
    metrics: dict[str, Any] | None = None,
    model: str = "NVIDIA H100 80GB HBM3",
) -> dict[str, Any]:
    """A wire-format batch: ``count`` samples per GPU, ``interval_seconds`` apart from ``start``."""
    metrics = metrics if metrics is not None else {"sm_active": 0.5, "fb_used_bytes": 2**30}
    return {
        "node": {"hostname": hostname, "labels": {"rack": "r1"}},
        "gpus": [
            {"uuid": u, "index": i, "model": model, "fb_total_bytes": 80 * 2**30}
            for i, u in enumerate(gpu_uuids)
        ],
        "samples": [
            {
                "gpu_uuid": u,
                "ts": iso(start + timedelta(seconds=k * interval_seconds)),
                "metrics": metrics,
            }
            for k in range(count)
            for u in gpu_uuids
        ],
    }


def self_signed_cert(tmp: Path, host: str) -> tuple[Path, Path]:
    """A throw-away certificate and key for ``host`` (openssl); returns (cert.pem, key.pem)."""
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", f"/CN={host}", "-addext", f"subjectAltName=DNS:{host}",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


@contextmanager
def prometheus_server(tmp_path: Path, config: dict[str, Any]) -> Iterator[str]:
    """A real Prometheus on loopback running ``config`` from ``tmp_path``; yields its base URL."""
    assert Path(PROMETHEUS).exists(), "prometheus is needed (Debian package prometheus)"
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((tmp_path / "prometheus.log").read_text())
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def prometheus_query(prom: str, promql: str, *, timeout_s: float = 60) -> list[dict[str, Any]]:
    """The instant-vector result of ``promql``, waiting until it is non-empty."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = httpx.get(f"{prom}/api/v1/query", params={"query": promql}, timeout=5)
        r.raise_for_status()
        result: list[dict[str, Any]] = r.json()["data"]["result"]
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.25)


DOCS = Path(__file__).resolve().parents[1] / "docs"


def doc_block(doc: str, after_heading: str, lang: str) -> str:
    """The first ``lang`` code block after ``after_heading`` in docs/``doc``."""
    text = (DOCS / doc).read_text()
    section = text[text.index(after_heading) :]
    found = re.search(rf"```{lang}\n(.*?)```", section, re.S)
    assert found is not None, (doc, after_heading, lang)
    return found.group(1)


def query_field(r: httpx.Response) -> str:
    """The query parameter a 422 answer names (asserting that it is one)."""
    assert r.status_code == 422, r.text
    loc = r.json()["detail"][0]["loc"]
    assert loc[0] == "query", r.text
    return str(loc[1])


def auth(token: str) -> dict[str, str]:
    """The Authorization header of a bearer ``token``."""
    return {"Authorization": f"Bearer {token}"}


# One GPU's readings under a keep-alive loop: half the time busy on fp32 maths, memory flat, a
# trickle of PCIe (the useful-work tests' sham GPU).
KEEP_ALIVE = {
    "sm_active": 0.48,
    "gr_engine_active": 0.5,
    "gpu_util": 0.5,
    "tensor_active": 0.0,
    "fb_used_bytes": 2 * 2**30,
    "pcie_tx_bytes_per_second": 1e6,
    "pcie_rx_bytes_per_second": 5e6,
}


def job_alert(**fields: object) -> dict[str, object]:
    """A firing alert on launch-bound job slurm:7 as a notification's fields, ``fields`` over them."""
    return {
        "delivery_id": "msg_1",
        "kind": "firing",
        "status": "firing",
        "policy": "launch-bound-job",
        "severity": "warning",
        "metric": "cause:launch_bound",
        "aggregate": "avg",
        "window": "30m",
        "op": ">",
        "threshold": 0.5,
        "value": 0.8,
        "scope": "job",
        "scope_key": "slurm:7",
        "labels": {"job_id": "slurm:7"},
        "active_since": datetime(2026, 12, 3, 8, tzinfo=UTC),
    } | fields


SEED_AT = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)


def store_a_job_on_a_gpu(engine: Engine) -> int:
    """A node, a GPU and a job on it (its job_gpus row marks a day dirty); the node's id."""
    with engine.begin() as conn:
        node_id = conn.execute(
            insert(nodes)
            .values(hostname="n1", labels={}, first_seen_at=SEED_AT, last_seen_at=SEED_AT)
            .returning(nodes.c.id)
        ).scalar_one()
        gpu_id = conn.execute(
            insert(gpus)
            .values(uuid="GPU-0", node_id=node_id, gpu_index=0, model="H100", first_seen_at=SEED_AT)
            .returning(gpus.c.id)
        ).scalar_one()
        conn.execute(
            insert(jobs).values(
                id="slurm:1",
                labels={},
                source="api",
                started_at=SEED_AT,
                created_at=SEED_AT,
                updated_at=SEED_AT,
            )
        )
        conn.execute(
            insert(job_gpus).values(
                job_id="slurm:1", gpu_id=gpu_id, started_at=SEED_AT, source="api"
            )
        )
    return int(node_id)
