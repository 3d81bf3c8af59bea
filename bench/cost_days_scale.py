"""Benchmark: a 30-day cost report read from the cost day sums alone, at fleet sizes whose
1-minute rollups do not fit this machine's disk (10,000 GPUs x 50,000 jobs is ~270 GB of
rollup_1m).

The GPUs, nodes, jobs and intervals are generated as ``bench/cost_report.py`` generates them
(same generator, scaled); the day sums (cost_gpu_1d, cost_job_1d) are generated directly, one
row per (job, GPU, day) a job held and one per (GPU, day) for the GPU's unallocated time, with
plausible figures (not the cost-days job's: there are no rollups to sum them from), under the
basis of the price table in force, so a report reads them exactly as it reads written ones.
The window is whole days, so no finer data is read: what is timed is the per-GPU and per-job
part of a report (GPUs, coverage, the summed rows, grouping, the money model), the part that
grows with the fleet; the two edge days' finer reading is timed at 1,000 GPUs by
``bench/cost_report.py --day-sums`` and scales with the GPU-minutes of those days.

Run:  .venv/bin/python bench/cost_days_scale.py --gpus 10000 --jobs 50000 [--reuse]
      [--csv-dir DIR]   (each report's CSV, for ``bench.report_bytes`` to compare two versions)
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import func, insert, select

# Appended, not first: PYTHONPATH (another copy of the code, timed against this one) wins.
sys.path.append(str(Path(__file__).resolve().parents[1]))

from bench import report_bytes
from bench.cost_report import END, GPUS_PER_NODE, MODELS, analyze, make_jobs
from service.api.app import freeze_start_up_objects
from service.costs.prices import PriceRow, price_lookup
from service.db import cost_scratch, prices_repo
from service.db.costing import cost_days_repo
from service.db.engine import make_engine
from service.db.migrate import upgrade
from service.db.schema import (
    COST_SUM_FIELDS,
    cost_gpu_1d,
    cost_job_1d,
    gpus,
    job_gpus,
    jobs,
    nodes,
)
from service.settings import Settings
from service.usecases.costing import cost_report
from service.usecases.costing.day_sums import basis_of

DAY = timedelta(days=1)
APP_LABEL = "app.kubernetes.io/name"  # the jobs' label that group_by=label:<key> reads
PRICES = [
    PriceRow("*H100*", 6.88, END - timedelta(days=400)),
    PriceRow("*A100*80GB*", 5.12, END - timedelta(days=400)),
    PriceRow("*H200*", 10.60, END - timedelta(days=400)),
    PriceRow("*L40S*", 1.86, END - timedelta(days=400)),
]
# A held second split over the causes (idle_empty, idle_held, compute_tensor,
# compute_no_tensor, memory_bound), by job: what a plausible fleet's figures look like.
MIXES = ((0.3, 0.2, 0.4, 0.1, 0.0), (0.0, 0.1, 0.8, 0.05, 0.05), (0.6, 0.3, 0.0, 0.1, 0.0))
CAUSES = ("idle_empty", "idle_held", "compute_tensor", "compute_no_tensor", "memory_bound")


def sums(held: float, usd_per_hour: float, mix: tuple[float, ...]) -> dict[str, float]:
    """One row's figures: 1% of the held time without samples, the rest split by ``mix``."""
    covered = 0.99 * held
    row = dict.fromkeys(COST_SUM_FIELDS, 0.0)
    rate = usd_per_hour / 3600.0
    row.update(held_seconds=held, covered_seconds=covered, nodata_seconds=held - covered,
               cost_usd=held * rate, nodata_usd=(held - covered) * rate,
               energy_used_joules=covered * 300.0)  # fmt: skip
    for cause, share in zip(CAUSES, mix, strict=True):
        row[f"{cause}_seconds"] = covered * share
        row[f"{cause}_usd"] = covered * share * rate
    row["idle_seconds"] = row["idle_empty_seconds"] + row["idle_held_seconds"]
    row["unused_seconds"] = 0.5 * row["idle_seconds"] + 0.3 * covered
    row["compute_no_tensor_active_seconds"] = 0.9 * row["compute_no_tensor_seconds"]
    row["memory_bound_dram_seconds"] = 0.7 * row["memory_bound_seconds"]
    return row


