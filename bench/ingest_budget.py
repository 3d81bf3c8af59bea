"""Where one central process's time goes per sample, against the COPY ceiling of the same run.

Runs ingest in-process (no HTTP) on a fresh PostgreSQL database: the agent-shaped batches of
bench.ingest, each validated (`parse_batch`: pydantic over the JSON), then stored
(`ingest`: classification, COPY, dirty minutes, GPU rows, one transaction), then the
rollup of every minute they dirtied (`rollup_once`). Prints microseconds per sample for each
step beside the ceiling's (binary and text COPY of the same rows from one process, measured
here), and what fraction of the binary ceiling one process reaches with and without the
rollup. The HTTP layer (uvicorn, gunzip, auth, admission) comes on top: bench.ingest measures
it whole.

Usage: python -m bench.ingest_budget [--batches 60] [--stamps 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gzip
import os
import time
from datetime import UTC, datetime

import bench.ingest as shape
from bench.common import fresh_database, machine
from service.context import ServiceContext
from service.db.engine import make_engine
from service.db.migrate import upgrade
from service.settings import Settings
from service.usecases import ingest as ingest_uc
from service.usecases import upkeep

STEPS = ("parse", "store", "rollup")


def one_round(batches: int) -> dict[str, float]:
    """Seconds per sample of each step over ``batches`` fresh batches, on a fresh database."""
    with fresh_database("postgresql") as url:
        engine = make_engine(url)
        upgrade(engine)
        ctx = ServiceContext(settings=Settings(database_url=url), engine=engine)
        bodies = [
            gzip.decompress(body)
            for _, body, _ in shape.make_batches(batches + 4, datetime.now(UTC))
        ]
        for raw in bodies[:4]:  # warm: nodes, GPUs, partitions and caches exist, as in steady use
            ingest_uc.ingest(ctx, ingest_uc.parse_batch(raw), token_node=None)
        upkeep.rollup_once(ctx)
        spent = dict.fromkeys(STEPS, 0.0)
        samples = 0
        for raw in bodies[4:]:
            t0 = time.perf_counter()
            batch = ingest_uc.parse_batch(raw)
            t1 = time.perf_counter()
            ingest_uc.ingest(ctx, batch, token_node=None)
            spent["parse"] += t1 - t0
            spent["store"] += time.perf_counter() - t1
            samples += len(batch.samples)
        t0 = time.perf_counter()
        upkeep.rollup_once(ctx)
        spent["rollup"] = time.perf_counter() - t0
        engine.dispose()
    return {step: seconds / samples for step, seconds in spent.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--stamps", type=int, default=100, help="timestamps per batch (8 GPUs each)")
    p.add_argument("--rounds", type=int, default=3, help="best of this many")
    args = p.parse_args()
    shape.STAMPS = args.stamps
    metrics = len(shape.METRICS)
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.2f} at start")
    print(f"batch: {shape.GPUS} GPUs x {args.stamps} timestamps x {metrics} metrics, in-process")
    with fresh_database("postgresql") as url:
        ceiling = shape.run_ceiling(url, max(200, 16_000 // (shape.GPUS * args.stamps)))
    rounds = [one_round(args.batches) for _ in range(args.rounds)]
    best = {step: min(r[step] for r in rounds) for step in STEPS}
    for kind, values_per_second in ceiling.items():
        us = metrics / values_per_second * 1e6
        print(f"ceiling, {kind} COPY: {us:6.1f} us a sample ({values_per_second:,.0f} values/s)")
    for step in STEPS:
        print(f"{step:7s} {best[step] * 1e6:6.1f} us a sample (best of {args.rounds})")
    binary = ceiling["binary"]
    accepted = metrics / (best["parse"] + best["store"])
    whole = metrics / sum(best.values())
    print(
        f"one process: parse + store {accepted:,.0f} values/s = {accepted / binary:.2f} of the "
        f"binary ceiling; with its rollups {whole:,.0f} values/s = {whole / binary:.2f}"
    )
    print(
        f"0.5 of the binary ceiling leaves {2 * metrics / binary * 1e6:.1f} us a sample for "
        f"everything; load average {os.getloadavg()[0]:.2f} at the end"
    )


if __name__ == "__main__":
    main()
