"""The console's jobs page right after a fleet arrives, beside the same page without today's
sums (as it was until the cost-days job ran) and with them.

A served central process on a fresh PostgreSQL (or SQLite) database gets the console bench's
fleet (1,000 GPUs, two hours of minute samples, 500 jobs of two GPUs). Three timings of the
jobs page's data read (``GET /api/v1/jobs?start=today-6d&sort=waste&limit=100``), each the
median and best of ``--runs`` after one warm-up:

1. right after start: as soon as the rollups have caught up with the fleet's batches, on the
   service as it runs (its today-sums job writes today's sums as soon as they are missing),
   then how long after the rollups caught up today's sums existed; and again ``--later``
   (75) seconds on, when the cost-days job has run (the issue's reference);
2. without today's sums (the reference: the page before, until the cost-days job had run, a
   minute or more later): the sums deleted, served by a process without background jobs;
3. with them: the same process once the cost-days job's work for today has run.

"from sums" counts the reads that ended where today's sums end (read from them); "CPU ms" is
the service process's CPU per read (10 ms ticks), its background jobs' included.

    .venv/bin/python -m bench.jobs_today --backend postgresql
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import httpx
from sqlalchemy import delete, func, select

from bench.common import fresh_database, gpuwarden, machine, served
from bench.console import cpu_ms, seed, wait_for_rollups
from service.core.buckets import floor_day
from service.db.engine import make_engine
from service.db.schema import cost_gpu_1d, cost_job_1d
from service.settings import Settings
from service.usecases.costing import cost_days

PAGE = ("/api/v1/jobs", {"start": "today-6d", "sort": "waste", "limit": "100"})
TARGET_MS = 200.0


class Timed(NamedTuple):
    """Wall ms of each read, how many of them ended where today's sums end (before now), and
    the service process's CPU ms per read (its background jobs' included)."""

    ms: list[float]
    from_sums: int
    cpu_ms: float


def page_ms(base: str, token: str, runs: int, pid: int) -> Timed:
    """``runs`` reads of the jobs page's data, after one warm-up read."""
    out = []
    from_sums = 0
    cpu_before = 0.0
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}) as http:
        for run in range(runs + 1):
            if run == 1:
                cpu_before = cpu_ms(pid)
            t0 = time.perf_counter()
            r = http.get(PAGE[0], params=PAGE[1], timeout=120)
            ms = (time.perf_counter() - t0) * 1000
            r.raise_for_status()
            if run:
                out.append(ms)
                # A report read from today's sums ends at their whole minute, a minute ago.
                end = datetime.fromisoformat(r.headers["x-report-end"])
                from_sums += end.second == 0 and end < datetime.now(UTC) - timedelta(seconds=60)
    return Timed(out, from_sums, (cpu_ms(pid) - cpu_before) / runs)


def today_rows(url: str) -> int:
    """How many GPUs today's sums hold."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            day = floor_day(datetime.now(UTC))
            query = select(func.count()).select_from(cost_gpu_1d).where(cost_gpu_1d.c.day == day)
            return int(conn.execute(query).scalar_one())
    finally:
        engine.dispose()


def wait_for_today(url: str, gpus: int, timeout: float = 300) -> float:
    """Seconds until today's sums hold every GPU."""
    t0 = time.monotonic()
    while today_rows(url) < gpus:
        if time.monotonic() - t0 > timeout:
            raise RuntimeError("today's sums were not written")
        time.sleep(0.5)
    return time.monotonic() - t0


def forget_today(url: str) -> None:
    """Delete today's sums, as a fleet that just arrived has none."""
    engine = make_engine(url)
    day = floor_day(datetime.now(UTC))
    try:
        with engine.begin() as conn:
            conn.execute(delete(cost_job_1d).where(cost_job_1d.c.day == day))
            conn.execute(delete(cost_gpu_1d).where(cost_gpu_1d.c.day == day))
    finally:
        engine.dispose()


def write_today(url: str) -> float:
    """Run the cost-days job's work for today in this process; its seconds."""
    engine = make_engine(url)
    t0 = time.perf_counter()
    try:
        with engine.begin() as conn:
            cost_days.write_today(conn, settings=Settings(database_url=url), now=datetime.now(UTC))
    finally:
        engine.dispose()
    return time.perf_counter() - t0


def line(name: str, timed: Timed) -> str:
    med, best = statistics.median(timed.ms), min(timed.ms)
    verdict = "under" if med < TARGET_MS else "OVER"
    sums = f"{timed.from_sums}/{len(timed.ms)}"
    return (
        f"{name:<44} {med:>9.1f} {best:>8.1f} {timed.cpu_ms:>7.0f} {sums:>9}  "
        f"{verdict} {TARGET_MS:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="postgresql")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument(
        "--later", type=float, default=75.0, help="seconds after start of the second timing"
    )
    args = parser.parse_args()
    quiet = {"GPUWARDEN_EVAL_INTERVAL_SECONDS": "3600"}
    with fresh_database(args.backend) as url:
        gpuwarden(url, "migrate")
        admin = gpuwarden(url, "token", "create", "--role", "admin").strip().splitlines()[-1]
        reader = gpuwarden(url, "token", "create", "--role", "reader").strip().splitlines()[-1]
        with served(url, **quiet) as (base, proc):
            headers = {"Authorization": f"Bearer {admin}"}
            with httpx.Client(base_url=f"{base}/api/v1", headers=headers, timeout=120) as api:
                seed(api, datetime.now(UTC), random.Random(19))
            wait_for_rollups(url)
            load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
            caught_up = time.monotonic()
            after_start = page_ms(base, reader, args.runs, proc.pid)
            waited = time.monotonic() - caught_up + wait_for_today(url, 1000)
            time.sleep(max(0.0, caught_up + args.later - time.monotonic()))
            later = page_ms(base, reader, args.runs, proc.pid)
        forget_today(url)
        with served(url, GPUWARDEN_RUN_SCHEDULER="false") as (base, proc):
            without = page_ms(base, reader, args.runs, proc.pid)
            summed_in = write_today(url)
            with_sums = page_ms(base, reader, args.runs, proc.pid)
    print(f"jobs page data read, 1,000 GPUs, 500 jobs, {args.backend}, {machine()}")
    print(f"load average after the fleet arrived: {load}")
    print(f"today's sums held every GPU {waited:.1f} s after the rollups caught up")
    print(f"{'':<44} {'median ms':>9} {'best ms':>8} {'CPU ms':>7} {'from sums':>9}")
    print(line("right after start (this service)", after_start))
    print(line(f"{args.later:.0f} s later (the cost-days job has run)", later))
    print(line("without today's sums (reference: before)", without))
    print(line(f"with them, nothing else running ({summed_in:.2f} s)", with_sums))
    print(f"load after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


if __name__ == "__main__":
    main()