def load(url: str, n_gpus: int, n_jobs: int, days: int) -> None:
    engine = make_engine(url)
    upgrade(engine)
    rng = random.Random(42)
    t = time.perf_counter()
    basis = basis_of(PRICES, Settings())
    start = END - timedelta(days=days)
    with engine.begin() as conn:
        conn.execute(
            insert(nodes),
            [{"hostname": f"gpu{n:05d}", "labels": {}, "first_seen_at": END, "last_seen_at": END}
             for n in range(n_gpus // GPUS_PER_NODE)],
        )  # fmt: skip
        conn.execute(
            insert(gpus),
            [{"uuid": f"GPU-{g:06d}", "node_id": (g - 1) // GPUS_PER_NODE + 1,
              "gpu_index": (g - 1) % GPUS_PER_NODE, "model": MODELS[((g - 1) // 64) % len(MODELS)],
              "fb_total_bytes": 80 * 2**30, "first_seen_at": start}
             for g in range(1, n_gpus + 1)],
        )  # fmt: skip
        job_rows, interval_rows = make_jobs(n_gpus, days, n_jobs, rng)
        for k, row in enumerate(job_rows):  # 30 namespaces, 50 apps (group_by namespace, label)
            row["labels"] = {"namespace": f"ns{k % 30}", APP_LABEL: f"app{k % 50}"}
        for i in range(0, len(job_rows), 5000):
            conn.execute(insert(jobs), job_rows[i : i + 5000])
        for i in range(0, len(interval_rows), 5000):
            conn.execute(insert(job_gpus), interval_rows[i : i + 5000])
        prices_repo.replace_prices(conn, rows=PRICES)
        conn.exec_driver_sql("DELETE FROM cost_day_dirty")  # the triggers' ranges of the load
        print(f"  {len(job_rows):,} jobs, {len(interval_rows):,} intervals", flush=True)
        lookup = price_lookup(PRICES)
        model_of = {g: MODELS[((g - 1) // 64) % len(MODELS)] for g in range(1, n_gpus + 1)}
        held_by: dict[tuple[int, Any], float] = {}
        job_out: list[tuple[Any, ...]] = []
        cols = ("day", "gpu_id", "job_id", *COST_SUM_FIELDS)
        for n, iv in enumerate(interval_rows):
            price = lookup(model_of[iv["gpu_id"]], start)
            assert price is not None
            day = iv["started_at"].replace(hour=0, minute=0, second=0, microsecond=0)
            while day < iv["ended_at"]:
                held = (min(iv["ended_at"], day + DAY) - max(iv["started_at"], day)).total_seconds()
                key = (iv["gpu_id"], day)
                held_by[key] = held_by.get(key, 0.0) + held
                row = sums(held, price.usd_per_gpu_hour, MIXES[n % len(MIXES)])
                job_out.append(
                    (day, iv["gpu_id"], iv["job_id"], *(row[f] for f in COST_SUM_FIELDS))
                )
                day += DAY
        gpu_out: list[tuple[Any, ...]] = []
        gcols = ("day", "gpu_id", "basis", "written_at", *COST_SUM_FIELDS)
        for g in range(1, n_gpus + 1):
            price = lookup(model_of[g], start)
            assert price is not None
            for d in range(days):
                day = start + d * DAY
                free = max(86400.0 - held_by.get((g, day), 0.0), 0.0)
                row = sums(free, price.usd_per_gpu_hour, (0.9, 0.1, 0.0, 0.0, 0.0))
                job_out.append((day, g, "", *(row[f] for f in COST_SUM_FIELDS)))
                whole = sums(86400.0, price.usd_per_gpu_hour, MIXES[g % len(MIXES)])
                gpu_out.append((day, g, basis, END, *(whole[f] for f in COST_SUM_FIELDS)))
        cost_scratch.load_rows(conn, cost_job_1d, cols, job_out)
        cost_scratch.load_rows(conn, cost_gpu_1d, gcols, gpu_out)
        # Each (job, day)'s sums, as the cost-days job writes them beside its rows.
        cost_days_repo.sum_job_days(conn, [start + d * DAY for d in range(days)])
        print(
            f"  day sums: {len(job_out):,} (job, GPU, day) rows, {len(gpu_out):,} (GPU, day) rows",
            flush=True,
        )
    analyze(engine)
    print(f"  generated in {time.perf_counter() - t:.0f} s", flush=True)
    engine.dispose()


def bench(url: str, days: int, runs: int, csv_dir: str | None = None) -> None:
    engine = make_engine(url)
    freeze_start_up_objects()
    settings = Settings()
    start = END - timedelta(days=days)
    with engine.connect() as conn:
        n = conn.execute(select(func.count()).select_from(cost_job_1d)).scalar_one()
        print(f"  rows: cost_job_1d {n:,}")
        for group_by, limit in (("team", None), ("user", None), ("job", 100), ("job", None),
                                ("gpu", None), ("namespace", None),
                                (f"label:{APP_LABEL}", None)):  # fmt: skip
            times = []
            data: Any = None
            cost_report.cost_report(conn, settings=settings, start=start, end=END, now=END,
                                    group_by=group_by, limit=limit)  # fmt: skip
            for _ in range(runs):
                t = time.perf_counter()
                data = cost_report.cost_report(conn, settings=settings, start=start, end=END,
                                               now=END, group_by=group_by, limit=limit)  # fmt: skip
                times.append(time.perf_counter() - t)
            report_bytes.save(csv_dir, f"{group_by}_{limit or 'all'}", data)
            page = "" if limit is None else f", the first {limit} rows"
            print(
                f"  report {days} d (whole days, all summed) by {group_by}{page}: best "
                f"{min(times) * 1000:.0f} ms, median {statistics.median(times) * 1000:.0f} ms "
                f"({len(data['rows'])} of {data['row_count']} rows, total "
                f"${data['totals']['cost_usd']:,.0f})",
                flush=True,
            )
    engine.dispose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=10000)
    p.add_argument("--jobs", type=int, default=50000)
    p.add_argument("--days", type=int, default=30)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--pg-admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--pg-database", default="gpuwarden_bench_days_scale")
    p.add_argument("--reuse", action="store_true")
    p.add_argument("--csv-dir", help="save each report's CSV here (bench.report_bytes compares)")
    args = p.parse_args()
    print(f"{args.gpus} GPUs x {args.days} days, {args.jobs} jobs, PostgreSQL")
    with psycopg.connect(args.pg_admin_url, autocommit=True) as c:
        exists = c.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (args.pg_database,)
        ).fetchone()
        fresh = not (exists and args.reuse)
        if fresh:
            c.execute(f'DROP DATABASE IF EXISTS "{args.pg_database}" WITH (FORCE)')
            c.execute(f'CREATE DATABASE "{args.pg_database}"')
    base = args.pg_admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    url = f"{base}/{args.pg_database}"
    if fresh:
        load(url, args.gpus, args.jobs, args.days)
    bench(url, args.days, args.runs, args.csv_dir)


if __name__ == "__main__":
    main()
