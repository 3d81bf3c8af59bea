"""The jobs page's read before today's sums, in one process: its wall time and CPU (this
process and PostgreSQL's), and the share of the raw samples at the spans' edges (``sum_raw``),
with the code of a chosen checkout, so two versions alternate on the same data.

``seed`` keeps the console bench's fleet (1,000 GPUs, two hours of minute samples, 500 jobs
of two GPUs) in a PostgreSQL database, rolled up, without today's sums; ``time`` reads the
jobs page's data (the week from today - 6 days, by waste, 100 jobs) at the seed's time + 47.25 s
(mid-minute) ``--runs`` times after two warm-up reads; ``dump`` writes that page and the cost
reports by team, user, job, GPU and node over the week and over 97 minutes ending mid-minute,
as JSON, to compare two versions' bytes (``cmp``).

    .venv/bin/python -m bench.jobs_edges seed
    .venv/bin/python -m bench.jobs_edges time --code /tmp/old-code   # a git archive of the old
    .venv/bin/python -m bench.jobs_edges time
    .venv/bin/python -m bench.jobs_edges dump /tmp/new.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg

# No module of service/ is imported before --code puts its checkout first on sys.path.
from bench.common import PG_ADMIN, gpuwarden, machine, served

DB = "gpuwarden_bench_jobs_edges"
URL = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + "/" + DB
SEEDED = Path("/tmp/gpuwarden-bench-jobs-edges.txt")  # when the fleet's samples end


def seed_fleet() -> None:
    """A new database holding the fleet, rolled up, without today's sums."""
    from bench.console import seed, wait_for_rollups
    from bench.jobs_today import forget_today

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB}"')
    gpuwarden(URL, "migrate")
    admin = gpuwarden(URL, "token", "create", "--role", "admin").strip().splitlines()[-1]
    with served(URL, GPUWARDEN_EVAL_INTERVAL_SECONDS="3600") as (base, _):
        now = datetime.now(UTC)
        headers = {"Authorization": f"Bearer {admin}"}
        with httpx.Client(base_url=f"{base}/api/v1", headers=headers, timeout=120) as api:
            seed(api, now, random.Random(19))
        wait_for_rollups(URL)
    forget_today(URL)
    SEEDED.write_text(now.isoformat())


def _cpu_ms(pid: int) -> float:
    """CPU time (user + system) process ``pid`` has used so far, in ms (10 ms ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def _backends_cpu_ms() -> float:
    """CPU ms used so far by the PostgreSQL processes connected to the bench database."""
    with psycopg.connect(PG_ADMIN) as conn:
        query = "SELECT pid FROM pg_stat_activity WHERE datname = %s"
        pids = [row[0] for row in conn.execute(query, (DB,))]
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):  # ended meanwhile
            total += _cpu_ms(pid)
    return total


def run(action: str, runs: int, dump: str | None) -> None:
    """Time (or dump) with the code now first on sys.path."""
    import service
    import service.db.costing.cost_sums as cost_sums
    from service.db.engine import make_engine
    from service.settings import Settings
    from service.usecases import job_list
    from service.usecases.costing import cost_report

    print(f"code: {Path(service.__file__).parent}")
    now = datetime.fromisoformat(SEEDED.read_text()) + timedelta(seconds=47.25)
    start = datetime.combine(now.date() - timedelta(days=6), datetime.min.time(), UTC)
    settings = Settings(database_url=URL)
    engine = make_engine(URL)
    raw_ms: list[tuple[float, float]] = []  # sum_raw's (wall, this process's CPU) ms
    sum_raw = cost_sums.sum_raw

    def timed_sum_raw(*args: Any) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        sum_raw(*args)
        raw_ms.append(((time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3))

    cost_sums.sum_raw = timed_sum_raw  # type: ignore[assignment]

    def page() -> list[dict[str, Any]]:
        with engine.connect() as conn:
            return job_list.jobs_with_costs(
                conn, settings=settings, start=start, end=now, now=now, user=None, team=None,
                sort="waste", limit=100,
            ).jobs  # fmt: skip

    if action == "dump":
        out: dict[str, Any] = {"page": page()}
        with engine.connect() as conn:
            for group_by in ("team", "user", "job", "gpu", "node"):
                for name, lo, hi in (
                    ("week", now - timedelta(days=7), now),
                    ("97min", now - timedelta(minutes=97), now - timedelta(seconds=13.5)),
                ):
                    out[f"{group_by}_{name}"] = cost_report.cost_report(
                        conn, settings=settings, start=lo, end=hi, now=now, group_by=group_by,
                        limit=None,
                    )  # fmt: skip
        Path(str(dump)).write_text(json.dumps(out, sort_keys=True, default=str))
        return
    page()
    page()
    raw_ms.clear()
    wall: list[float] = []
    backends, cpu = _backends_cpu_ms(), time.process_time()
    for _ in range(runs):
        t0 = time.perf_counter()
        page()
        wall.append((time.perf_counter() - t0) * 1e3)
    cpu_per = (time.process_time() - cpu) * 1e3 / runs
    backends_per = (_backends_cpu_ms() - backends) / runs
    engine.dispose()
    print(
        f"page: wall median {statistics.median(wall):.1f} best {min(wall):.1f} ms; CPU per read "
        f"{cpu_per:.0f} ms here + {backends_per:.0f} ms PostgreSQL; sum_raw: wall median "
        f"{statistics.median(w for w, _ in raw_ms):.1f} best {min(w for w, _ in raw_ms):.1f} ms, "
        f"CPU here {statistics.median(c for _, c in raw_ms):.1f} ms (target: page under 200 ms)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("action", choices=("seed", "time", "dump"))
    p.add_argument("dump", nargs="?", help="dump: the JSON file to write")
    p.add_argument("--code", help="a checkout whose service/ to run (default: this one)")
    p.add_argument("--runs", type=int, default=15)
    args = p.parse_args()
    if args.action == "seed":
        seed_fleet()
        return
    if args.code:
        assert "service" not in sys.modules
        sys.path.insert(0, str(Path(args.code).resolve()))
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(
        f"{args.code or 'this checkout'}, {machine()}, load {load}, {datetime.now(UTC):%H:%M} UTC"
    )
    run(args.action, args.runs, args.dump)


if __name__ == "__main__":
    main()
