"""Scenario: two central replicas on one PostgreSQL send each periodic report once, over several
period ends, while the leader is killed and comes back.

Two real `gpuwarden serve` processes share a fresh database and a config whose webhook channel
(a loopback receiver) takes every report; periods last 6 s so the test crosses several of them.
Alice's job (team ml) holds a GPU throughout. After the first period's reports arrive, the
replica holding the leader lock is killed with SIGKILL and started again: every period that was
reported has alice's, team ml's and the admins' report exactly once, and the claims table says
the same.
"""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import select

from service.clock import utc_now
from service.db import tokens_repo
from service.db.migrate import upgrade
from service.db.schema import report_sends
from tests.acceptance.leader_support import is_leader
from tests.alerting_support import auth
from tests.conftest import empty_engine
from tests.process_support import start_central, stop, wait_until
from tests.receivers import Receiver
from tests.support import every, free_port, iso, make_batch

CONFIG = """\
channels:
  - name: reports
    type: webhook
    url: {url}
"""
RECIPIENTS = {"user:alice", "team:ml", "admins"}
ENV = {
    "GPUWARDEN_REPORT_PERIOD_SECONDS": "6",
    "GPUWARDEN_REPORT_DELAY_SECONDS": "1",
    "GPUWARDEN_REPORT_INTERVAL_SECONDS": "0.5",
    "GPUWARDEN_REPORT_CHANNELS": "reports",
    "GPUWARDEN_EVAL_INTERVAL_SECONDS": "0.5",
    "GPUWARDEN_OUTBOX_INTERVAL_SECONDS": "0.5",
    "GPUWARDEN_WEBHOOK_ALLOW_NETS": "127.0.0.0/8",
    "GPUWARDEN_PUBLIC_URL": "https://warden.example",
}


def received(receiver: Receiver) -> list[tuple[str, str]]:
    """(period_start, recipient) of every report received, in order."""
    return [
        (m.json()["data"]["period_start"], m.json()["data"]["recipient"]) for m in receiver.received
    ]


def complete_periods(receiver: Receiver) -> set[str]:
    by_period: dict[str, set[str]] = {}
    for period, recipient in received(receiver):
        by_period.setdefault(period, set()).add(recipient)
    return {p for p, got in by_period.items() if got == RECIPIENTS}


@contextmanager
def holding_agent(bases: list[str], token: str) -> Iterator[None]:
    """GPU-a0 reports an idle-held sample every 5 s to whichever replica answers, so alice's job
    holds it in every period, however late the first one ends on a loaded machine."""

    def report() -> None:
        batch = make_batch(gpu_uuids=("GPU-a0",), start=utc_now(), count=1,
                           metrics={"sm_active": 0.0, "fb_used_bytes": 2**31})  # fmt: skip
        for base in bases:
            try:
                r = httpx.post(f"{base}/api/v1/ingest", json=batch, headers=auth(token),
                               timeout=10)  # fmt: skip
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                break

    with every(5.0, report, first_after=5.0):
        yield


def test_each_report_is_sent_once_across_replicas_and_a_restart(tmp_path: Path) -> None:
    receiver = Receiver()
    config = tmp_path / "gpuwarden.yaml"
    config.write_text(CONFIG.format(url=receiver.url + "/reports"))
    env = ENV | {"GPUWARDEN_CONFIG": str(config)}
    with empty_engine("postgresql", tmp_path) as engine:
        upgrade(engine)
        with engine.begin() as conn:
            admin, _ = tokens_repo.create_token(
                conn, role=tokens_repo.Role.ADMIN, node=None, name=None, now=utc_now()
            )
        url = engine.url.render_as_string(hide_password=False)
        ports = [free_port(), free_port()]
        logs = [tmp_path / f"replica{i}.log" for i in range(2)]
        procs: list[subprocess.Popen[bytes]] = [
            start_central(url, port, log, env) for port, log in zip(ports, logs, strict=True)
        ]
        bases = [f"http://127.0.0.1:{p}" for p in ports]
        try:
            start = datetime.now(UTC) - timedelta(seconds=30)
            with httpx.Client(base_url=bases[1], headers=auth(admin), timeout=30) as api:
                batch = make_batch(gpu_uuids=("GPU-a0",), start=start, count=3,
                                   metrics={"sm_active": 0.0, "fb_used_bytes": 2**31})  # fmt: skip
                assert api.post("/api/v1/ingest", json=batch).status_code == 200
                prices = [{"model_pattern": "*", "usd_per_gpu_hour": 3.6,
                           "effective_from": "2026-01-01T00:00:00Z"}]  # fmt: skip
                assert api.put("/api/v1/prices", json=prices).status_code == 200
                job = {"id": "slurm:7", "user": "alice", "team": "ml", "gpus": ["GPU-a0"],
                       "started_at": iso(start)}  # fmt: skip
                assert api.post("/api/v1/jobs", json=job).status_code == 201

            with holding_agent(bases, admin):
                wait_until(
                    "a period's reports", lambda: bool(complete_periods(receiver)), timeout=30
                )
                leader = next(i for i, base in enumerate(bases) if is_leader(base))
                stop(procs[leader], signal.SIGKILL)
                wait_until("the other replica to lead", lambda: is_leader(bases[1 - leader]))
                procs[leader] = start_central(url, ports[leader], logs[leader], env)
                wait_until(
                    "three periods' reports",
                    lambda: len(complete_periods(receiver)) >= 3,
                    timeout=60,
                )
            with httpx.Client(base_url=bases[leader], headers=auth(admin), timeout=30) as api:
                sends = api.get("/api/v1/reports/sends").json()
        finally:
            for proc in procs:
                stop(proc)
            receiver.close()
        got = received(receiver)
        twice = [key for key, n in Counter(got).items() if n > 1]
        assert not twice, f"sent more than once: {twice}"
        # A period is claimed and queued in one transaction, so the leader's death cuts none
        # short: each period has every report, or only the admins' before alice's job existed.
        by_period: dict[str, set[str]] = {}
        for period, recipient in got:
            by_period.setdefault(period, set()).add(recipient)
        first = min(complete_periods(receiver))
        for period, recipients in by_period.items():
            assert recipients == (RECIPIENTS if period >= first else {"admins"}), period
        with engine.connect() as conn:
            claims = conn.execute(
                select(report_sends.c.period_start, report_sends.c.recipient)
            ).all()
        markers = Counter(p for p, r in claims if r == "__period__")
        assert all(n == 1 for n in markers.values())
        assert {s["recipient"] for s in sends} == RECIPIENTS
        alice = next(m.json()["data"] for m in receiver.received
                     if m.json()["data"]["recipient"] == "user:alice")  # fmt: skip
        assert alice["figures"]["top_jobs"][0]["job_id"] == "slurm:7"
        assert "slurm:7" in alice["text"]
