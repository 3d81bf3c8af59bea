"""PostgreSQL restarted, then down for 15 s, while a real agent ships to a real central service.

Central and agent are ``gpuwarden`` processes on loopback; the database is a private cluster
(initdb on a free port) so stopping it touches no other test. During the outage central answers
503 (logged once, not a traceback per request), the agent spools, and when the database is back
the same central process (never restarted) stores everything: none lost, none doubled.
Bounded: about a minute.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy import Engine, func, select

from service.clock import utc_now
from service.db import tokens_repo
from service.db.engine import make_engine
from service.db.migrate import upgrade
from service.db.schema import gpus, samples
from tests.pg_cluster import Cluster, private_cluster
from tests.process_support import scrape, start_agent, start_central, stop, value, wait_until
from tests.support import free_port

INTERVAL_SECONDS = 0.2
OUTAGE_SECONDS = 15.0


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with private_cluster() as c:
        yield c


def count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(samples)).scalar_one())


def test_postgres_restart_and_outage_lose_nothing(cluster: Cluster, tmp_path: Path) -> None:
    with psycopg.connect(cluster.admin_url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE gpuwarden")
    url = cluster.url.rsplit("/", 1)[0] + "/gpuwarden"
    engine = make_engine(url)
    upgrade(engine)
    with engine.begin() as conn:
        token, _ = tokens_repo.create_token(
            conn, role=tokens_repo.Role.AGENT, node="node-a", name=None, now=utc_now()
        )
    port, metrics_port = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "central.log"
    central = start_central(url, port, log)
    agent = start_agent(
        central_url=base, token=token, state=tmp_path, metrics_port=metrics_port,
        args=["--backend", "simulated", "--node-name", "node-a",
              "--interval-seconds", str(INTERVAL_SECONDS), "--batch-seconds", "0.6"],
    )  # fmt: skip
    try:
        wait_until("samples stored", lambda: count(engine) >= 30, timeout=60)
        engine.dispose()  # our own connections die with the server too

        # 1. A restart (a crash: no shutdown checkpoint), straight back up.
        cluster.stop("immediate")
        cluster.start()
        wait_until("ingest after the restart", lambda: count(engine) >= 60, timeout=60)

        # 2. Down for 15 s: central answers 503 with Retry-After, the agent spools.
        engine.dispose()
        cluster.stop("fast")
        time.sleep(1)
        r = httpx.get(f"{base}/api/v1/gpus", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 503 and r.headers["Retry-After"].isdigit(), r.text
        assert httpx.get(f"{base}/readyz").status_code == 503
        time.sleep(OUTAGE_SECONDS - 1)
        spooled = value(scrape(metrics_port), "gpuwarden_agent_spool_batches")
        assert spooled >= 10, spooled  # polls kept while the database was away
        cluster.start()
        at_return = count(engine)

        # The same central process recovers on its own and takes the spool.
        wait_until("central ready again", lambda: _ready(base), timeout=30)
        wait_until(
            "the spool to drain",
            lambda: (
                value(scrape(metrics_port), "gpuwarden_agent_spool_batches") <= 3
                and count(engine) > at_return
            ),
            timeout=90,
        )
        assert central.poll() is None  # never restarted
        taken = value(scrape(metrics_port), "gpuwarden_agent_samples_collected_total")
        last_look = time.monotonic()
    finally:
        stop(agent)  # SIGTERM: the agent ships what it holds, then exits
        stopped_after = time.monotonic()
        stop(central, signal.SIGTERM)
    stored = count(engine)
    with engine.connect() as conn:
        n_gpus = int(conn.execute(select(func.count()).select_from(gpus)).scalar_one())
        distinct = int(
            conn.execute(
                select(func.count()).select_from(
                    select(samples.c.gpu_id, samples.c.ts).distinct().subquery()
                )
            ).scalar_one()
        )
    engine.dispose()
    agent_log = (tmp_path / "agent.log").read_text()
    central_log = log.read_text()
    print(f"postgres restart + {OUTAGE_SECONDS:g} s outage: {taken:.0f} taken, {stored} stored")
    assert stored >= taken, agent_log[-2000:]  # none lost
    assert distinct == stored  # none doubled
    # Nothing beyond what the agent took in the moments between the last look and its exit.
    polls_after = (stopped_after - last_look) / INTERVAL_SECONDS + 2
    assert stored <= taken + n_gpus * polls_after
    assert not (tmp_path / "dead-letter.jsonl").exists()
    # The outage was logged as such, a line or a few, not a traceback per request.
    assert "database unavailable" in central_log
    assert central_log.count("Traceback") <= 5, central_log[-4000:]


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
