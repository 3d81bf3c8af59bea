"""Ingest throughput over HTTP with agent-sized batches, against the direct-write ceiling.

Batches of --gpus GPUs x --stamps timestamps x 16 metrics (default 8 x 10: 1,280 values),
gzip-encoded as the agent sends them, posted by client threads to `gpuwarden serve` on loopback:
--workers 1,2,4 runs one figure per count of `gpuwarden serve` processes on one database (each
on its own port, the clients spread batches over them as a load balancer would). Each figure is
given twice: for what was accepted during the run, and once the rollups it caused are counted
(values over the time until the last dirty minute was rolled up; the rollup job ticks every
--rollup-seconds). The ceiling, in the same run, writes the same rows straight to the same
database from one Python process: binary COPY on PostgreSQL (text COPY also printed),
executemany in one transaction on SQLite.
--upkeep K runs the rollups and other background rounds in K more processes that take no
batches (the rollup in K shards), so the workers' figure is ingest alone.
Usage: python bench/ingest.py [--db sqlite|postgresql|both] [--seconds 20] [--workers 1,2,4]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import threading
import time
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import Engine, func, insert, select

from bench.common import fresh_database, gpuwarden, machine, peak_rss_mb, percentile, served
from service.db import tokens_repo
from service.db.engine import make_engine
from service.db.migrate import upgrade
from service.db.schema import rollup_dirty, samples
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


def agent_tokens(url: str) -> list[str]:
    """One agent token per simulated node, created straight in the database."""
    engine = make_engine(url)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        out = [
            tokens_repo.create_token(
                conn, role=tokens_repo.Role.AGENT, node=f"node-{i:03d}", name=None, now=now
            )[0]
            for i in range(NODES)
        ]
    engine.dispose()
    return out


def dirty_minutes(url: str) -> int:
    engine = make_engine(url)
    with engine.connect() as conn:
        n = int(conn.execute(select(func.count()).select_from(rollup_dirty)).scalar_one())
    engine.dispose()
    return n


def run_http(
    url: str, seconds: float, threads: int, workers: int, rollup_seconds: float, upkeep: int = 0
) -> dict[str, float]:
    """Post batches for ``seconds`` from ``threads`` threads to ``workers`` serve processes; with
    ``upkeep`` > 0 those run no background rounds and ``upkeep`` more processes, sent nothing,
    run them (the rollup in as many shards)."""
    tokens = agent_tokens(url)
    now = datetime.now(UTC)
    # enough distinct batches for the run at up to ~400 batches/s of 80 samples (two cores)
    batches = [
        (node, body, [])
        for node, body, _ in make_batches(int(seconds * 400 * 80 / (GPUS * STAMPS)) + 64, now)
    ]
    latencies: list[float] = []
    lock = threading.Lock()
    next_idx = [0]
    errors = [0]
    env = {
        "GPUWARDEN_ROLLUP_INTERVAL_SECONDS": str(rollup_seconds),
        "GPUWARDEN_ROLLUP_SHARDS": str(max(upkeep, 1)),
    }
    ingest_env = {**env, "GPUWARDEN_RUN_SCHEDULER": "false"} if upkeep else env
    with ExitStack() as stack:
        servers = [stack.enter_context(served(url, **ingest_env)) for _ in range(workers)]
        servers += [stack.enter_context(served(url, **env)) for _ in range(upkeep)]
        bases = [base for base, _ in servers[:workers]]
        stop = time.monotonic() + seconds

        def worker(k: int) -> None:
            clients = [httpx.Client(base_url=b, timeout=30) for b in bases]
            try:
                while time.monotonic() < stop:
                    with lock:
                        i = next_idx[0]
                        next_idx[0] += 1
                    if i >= len(batches):
                        return
                    node, body, _ = batches[i]
                    t0 = time.perf_counter()
                    r = clients[i % len(clients)].post(
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
            finally:
                for c in clients:
                    c.close()

        t0 = time.perf_counter()
        pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        elapsed = time.perf_counter() - t0
        # The rollups the run caused: wait until the last dirty minute is rolled up.
        drain_deadline = time.monotonic() + 300
        while dirty_minutes(url) > 0 and time.monotonic() < drain_deadline:
            time.sleep(0.2)
        with_rollups = time.perf_counter() - t0
        left = dirty_minutes(url)
        rss = max(peak_rss_mb(proc.pid) for _, proc in servers)
    if not latencies:
        raise RuntimeError(f"no batch was accepted ({errors[0]} errors)")
    values = len(latencies) * GPUS * STAMPS * len(METRICS)
    return {
        "batches": len(latencies),
        "errors": errors[0],
        "values_per_second": values / elapsed,
        "with_rollups_per_second": values / with_rollups,
        "drain_seconds": with_rollups - elapsed,
        "dirty_left": left,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "peak_rss_mb": rss,
    }


def _copy(engine: Engine, rows: list[dict[str, object]], binary: bool) -> float:
    """Seconds to COPY ``rows`` into samples from this process, in one transaction."""
    cols = ["gpu_id", "ts", "source", *METRIC_NAMES]
    raw = engine.raw_connection()
    dbapi = raw.driver_connection
    assert dbapi is not None
    with dbapi.cursor() as cur:
        cur.execute("TRUNCATE samples")
        types = dict(
            cur.execute(
                "SELECT attname, atttypid::int FROM pg_attribute "
                "WHERE attrelid = 'samples'::regclass AND attnum > 0"
            ).fetchall()
        )
    raw.commit()
    fmt = " (FORMAT BINARY)" if binary else ""
    t0 = time.perf_counter()
    with (
        dbapi.cursor() as cur,
        cur.copy(f"COPY samples ({', '.join(cols)}) FROM STDIN{fmt}") as copy,
    ):
        if binary:
            copy.set_types([types[c] for c in cols])
        for r in rows:
            copy.write_row([r[c] for c in cols])
    raw.commit()
    elapsed = time.perf_counter() - t0
    raw.close()
    return elapsed


def run_ceiling(url: str, n_batches: int) -> dict[str, float]:
    """Metric values per second written straight to the database from one process (binary and
    text COPY on PostgreSQL, executemany on SQLite)."""
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
    values = len(rows) * len(METRICS)
    out: dict[str, float] = {}
    if engine.dialect.name == "postgresql":
        from service.db import partitions

        with engine.begin() as conn:
            partitions.ensure_partitions(conn, {r["ts"].date() for r in rows})  # type: ignore[union-attr]
        out["binary"] = values / _copy(engine, rows, binary=True)
        out["text"] = values / _copy(engine, rows, binary=False)
    else:
        t0 = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(insert(samples), rows)
        out["executemany"] = values / (time.perf_counter() - t0)
    engine.dispose()
    return out


def main() -> None:
    global GPUS, STAMPS
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--threads", type=int, default=4, help="client threads (per worker)")
    p.add_argument("--workers", default="1", help="comma-separated counts of serve processes")
    p.add_argument("--gpus", type=int, default=GPUS, help="GPUs per batch")
    p.add_argument("--stamps", type=int, default=STAMPS, help="timestamps per batch")
    p.add_argument("--rollup-seconds", type=float, default=2.0, help="rollup job interval")
    p.add_argument(
        "--upkeep",
        type=int,
        default=0,
        help="processes that run the rollups (sharded) and other rounds apart from the ones "
        "taking batches, which then run none (0: every process runs them)",
    )
    args = p.parse_args()
    GPUS, STAMPS = args.gpus, args.stamps
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.2f} at start")
    print(
        f"batch: {GPUS} GPUs x {STAMPS} timestamps x {len(METRICS)} metrics = "
        f"{GPUS * STAMPS * len(METRICS)} values, gzip"
    )
    for kind in ["sqlite", "postgresql"] if args.db == "both" else [args.db]:
        counts = [int(w) for w in args.workers.split(",")]
        if kind == "sqlite":
            counts = [1]  # one writer: more processes only queue on its lock
        with fresh_database(kind) as url:
            gpuwarden(url, "migrate")
            ceiling = run_ceiling(url, max(200, 16_000 // (GPUS * STAMPS)))
        best = max(ceiling.values())
        print(
            f"{kind:10s} ceiling (one Python process): "
            + ", ".join(f"{k} {v:,.0f} values/s" for k, v in ceiling.items())
        )
        for workers in counts:
            with fresh_database(kind) as url:
                gpuwarden(url, "migrate")
                res = run_http(
                    url,
                    args.seconds,
                    args.threads * workers,
                    workers,
                    args.rollup_seconds,
                    args.upkeep,
                )
            apart = f" + {args.upkeep} upkeep" if args.upkeep else ""
            print(
                f"{kind:10s} {workers} worker(s){apart}: accepted {res['values_per_second']:>9,.0f} values/s "
                f"= {res['values_per_second'] / best:.2f} of the ceiling; with rollups "
                f"{res['with_rollups_per_second']:>9,.0f} values/s = "
                f"{res['with_rollups_per_second'] / best:.2f} (drained {res['drain_seconds']:.1f} s "
                f"after, {res['dirty_left']:.0f} minutes left)"
            )
            print(
                f"{'':10s} {res['batches']:.0f} batches, {res['errors']:.0f} errors, "
                f"p50 {res['p50_ms']:.1f} ms, p99 {res['p99_ms']:.1f} ms, "
                f"server peak RSS {res['peak_rss_mb']:.0f} MiB; load average "
                f"{os.getloadavg()[0]:.2f}"
            )


if __name__ == "__main__":
    main()
