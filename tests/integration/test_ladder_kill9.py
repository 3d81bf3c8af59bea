"""``kill -9`` of the central between a job's second warning and its reclaim, on both stores:
after the restart the reclaim happens once, at its time.

A real ``gpuwarden serve`` process acts, its Slurm commands pointed at stand-ins that record
each call (the real-Slurm test covers scancel itself); a thread plays the agent, posting an
idle-held sample every second (and those the outage kept from arriving, once it is back)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import Engine, select

from service.clock import utc_now
from service.db import policies_repo
from service.db.schema import ladder_actions
from service.settings import Settings
from service.thresholds.policy import parse_channel, parse_policy
from tests.alerting_support import add_job, auth
from tests.ladder_support import IDLE_HELD, idle_policy
from tests.process_support import start_central, stop, wait_until
from tests.receivers import Receiver
from tests.slurm_support import squeue_stand_in
from tests.support import every, free_port, make_batch

JOB = "slurm:77"
RECLAIM_AFTER_SECONDS = 20
LADDER = {
    "steps": [
        {"action": "notify_owner", "after": "2s"},
        {"action": "notify_owner", "after": "4s"},
        {"action": "reclaim", "after": f"{RECLAIM_AFTER_SECONDS}s"},
    ],
    "dry_run": False,
}


@contextmanager
def idle_agent(url: str, token: str) -> Iterator[None]:
    """Post one idle-held sample a second for GPU-a0; samples that fail are posted again."""
    due: list[datetime] = []

    def post_due(http: httpx.Client) -> None:
        due.append(utc_now().replace(microsecond=0))
        while due:
            batch = make_batch(start=due[0], count=1, metrics=IDLE_HELD)
            try:
                ok = http.post("/api/v1/ingest", json=batch, headers=auth(token))
            except httpx.HTTPError:
                return
            if ok.status_code != 200:
                return
            due.pop(0)

    with httpx.Client(base_url=url, timeout=5) as http, every(1.0, lambda: post_due(http)):
        yield


def stand_ins(tmp: Path) -> dict[str, str]:
    """The settings pointing at the squeue and scancel stand-ins (squeue's is written with the
    job, by ``squeue_stand_in``): each cancel is logged."""
    calls, cancelled = tmp / "scancel.calls", tmp / "cancelled"
    (tmp / "scancel").write_text(
        f'#!/bin/sh\necho "$(date +%s.%N) $*" >> {calls}\ntouch {cancelled}\n'
    )
    (tmp / "scancel").chmod(0o755)
    return {
        "GPUWARDEN_SLURM_SQUEUE_COMMAND": str(tmp / "squeue"),
        "GPUWARDEN_SLURM_CANCEL_COMMAND": str(tmp / "scancel"),
        "GPUWARDEN_EVAL_INTERVAL_SECONDS": "0.5",
        "GPUWARDEN_OUTBOX_INTERVAL_SECONDS": "0.5",
        "GPUWARDEN_WEBHOOK_ALLOW_NETS": "127.0.0.0/8",
    }


def steps(engine: Engine) -> list[tuple[str, str, datetime, datetime | None]]:
    with engine.connect() as conn:
        rows = conn.execute(select(ladder_actions).order_by(ladder_actions.c.id)).all()
    return [(r.action, r.outcome, r.at, r.since) for r in rows]


def test_a_restart_between_the_warnings_and_the_reclaim_reclaims_once_at_its_time(
    engine: Engine, settings: Settings, tokens: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "central.log"
    env = stand_ins(tmp_path)
    receiver = Receiver()
    central = start_central(settings.database_url, port, log, env)
    try:
        with idle_agent(url, tokens["agent"]):
            wait_until("the GPU is known", lambda: _gpu_known(engine), timeout=30)
            now = utc_now()
            add_job(engine, JOB, ("GPU-a0",), started_at=now - timedelta(seconds=30))
            # The job runs, as GPU Warden recorded it, until cancelled.
            squeue_stand_in(
                tmp_path / "squeue", "77", user="alice", started_at=now - timedelta(seconds=30),
                gone_when=tmp_path / "cancelled",
            )  # fmt: skip
            with engine.begin() as conn:
                channel = parse_channel({"name": "owners", "type": "webhook", "url": receiver.url})
                policies_repo.put_channel(conn, channel=channel, source="api", now=now)
                policy = parse_policy(idle_policy(LADDER) | {"window": "30s"})
                policies_repo.put_policy(conn, policy=policy, source="api", now=now)
            wait_until("the second warning", lambda: len(steps(engine)) >= 2, timeout=60)
            stop(central, signal.SIGKILL)
            killed_at = utc_now()
            (_, _, _, since), *_ = steps(engine)
            assert since is not None and killed_at < since + timedelta(
                seconds=RECLAIM_AFTER_SECONDS
            )
            central = start_central(settings.database_url, port, log, env)
            wait_until("the reclaim", lambda: len(steps(engine)) >= 3, timeout=90)
            time.sleep(3)  # a few more rounds: nothing is repeated
    finally:
        stop(central)
        receiver.close()
    done = steps(engine)
    assert [(a, o) for a, o, _, _ in done] == [
        ("notify_owner", "warned"), ("notify_owner", "warned"), ("reclaim", "reclaimed"),
    ], log.read_text()[-3000:]  # fmt: skip
    (call,) = (tmp_path / "scancel.calls").read_text().splitlines()
    assert call.split()[1] == "77"
    reclaim_at = done[2][2]
    assert reclaim_at - since >= timedelta(seconds=RECLAIM_AFTER_SECONDS)
    assert float(call.split()[0]) >= (since + timedelta(seconds=RECLAIM_AFTER_SECONDS)).timestamp()
    print(
        f"ladder kill -9: killed {(killed_at - since).total_seconds():.1f} s into the episode, "
        f"reclaimed at {(reclaim_at - since).total_seconds():.1f} s (due at {RECLAIM_AFTER_SECONDS} s)"
    )


def _gpu_known(engine: Engine) -> bool:
    from service.db.schema import gpus

    with engine.connect() as conn:
        return conn.execute(select(gpus.c.id).where(gpus.c.uuid == "GPU-a0")).first() is not None
