"""Seconds for one acting round that reclaims N idle jobs through the action webhook, whose
receiver takes D seconds to answer each: reclaims sent one at a time (the old ladder, the
reference N x D) against GPUWARDEN_LADDER_PARALLEL_RECLAIMS at a time.

The jobs, their idle samples, the evaluation and the warnings are real (SQLite or PostgreSQL,
on a scripted clock); the receiver is a real HTTP server on loopback that sleeps D seconds.

    flock /tmp/bench.lock .venv/bin/python -m bench.ladder_reclaims --jobs 100 --delay 0.5
"""

from __future__ import annotations

import argparse
import base64
import statistics
import time
from datetime import timedelta

from sqlalchemy import create_engine

from bench.common import fresh_database, machine
from service.actions.registry import drivers_from
from service.api.app import create_app
from service.db import migrate
from service.settings import Settings
from service.usecases.evaluation import evaluate_once
from service.usecases.ladder import ladder_once
from service.usecases.outbox import Dispatcher
from service.usecases.upkeep import rollup_once
from tests.alerting_support import add_job
from tests.ladder_support import IDLE_HELD, STEPS, LadderWorld
from tests.receivers import Receiver
from tests.support import FakeClock

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


def one_run(url: str, *, jobs: int, delay: float, parallel: int) -> tuple[float, float, int]:
    """Seconds of the acting round that reclaims, the median seconds of the acting rounds
    before it (the round's own work), and how many jobs it reclaimed."""
    engine = create_engine(url)
    migrate.upgrade(engine)
    receiver = Receiver(delay_seconds=delay)  # the action webhook's
    notices = Receiver()  # the owners' channel: warnings go at once
    try:
        settings = Settings(
            database_url=url, run_scheduler=False, webhook_allow_nets="127.0.0.0/8",
            action_webhook_url=receiver.url, action_webhook_secret=SECRET,
            ladder_parallel_reclaims=parallel,
        )  # fmt: skip
        clock = FakeClock()
        app = create_app(settings, engine=engine, clock=clock)
        gpus = tuple(f"GPU-b{i:04d}" for i in range(jobs))
        world = LadderWorld(
            app.state.ctx, engine, clock, notices, drivers_from(settings), gpus=gpus
        )
        world.samples(1, IDLE_HELD)
        world.setup({"steps": STEPS, "dry_run": False})
        for i, gpu in enumerate(gpus):
            add_job(engine, f"batch:{i}", (gpu,), started_at=clock() - timedelta(minutes=1))
        others: list[float] = []
        for _ in range(14):
            world.samples(1, IDLE_HELD)
            rollup_once(world.ctx)
            evaluate_once(world.ctx)
            began = time.perf_counter()  # the acting round alone (its notices go after)
            result = ladder_once(world.ctx, drivers=world.drivers)
            seconds = time.perf_counter() - began
            Dispatcher(world.ctx).drain(budget_seconds=60)
            reclaimed = result.outcomes.get("reclaimed", 0)
            if reclaimed:
                return seconds, statistics.median(others), reclaimed
            others.append(seconds)
        raise RuntimeError("no round reclaimed")
    finally:
        receiver.close()
        notices.close()
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--delay", type=float, default=0.5, help="seconds the receiver takes")
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    args = parser.parse_args()
    print(f"machine: {machine()}; {args.jobs} jobs, receiver answers in {args.delay:g} s")
    print(f"reference, one at a time: {args.jobs * args.delay:.1f} s")
    for parallel in (1, 8):
        with fresh_database(args.database) as url:
            seconds, plain, reclaimed = one_run(
                url, jobs=args.jobs, delay=args.delay, parallel=parallel
            )
        print(
            f"parallel {parallel}: the acting round that reclaimed {reclaimed} jobs took {seconds:.1f} s"
            f" (one without reclaims: {plain:.2f} s)"
        )


if __name__ == "__main__":
    main()
