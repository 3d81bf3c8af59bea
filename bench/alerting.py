"""Alerting speed: breach-to-webhook latency (for 0, 1 s interval) and a 100 x 1,000 round on PostgreSQL.

Run: .venv/bin/python bench/alerting.py [--pg postgresql://postgres@127.0.0.1:5432/postgres]
       [--trials 40] [--gpus 1000] [--policies 100] [--rounds 5]
It creates (and drops) its own PostgreSQL databases and prints the numbers.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import Engine, insert, select, text

# Appended, not first: PYTHONPATH (another copy of the code, timed against this one) wins.
sys.path.append(str(Path(__file__).resolve().parents[1]))

from bench.common import fresh_database
from service.api.app import create_app
from service.clock import utc_now
from service.context import ServiceContext
from service.db import partitions, policies_repo, tokens_repo
from service.db.engine import make_engine
from service.db.migrate import upgrade
from service.db.schema import gpus, job_gpus, jobs, nodes, samples
from service.settings import Settings
from service.thresholds.policy import PolicySpec
from service.usecases.evaluation import StateCache, evaluate_once
from service.usecases.upkeep import partitions_once
from tests.receivers import Receiver
from tests.support import live_server, make_batch


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bench_latency(db_url: str, trials: int) -> None:
    engine = make_engine(db_url)
    upgrade(engine)
    receiver = Receiver()
    settings = Settings(
        database_url=db_url,
        eval_interval_seconds=1.0,
        outbox_interval_seconds=0.5,
        webhook_allow_nets="127.0.0.0/8",
    )
    with engine.begin() as conn:
        admin, _ = tokens_repo.create_token(
            conn, role=tokens_repo.Role.ADMIN, node=None, name=None, now=utc_now()
        )
        policies_repo.create_channel(
            conn,
            channel=policies_repo.ChannelSpec(
                name="hook",
                type="webhook",
                url=receiver.url,
                secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            ),
            source="api",
            now=utc_now(),
        )
        policies_repo.create_policy(
            conn,
            policy=PolicySpec.model_validate(
                {
                    "name": "hot",
                    "metric": "temperature_celsius",
                    "aggregate": "max",
                    "window": "30s",
                    "op": ">",
                    "threshold": 85,
                    "for": "0s",
                    "channels": ["hook"],
                }
            ),
            source="api",
            now=utc_now(),
        )
    latencies = []
    with (
        live_server(create_app(settings, engine=engine)) as url,
        httpx.Client(base_url=url) as http,
    ):
        for i in range(trials):
            gpu = f"GPU-bench-{i}"
            batch = make_batch(
                hostname=f"node-{i}",
                gpu_uuids=(gpu,),
                start=datetime.now(UTC),
                metrics={"temperature_celsius": 95.0},
            )
            seen = len(receiver.received)
            # Spread breaches over the evaluation interval, as real ones are.
            time.sleep(random.uniform(0, 1.0))
            t0 = time.time()
            r = http.post(
                "/api/v1/ingest", json=batch, headers={"Authorization": f"Bearer {admin}"}
            )
            r.raise_for_status()
            while not any(m.json()["labels"]["gpu_uuid"] == gpu for m in receiver.received[seen:]):
                if time.time() - t0 > 30:
                    raise RuntimeError(f"no notification for {gpu}")
                time.sleep(0.005)
            got = next(m for m in receiver.received[seen:] if m.json()["labels"]["gpu_uuid"] == gpu)
            latencies.append(got.at - t0)
    receiver.close()
    engine.dispose()
    print(f"breach -> webhook, for=0, eval interval 1 s, {trials} breaches:")
    print(
        f"  p50 {statistics.median(latencies):.3f} s  p99 {pct(latencies, 0.99):.3f} s  "
        f"max {max(latencies):.3f} s  (target p99 <= 3 s)"
    )


def populate(engine: Engine, n_gpus: int, now: datetime, history: int) -> None:
    """n_gpus GPUs on 8-GPU nodes, ``history`` 10 s samples each, 4-GPU jobs on half of them."""
    rng = random.Random(7)
    with engine.begin() as conn:
        node_rows = [
            {"hostname": f"node-{i:04d}", "labels": {}, "first_seen_at": now, "last_seen_at": now}
            for i in range(n_gpus // 8)
        ]
        conn.execute(insert(nodes), node_rows)
        node_ids = list(conn.execute(select(nodes.c.id).order_by(nodes.c.id)).scalars())
        conn.execute(
            insert(gpus),
            [
                {
                    "uuid": f"GPU-{i:05d}",
                    "node_id": node_ids[i // 8],
                    "gpu_index": i % 8,
                    "model": "NVIDIA H100 80GB HBM3",
                    "fb_total_bytes": 80 * 2**30,
                    "first_seen_at": now,
                    "last_sample_at": now,
                }
                for i in range(n_gpus)
            ],
        )
        gpu_ids = list(conn.execute(select(gpus.c.id).order_by(gpus.c.id)).scalars())
        # Older history, so the window queries run against a realistically full partition.
        partitions.ensure_partitions(
            conn, {(now - timedelta(seconds=10 * history)).date(), now.date()}
        )
        conn.execute(
            text(
                "INSERT INTO samples (gpu_id, ts, source, sm_active, fb_used_bytes, power_watts,"
                " temperature_celsius) SELECT g.id, :now - s * interval '10 seconds', 'gpm', 0.7,"
                " 21474836480, 300, 60 FROM gpus g, generate_series(60, :n) s"
            ),
            {"now": now, "n": history},
        )
        rows = []
        for k, gid in enumerate(gpu_ids):
            idle = k % 20 == 0  # 5 % of GPUs idle (and holding memory), 1 % hot, 0.5 % XID
            for s in range(60):
                rows.append(
                    {
                        "gpu_id": gid,
                        "ts": now - timedelta(seconds=10 * s),
                        "source": "gpm",
                        "sm_active": 0.0 if idle else rng.uniform(0.4, 0.99),
                        "fb_used_bytes": 20 * 2**30,
                        "power_watts": rng.uniform(100, 700),
                        "temperature_celsius": 90.0 if k % 100 == 1 else rng.uniform(40, 80),
                        "xid_last": 79 if (k % 200 == 3 and s == 0) else None,
                    }
                )
            if len(rows) >= 20_000:
                conn.execute(insert(samples), rows)
                rows = []
        if rows:
            conn.execute(insert(samples), rows)
        job_rows, jg = [], []
        for j in range(n_gpus // 8):
            job_id = f"slurm:{j}"
            job_rows.append(
                {
                    "id": job_id,
                    "user": f"u{j % 17}",
                    "team": f"t{j % 5}",
                    "project": None,
                    "labels": {},
                    "source": "api",
                    "started_at": now - timedelta(hours=1),
                    "created_at": now,
                    "updated_at": now,
                }
            )
            for g in gpu_ids[8 * j : 8 * j + 4]:
                jg.append(
                    {
                        "job_id": job_id,
                        "gpu_id": g,
                        "started_at": now - timedelta(hours=1),
                        "source": "api",
                    }
                )
        conn.execute(insert(jobs), job_rows)
        conn.execute(insert(job_gpus), jg)


def policies(n: int) -> list[PolicySpec]:
    kinds = [
        {"metric": "sm_active", "aggregate": "avg", "op": "<", "threshold": 0.3, "scope": "job"},
        {"metric": "sm_active", "aggregate": "avg", "op": "<", "threshold": 0.05, "scope": "gpu"},
        {"metric": "idle_held", "aggregate": "min", "op": ">=", "threshold": 1, "scope": "gpu"},
        {
            "metric": "hardware_fault",
            "aggregate": "max",
            "op": ">=",
            "threshold": 1,
            "scope": "gpu",
        },
        {
            "metric": "temperature_celsius",
            "aggregate": "avg",
            "op": ">",
            "threshold": 85,
            "scope": "gpu",
        },
        {"metric": "power_watts", "aggregate": "avg", "op": ">", "threshold": 650, "scope": "node"},
    ]
    windows = ["1m", "5m", "10m"]
    return [
        PolicySpec.model_validate(
            {"name": f"p{i:03d}", "window": windows[i % 3], "for": "0s", **kinds[i % len(kinds)]}
        )
        for i in range(n)
    ]


def bench_round(db_url: str, n_gpus: int, n_policies: int, rounds: int, history: int) -> None:
    engine = make_engine(db_url)
    upgrade(engine)
    now = utc_now()
    ctx = ServiceContext(settings=Settings(database_url=db_url), engine=engine, clock=lambda: now)
    partitions_once(ctx)
    t = time.perf_counter()
    populate(engine, n_gpus, now, history)
    print(f"populated {n_gpus} GPUs x {history} samples in {time.perf_counter() - t:.1f} s")
    with engine.begin() as conn:
        for p in policies(n_policies):
            policies_repo.create_policy(conn, policy=p, source="api", now=now)
    times, changes, cpu = [], [], []
    cache = StateCache()
    for i in range(rounds):
        c0 = time.process_time()
        result = evaluate_once(ctx, cache=cache)  # as the leader runs it
        cpu.append(time.process_time() - c0)
        times.append(result.seconds)
        changes.append(result.transitions)
        phases = ", ".join(f"{k} {v:.3f}" for k, v in result.phase_seconds.items())
        print(
            f"  round {i}: {result.seconds:.3f} s wall ({phases}), {cpu[-1]:.3f} s CPU in this process"
        )
        now = now + timedelta(seconds=10) if i else now
    print(
        f"evaluation round, {n_policies} policies x {n_gpus} GPUs on PostgreSQL, {rounds} rounds:"
    )
    print(
        f"  first {times[0]:.3f} s ({changes[0]} new alerts), then median "
        f"{statistics.median(times[1:]):.3f} s, max {max(times[1:]):.3f} s  (target < 1 s)"
    )
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--policies", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--history", type=int, default=1080, help="samples per GPU (10 s apart)")
    args = parser.parse_args()
    if not args.skip_latency:
        with fresh_database("postgresql", args.pg) as url:
            bench_latency(url, args.trials)
    with fresh_database("postgresql", args.pg) as url:
        bench_round(url, args.gpus, args.policies, args.rounds, args.history)


if __name__ == "__main__":
    main()
