"""What the scheduler's useful-work job costs: seconds per run to judge every GPU of a fleet
over the hold time (10 minutes of 10 s samples and process records with the host side), on
SQLite, beside the evaluation interval it runs in (the reference: it must take a small part).

    flock /tmp/bench.lock .venv/bin/python -m bench.useful_work        # --gpus 200 --runs 3
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import machine
from service.context import ServiceContext
from service.db.engine import make_engine
from service.db.migrate import upgrade
from service.settings import Settings
from service.usecases import ingest as ingest_service
from service.usecases.useful_work import judge_once
from service.wire import IngestBatch
from tests.alerting_support import add_job
from tests.support import FakeClock, iso

T0 = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
EVAL_INTERVAL_SECONDS = 30.0  # the default evaluation interval the job runs at
KEEP_ALIVE = {"sm_active": 0.48, "gr_engine_active": 0.5, "gpu_util": 0.5, "fb_used_bytes": 2**31}


def _batch(node: int, gpus: int, k: int) -> dict[str, Any]:
    ts = iso(T0 + timedelta(seconds=10 * k))
    uuids = [f"GPU-{node}-{i}" for i in range(gpus)]
    return {
        "node": {"hostname": f"node-{node}", "labels": {}},
        "gpus": [
            {"uuid": u, "index": i, "model": "NVIDIA H100 80GB HBM3", "fb_total_bytes": 80 * 2**30}
            for i, u in enumerate(uuids)
        ],
        "samples": [{"gpu_uuid": u, "ts": ts, "metrics": KEEP_ALIVE} for u in uuids],
        "processes": [
            {
                "gpu_uuid": u,
                "ts": ts,
                "pid": 100 + i,
                "host_cpu_seconds": 0.1 * k,
                "host_read_bytes": 1000,
                "host_write_bytes": 10,
                "host_voluntary_switches": 20 * k,
                "host_children": 0,
            }
            for i, u in enumerate(uuids)
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'gw.db'}"
        engine = make_engine(url)
        upgrade(engine)
        clock = FakeClock(T0 + timedelta(minutes=11))
        settings = Settings(database_url=url, run_scheduler=False)
        ctx = ServiceContext(settings=settings, engine=engine, clock=clock)
        nodes = max(1, args.gpus // 8)
        for node in range(nodes):
            for k in range(0, 66, 6):
                parts = [_batch(node, 8, j) for j in range(k, k + 6)]
                body = parts[0] | {
                    "samples": [s for b in parts for s in b["samples"]],
                    "processes": [p for b in parts for p in b["processes"]],
                }
                ingest_service.ingest(
                    ctx, IngestBatch.model_validate(body), token_node=f"node-{node}"
                )
            # Started before the samples: every sample of the run's look-back (an evaluation
            # interval and the longest gap, 90 s: 9 samples) has a hold time of its own to judge.
            add_job(
                engine,
                f"job-{node}",
                tuple(f"GPU-{node}-{i}" for i in range(8)),
                started_at=T0 - timedelta(minutes=5),
            )
        now = T0 + timedelta(minutes=10, seconds=30)
        took = []
        for _ in range(args.runs):
            t = time.perf_counter()
            judged = judge_once(engine, settings, now=now)
            took.append(time.perf_counter() - t)
        best = min(took)
        print(machine())
        print(f"{len(judged)} GPUs judged ({sum(1 for j in judged if j.verdict.cause)} sham)")
        print(f"useful_work job: {best:.3f} s per run (best of {args.runs}), "
              f"{1000 * best / len(judged):.2f} ms per GPU; reference: the evaluation interval, "
              f"{EVAL_INTERVAL_SECONDS:.0f} s")  # fmt: skip


if __name__ == "__main__":
    main()
