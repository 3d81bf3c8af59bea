"""Ingest throughput over HTTP with agent-sized batches, against the direct-write ceiling.

Batches of 8 GPUs x 10 timestamps x 16 metrics (1,280 values), gzip-encoded as the agent sends them,
posted by client threads to `gpuwarden serve` (one uvicorn worker) on loopback. The ceiling writes the
same rows straight to the same database from one process: COPY on PostgreSQL, executemany in one
transaction on SQLite. Usage: python bench/ingest.py [--db sqlite|postgresql|both] [--seconds 20]
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import threading
import time
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import insert

from bench.common import fresh_database, gpuwarden, machine, peak_rss_mb, percentile, served
from service.db.engine import make_engine
from service.db.migrate import upgrade
from service.db.schema import samples
from service.vocabulary import METRIC_NAMES

GPUS, STAMPS, NODES = 8, 10, 32
METRICS = [m for m in METRIC_NAMES if m not in ("xid_last", "fb_total_bytes")][:16]


def metrics(rng: random.Random) -> dict[str, float | int]:
    out: dict[str, float | int] = {}
    for m in METRICS:
        if m.endswith("_bytes") or m.endswith("_second"):
            out[m] = rng.randrange(0, 80 * 2**30)
        elif m == "temperature_celsius":
            out[m] = rng.uniform(30, 90)
        elif m in ("power_watts", "sm_clock_hz", "energy_joules"):
            out[m] = rng.uniform(50, 700)
        else:
            out[m] = rng.random()
    return out


def make_batches(n: int, now: datetime) -> list[tuple[int, bytes, list[dict[str, object]]]]:
    """``n`` distinct gzip bodies (node index, body, the sample rows for the ceiling run)."""
    rng = random.Random(42)
    out = []
    for k in range(n):
        node = k % NODES
        # each node's batches step back 10 x 10 s so no two batches share (gpu, ts)
        base = now - timedelta(seconds=(k // NODES + 1) * STAMPS * 10)
        gpus = [f"GPU-{node:03d}-{g}" for g in range(GPUS)]
        body = {
            "node": {"hostname": f"node-{node:03d}", "labels": {}},
            "gpus": [
                {
                    "uuid": u,
                    "index": i,
                    "model": "NVIDIA H100 80GB HBM3",
                    "fb_total_bytes": 80 * 2**30,
                }
                for i, u in enumerate(gpus)
            ],
            "samples": [
                {
                    "gpu_uuid": u,
                    "ts": (base + timedelta(seconds=10 * s)).isoformat(),
                    "source": "gpm",
                    "metrics": metrics(rng),
                }
                for s in range(STAMPS)
                for u in gpus
            ],
        }
        out.append((node, gzip.compress(json.dumps(body).encode(), 1), body["samples"]))
    return out


def run_http(url: str, seconds: float, threads: int) -> dict[str, float]:
    tokens = [
        gpuwarden(url, "token", "create", "--role", "agent", "--node", f"node-{i:03d}")
        .strip()
        .splitlines()[-1]
        for i in range(NODES)
    ]
    now = datetime.now(UTC)
    # enough distinct batches for the run at up to ~300 batches/s, within the 7-day retention
    batches = make_batches(int(seconds * 300), now)
    latencies: list[float] = []
    lock = threading.Lock()
    next_idx = [0]
    errors = [0]
    with served(url) as (base, proc):
        stop = time.monotonic() + seconds

        def worker() -> None:
            with httpx.Client(base_url=base, timeout=30) as client:
                while time.monotonic() < stop:
                    with lock:
                        i = next_idx[0]
                        next_idx[0] += 1
                    if i >= len(batches):
                        return
                    node, body, _ = batches[i]
                    t0 = time.perf_counter()
                    r = client.post(
                        "/api/v1/ingest",
                        content=body,
                        headers={
                            "Authorization": f"Bearer {tokens[node]}",
                            "Content-Encoding": "gzip",
                            "Content-Type": "application/json",
                        },
                    )
                    dt = time.perf_counter() - t0
                    with lock:
                        if r.status_code == 200:
                            latencies.append(dt)
                        else:
                            errors[0] += 1

        t0 = time.perf_counter()
        pool = [threading.Thread(target=worker) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        elapsed = time.perf_counter() - t0
        rss = peak_rss_mb(proc.pid)
    if not latencies:
        raise RuntimeError(f"no batch was accepted ({errors[0]} errors)")
    values = len(latencies) * GPUS * STAMPS * len(METRICS)
    return {
        "batches": len(latencies),
        "errors": errors[0],
        "values_per_second": values / elapsed,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "peak_rss_mb": rss,
    }


def run_ceiling(url: str, n_batches: int) -> float:
    """Metric values per second written straight to the database from one process."""
    engine = make_engine(url)
    upgrade(engine)
    now = datetime.now(UTC)
    batches = make_batches(n_batches, now)
    rows = []
    for node, _, sample_list in batches:
        for g, s in enumerate(sample_list):
            row = {m: None for m in METRIC_NAMES}
            row.update(s["metrics"])  # type: ignore[arg-type]
            row.update(
                gpu_id=node * GPUS + g % GPUS + 1, ts=datetime.fromisoformat(s["ts"]), source="gpm"
            )  # type: ignore[arg-type]
            rows.append(row)
    # de-duplicate on the primary key (the synthetic ids above can collide across batches)
    rows = list({(r["gpu_id"], r["ts"]): r for r in rows}.values())
    t0 = time.perf_counter()
    if engine.dialect.name == "postgresql":
        from service.db import partitions

        with engine.begin() as conn:
            partitions.ensure_partitions(conn, {r["ts"].date() for r in rows})  # type: ignore[union-attr]
        cols = ["gpu_id", "ts", "source", *METRIC_NAMES]
        raw = engine.raw_connection()
        t0 = time.perf_counter()
        with raw.cursor() as cur, cur.copy(f"COPY samples ({', '.join(cols)}) FROM STDIN") as copy:  # type: ignore[attr-defined]
            for r in rows:
                copy.write_row([r[c] for c in cols])
        raw.commit()
        raw.close()
    else:
        with engine.begin() as conn:
            conn.execute(insert(samples), rows)
    elapsed = time.perf_counter() - t0
    engine.dispose()
    return len(rows) * len(METRICS) / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--threads", type=int, default=4)
    args = p.parse_args()
    print(f"machine: {machine()}")
    print(
        f"batch: {GPUS} GPUs x {STAMPS} timestamps x {len(METRICS)} metrics = {GPUS * STAMPS * len(METRICS)} values, gzip"
    )
    for kind in ["sqlite", "postgresql"] if args.db == "both" else [args.db]:
        with fresh_database(kind) as url:
            gpuwarden(url, "migrate")
            res = run_http(url, args.seconds, args.threads)
        with fresh_database(kind) as url:
            ceiling = run_ceiling(url, max(res["batches"], 200))
        print(
            f"{kind:10s} http: {res['values_per_second']:>9,.0f} values/s  "
            f"({res['batches']} batches, {res['errors']} errors)  "
            f"p50 {res['p50_ms']:.1f} ms  p99 {res['p99_ms']:.1f} ms  "
            f"server peak RSS {res['peak_rss_mb']:.0f} MiB"
        )
        print(
            f"{kind:10s} ceiling (direct {'COPY' if kind == 'postgresql' else 'executemany'}): "
            f"{ceiling:>9,.0f} values/s  ratio http/ceiling {res['values_per_second'] / ceiling:.2f}"
        )


if __name__ == "__main__":
    main()
