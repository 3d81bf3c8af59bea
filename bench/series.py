"""Series query speed: a 30-day series at 1-hour step for one GPU, with 30 days x 100 GPUs stored.

Fills rollup_1h for 100 GPUs over 30 days (72,000 rows; --with-minutes adds the 4.3 M 1-minute
rows, which a 1-hour-step query never reads), then times
GET /api/v1/gpus/{uuid}/series?step=3600 over HTTP (p50/p99 of 50 calls) on SQLite and PostgreSQL.
Usage: python bench/series.py [--db sqlite|postgresql|both] [--gpus 100] [--days 30]
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import insert

from bench.common import fresh_database, gpuwarden, machine, percentile, served
from service.db.engine import make_engine
from service.db.migrate import upgrade
from service.db.schema import gpus, nodes, rollup_1h, rollup_1m
from service.vocabulary import METRIC_NAMES


def rollup_row(gpu_id: int, bucket: datetime, n: int) -> dict[str, object]:
    row: dict[str, object] = {
        "gpu_id": gpu_id,
        "bucket_start": bucket,
        "sample_count": n,
        "covered_seconds": 10.0 * n,
        "idle_seconds": 0.0,
        "idle_held_seconds": 0.0,
        "unused_seconds": 5.0 * n,
        "fallback_seconds": 0.0,
        "energy_used_joules": 3000.0 * n,
    }
    for m in METRIC_NAMES:
        row.update({f"{m}_sum": 0.5 * n, f"{m}_min": 0.1, f"{m}_max": 0.9, f"{m}_count": n})
    return row


def fill(url: str, n_gpus: int, days: int, end: datetime, with_minutes: bool) -> None:
    engine = make_engine(url)
    upgrade(engine)
    with engine.begin() as conn:
        conn.execute(
            insert(nodes).values(
                id=1, hostname="bench", labels={}, first_seen_at=end, last_seen_at=end
            )
        )
        conn.execute(
            insert(gpus),
            [
                {
                    "id": g,
                    "uuid": f"GPU-{g:04d}",
                    "node_id": 1,
                    "gpu_index": g,
                    "model": "NVIDIA H100 80GB HBM3",
                    "first_seen_at": end,
                    "last_sample_at": end,
                }
                for g in range(1, n_gpus + 1)
            ],
        )
    start = end - timedelta(days=days)
    hours = [start + timedelta(hours=h) for h in range(days * 24)]
    with engine.begin() as conn:
        conn.execute(
            insert(rollup_1h), [rollup_row(g, h, 360) for g in range(1, n_gpus + 1) for h in hours]
        )
    for g in range(1, n_gpus + 1 if with_minutes else 1):
        with engine.begin() as conn:
            conn.execute(
                insert(rollup_1m),
                [rollup_row(g, start + timedelta(minutes=m), 6) for m in range(days * 1440)],
            )
    engine.dispose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    p.add_argument("--gpus", type=int, default=100)
    p.add_argument("--days", type=int, default=30)
    p.add_argument(
        "--with-minutes",
        action="store_true",
        help="also fill rollup_1m (4.3 M rows; slow, and a 1-hour-step query never reads it)",
    )
    args = p.parse_args()
    print(f"machine: {machine()}")
    end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    for kind in ["sqlite", "postgresql"] if args.db == "both" else [args.db]:
        with fresh_database(kind) as url:
            t0 = time.perf_counter()
            fill(url, args.gpus, args.days, end, args.with_minutes)
            fill_s = time.perf_counter() - t0
            reader = gpuwarden(url, "token", "create", "--role", "reader").strip().splitlines()[-1]
            with served(url, GPUWARDEN_RUN_SCHEDULER="false") as (base, _):
                params = {
                    "metric": "sm_active",
                    "step": 3600,
                    "start": (end - timedelta(days=args.days)).isoformat(),
                    "end": end.isoformat(),
                }
                times = []
                with httpx.Client(
                    base_url=base, headers={"Authorization": f"Bearer {reader}"}
                ) as c:
                    for i in range(55):
                        t = time.perf_counter()
                        r = c.get(f"/api/v1/gpus/GPU-{1 + i % args.gpus:04d}/series", params=params)
                        dt = time.perf_counter() - t
                        assert r.status_code == 200 and len(r.json()["points"]) == args.days * 24, (
                            r.text[:200]
                        )
                        if i >= 5:
                            times.append(dt)
            print(
                f"{kind:10s} {args.days} d x {args.gpus} GPUs (filled in {fill_s:.0f} s): "
                f"30-day 1h series p50 {percentile(times, 50) * 1000:.1f} ms, "
                f"p99 {percentile(times, 99) * 1000:.1f} ms over HTTP ({len(times)} calls)"
            )


if __name__ == "__main__":
    main()
