"""The console's pages for a fleet of 1,000 GPUs: server time of every request each page makes.

A served central process (one uvicorn worker) on a fresh database gets 1,000 GPUs (125 nodes x
8) with two hours of samples a minute apart and 500 jobs of two GPUs each, rolled up. Then each
console page's requests (the HTML shell, the session, the causes, and the API reads its script
makes) are timed over loopback with a logged-in session cookie, as the browser sends them. The
page's server time is the sum of its requests (the script runs the data reads in parallel, so the
sum is an upper bound); the target is under 200 ms for the fleet page.

    .venv/bin/python -m bench.console                 # SQLite
    .venv/bin/python -m bench.console --backend postgresql
    .venv/bin/python -m bench.console --backend postgresql --nodes 1250 --minutes 20  # 10k GPUs
    # seed once into a database kept for profiling, then time it again after each change
    createdb -h 127.0.0.1 -U postgres pages10k
    .venv/bin/python -m bench.console --backend postgresql --nodes 1250 --minutes 20 \
        --week-ago --database postgresql+psycopg://postgres@127.0.0.1:5432/pages10k
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, inspect, select

from bench.common import fresh_database, gpuwarden, machine, percentile, served
from service.db.engine import make_engine
from service.db.schema import cost_day_dirty, cost_gpu_1d, rollup_dirty
from service.db.schema import gpus as gpus_table

NODES = 125
GPUS_PER_NODE = 8
HISTORY_MINUTES = 120
JOBS = 500
MODEL = "NVIDIA H100 80GB HBM3"
GIB = 1024**3


def _iso(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _uuid(node: int, index: int) -> str:
    return f"GPU-bench-{node:03d}-{index}"


def _node_batch(
    node: int, kinds: list[float], burst: datetime, minutes: int, rng: random.Random
) -> dict[str, Any]:
    """Node ``node``'s batch: ``minutes`` minute samples from ``burst`` of its 8 GPUs, each busy
    (or idle, with or without memory held) as its ``kinds`` draw says."""
    uuids = [_uuid(node, i) for i in range(GPUS_PER_NODE)]
    samples = []
    for minute in range(minutes):
        ts = _iso(burst + timedelta(minutes=minute, seconds=30))
        for u, kind in zip(uuids, kinds, strict=True):
            busy = kind > 0.3
            samples.append(
                {
                    "gpu_uuid": u,
                    "ts": ts,
                    "metrics": {
                        "sm_active": rng.uniform(0.6, 0.95) if busy else 0.0,
                        "tensor_active": rng.uniform(0.3, 0.8) if kind > 0.6 else 0.0,
                        "dram_active": rng.uniform(0.1, 0.4) if busy else 0.0,
                        "gpu_util": 1.0 if busy else 0.0,
                        "fb_used_bytes": int((40 if busy else 20 if kind > 0.15 else 0.5) * GIB),
                        "power_watts": 500.0 if busy else 90.0,
                    },
                }
            )
    return {
        "node": {"hostname": f"bench-node-{node:03d}", "labels": {"rack": f"r{node % 8}"}},
        "gpus": [{"uuid": u, "index": i, "model": MODEL, "fb_total_bytes": 80 * GIB}
                 for i, u in enumerate(uuids)],
        "samples": samples,
    }  # fmt: skip


def seed(
    api: httpx.Client,
    now: datetime,
    rng: random.Random,
    nodes: int = NODES,
    minutes: int = HISTORY_MINUTES,
    week_ago: Callable[[], None] | None = None,
) -> None:
    """``nodes`` x 8 GPUs with ``minutes`` of minute samples, 4 jobs of two GPUs per node, and
    prices (1,000 GPUs, two hours and 500 jobs by default). With ``week_ago`` the same minutes
    also start 7 days ago less an hour, sent first and settled by calling it (rolled up: sent
    together, the rollup would recompute every minute of the week between), and the jobs run
    from then on."""
    start = now - timedelta(minutes=minutes)
    bursts = ([now - timedelta(days=7, hours=-1)] if week_ago else []) + [start]
    jobs_from = bursts[0]
    r = api.put(
        "/prices",
        json=[{"model_pattern": "*H100*", "usd_per_gpu_hour": 4.0,
               "effective_from": "2020-01-01T00:00:00Z"}],
    )  # fmt: skip
    r.raise_for_status()
    kinds = [[rng.random() for _ in range(GPUS_PER_NODE)] for _ in range(nodes)]
    for burst in bursts:
        for node in range(nodes):
            batch = _node_batch(node, kinds[node], burst, minutes, rng)
            api.post("/ingest", json=batch).raise_for_status()
        if week_ago is not None and burst != start:
            week_ago()
    for job in range(nodes * JOBS // NODES):
        node, pair = divmod(job, GPUS_PER_NODE // 2)
        api.post(
            "/jobs",
            json={
                "id": f"slurm:{10000 + job}",
                "user": f"user{job % 40}",
                "team": f"team{job % 12}",
                "project": f"proj{job % 30}",
                "gpus": [_uuid(node, 2 * pair), _uuid(node, 2 * pair + 1)],
                "started_at": _iso(jobs_from + timedelta(minutes=rng.randint(0, 30))),
            },
        ).raise_for_status()


def wait_for_rollups(url: str, timeout: float = 600) -> None:
    """Until the rollup job has rolled up every minute ingest touched (reports would otherwise
    read the raw samples of the minutes not yet rolled up, and the job would compete with the
    timed requests)."""
    engine = make_engine(url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                dirty = conn.execute(select(func.count()).select_from(rollup_dirty)).scalar_one()
            if dirty == 0:
                return
            time.sleep(2)
    finally:
        engine.dispose()
    raise RuntimeError("rollups did not catch up")


def wait_for_day_sums(url: str, *, days: int, timeout: float = 1200) -> None:
    """Until the cost-days job has summed every GPU's last ``days`` whole days and today (and
    nothing is left to re-sum), as a fleet running for a week has them."""
    engine = make_engine(url)
    deadline = time.monotonic() + timeout
    first = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    first -= timedelta(days=days)
    try:
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                gpus = conn.execute(select(func.count()).select_from(gpus_table)).scalar_one()
                summed = conn.execute(
                    select(func.count()).select_from(cost_gpu_1d).where(cost_gpu_1d.c.day >= first)
                ).scalar_one()
                dirty = conn.execute(select(func.count()).select_from(cost_day_dirty)).scalar_one()
            if summed >= gpus * (days + 1) and dirty == 0:
                return
            time.sleep(5)
    finally:
        engine.dispose()
    raise RuntimeError("day sums did not catch up")


PAGES: dict[str, list[tuple[str, dict[str, str] | None]]] = {
    "fleet": [
        ("/", None),
        ("/api/v1/session", None),
        ("/console/causes.json", None),
        ("/api/v1/fleet", {"sort": "waste", "limit": "200"}),
    ],
    # What the fleet page read before /fleet existed, for comparison (not a page).
    "fleet-before": [
        ("/api/v1/gpus", None),
        ("/api/v1/reports/cost", {"group_by": "gpu", "start": "today", "end": "now"}),
    ],
    "jobs": [
        ("/jobs", None),
        ("/api/v1/session", None),
        ("/api/v1/jobs", {"start": "today-6d", "sort": "waste", "limit": "100"}),
    ],
    # The jobs page's read over a rolling week (its first day starts mid-day), for comparison.
    "jobs-rolling": [
        ("/api/v1/jobs", {"since": "7d", "sort": "waste", "limit": "100"}),
    ],
    "costs": [
        ("/costs", None),
        ("/api/v1/session", None),
        ("/api/v1/reports/cost", {"group_by": "team", "start": "today-6d", "end": "now"}),
    ],
    "alerts": [
        ("/alerts", None),
        ("/api/v1/session", None),
        ("/api/v1/alerts", {"limit": "500"}),
        ("/api/v1/silences", None),
    ],
}


def cpu_ms(pid: int) -> float:
    """CPU time (user + system) process ``pid`` has used so far, in ms (10 ms ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def time_pages(
    client: httpx.Client, runs: int, pid: int
) -> tuple[dict[str, dict[str, list[float]]], dict[str, float]]:
    """Per page, per request: the wall time (ms) of each of ``runs`` rounds; and per page the
    service's CPU time per round (ms), which the load of a shared machine does not inflate."""
    out: dict[str, dict[str, list[float]]] = {}
    cpu: dict[str, float] = {}
    for page, requests in PAGES.items():
        per: dict[str, list[float]] = {path: [] for path, _ in requests}
        per["page"] = []
        for run in range(runs + 1):  # the first round warms caches and is dropped
            if run == 1:
                cpu_start = cpu_ms(pid)
            total = 0.0
            for path, params in requests:
                t0 = time.perf_counter()
                r = client.get(path, params=params)
                ms = (time.perf_counter() - t0) * 1000
                r.raise_for_status()
                per[path].append(ms)
                total += ms
            per["page"].append(total)
        cpu[page] = (cpu_ms(pid) - cpu_start) / runs
        out[page] = {k: v[1:] for k, v in per.items()}
    return out, cpu


@contextmanager
def _database(backend: str, url: str | None) -> Iterator[tuple[str, bool]]:
    """A database to time and whether it is seeded already: ``url`` as it is, or a fresh one
    of ``backend`` removed afterwards."""
    if url is None:
        with fresh_database(backend) as fresh:
            yield fresh, False
        return
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            seeded = bool(inspect(conn).has_table("gpus")) and bool(
                conn.execute(select(func.count()).select_from(gpus_table)).scalar()
            )
    finally:
        engine.dispose()
    yield url, seeded


def _seed_all(api: httpx.Client, url: str, args: argparse.Namespace, rng: random.Random) -> None:
    """Seed the fleet ``args`` asks for and wait until it is rolled up (and summed per day)."""
    t0 = time.perf_counter()
    settle = (lambda: wait_for_rollups(url)) if args.week_ago else None
    seed(api, datetime.now(UTC), rng, args.nodes, args.minutes, settle)
    wait_for_rollups(url)
    if args.week_ago:
        wait_for_day_sums(url, days=7)
    print(f"seeded {args.nodes * GPUS_PER_NODE} GPUs, {args.nodes * JOBS // NODES} jobs, "
          f"{args.minutes} min of samples in {time.perf_counter() - t0:.0f} s")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=NODES, help="nodes of 8 GPUs")
    parser.add_argument("--minutes", type=int, default=HISTORY_MINUTES, help="of history")
    parser.add_argument(
        "--week-ago", action="store_true",
        help="the same minutes also a week ago, the jobs running since; waits for the day sums",
    )  # fmt: skip
    parser.add_argument(
        "--database", metavar="URL",
        help="time this database, seeding it only if it has no GPU (and keeping it): seed "
        "10,000 GPUs once, then time the pages again after each change",
    )  # fmt: skip
    args = parser.parse_args()
    gpus = args.nodes * GPUS_PER_NODE
    rng = random.Random(19)
    with _database(args.backend, args.database) as (url, seeded):
        gpuwarden(url, "migrate")
        admin = gpuwarden(url, "token", "create", "--role", "admin").strip().splitlines()[-1]
        reader = gpuwarden(url, "token", "create", "--role", "reader").strip().splitlines()[-1]
        with served(url, GPUWARDEN_EVAL_INTERVAL_SECONDS="3600") as (base, proc):
            bearer = {"Authorization": f"Bearer {admin}"}
            if not seeded:
                with httpx.Client(base_url=f"{base}/api/v1", headers=bearer, timeout=120) as api:
                    _seed_all(api, url, args, rng)
            with httpx.Client(base_url=base, timeout=120) as browser:
                browser.post("/api/v1/session", json={"token": reader}).raise_for_status()
                load_before = " ".join(Path("/proc/loadavg").read_text().split()[:3])
                results, cpu = time_pages(browser, args.runs, proc.pid)
    print(f"console page server time, {args.backend}, {args.runs} runs, {machine()}")
    print(f"load average before timing: {load_before}")
    print(f"{'page / request':<48} {'median ms':>10} {'p95 ms':>8} {'CPU ms':>8}")
    for page, per in results.items():
        for path, values in per.items():
            name = f"{page}: {path}" if path != "page" else f"{page} PAGE TOTAL"
            used = f"{cpu[page]:>8.1f}" if path == "page" else ""
            print(
                f"{name:<48} {statistics.median(values):>10.1f} "
                f"{percentile(values, 95):>8.1f} {used}"
            )
    fleet = statistics.median(results["fleet"]["page"])
    verdict = "under" if fleet < 200 else "OVER"
    print(
        f"fleet page for {gpus} GPUs: {fleet:.1f} ms median wall, "
        f"{cpu['fleet']:.1f} ms service CPU; {verdict} 200 ms"
    )


if __name__ == "__main__":
    main()
