"""Ingest past capacity degrades: refused early with Retry-After, never stored behind a client's back.

Agents replaying their spools after an outage arrive all at once with large batches; the service
answers what it cannot take in time 503 + Retry-After (nothing stored) instead of letting them
wait out their timeout, and after they retry every sample is stored exactly once.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import func, select, text

from service.api.app import create_app
from service.db.schema import samples
from tests.alerting_support import auth
from tests.conftest import make_token
from tests.support import live_server, make_batch

SENDERS = 24
GPUS = 8
POLLS = 250  # 2,000 samples a batch: a spool's replay, not a live 30 s batch
# The timeout each sender announces and keeps: a request that runs into it fails the test.
TIMEOUT_SECONDS = 60.0
MAX_ATTEMPTS = 500  # a sender refused this often is a livelock, not a degraded service


def test_a_spool_replay_flood_is_refused_early_and_every_sample_lands_once(
    settings, engine, clock
) -> None:
    settings = settings.model_copy(update={"ingest_max_concurrent": 2, "ingest_wait_seconds": 0.2})
    app = create_app(settings, engine=engine, clock=clock)
    start = clock() - timedelta(seconds=10 * POLLS)
    senders = []
    for k in range(SENDERS):
        node = f"node-{k:02d}"
        batch = make_batch(
            hostname=node,
            gpu_uuids=tuple(f"GPU-{k:02d}-{g}" for g in range(GPUS)),
            start=start,
            count=POLLS,
        )
        senders.append((make_token(engine, "agent", node), batch))
    headers = {"X-Request-Timeout": f"{TIMEOUT_SECONDS:g}"}
    with live_server(app) as url:

        async def send(client: httpx.AsyncClient, token: str, batch: dict[str, Any]) -> list[Any]:
            tries = []
            for _ in range(MAX_ATTEMPTS):
                began = asyncio.get_running_loop().time()  # for order only: what overlapped
                r = await client.post("/api/v1/ingest", json=batch, headers=auth(token) | headers)
                ended = asyncio.get_running_loop().time()
                tries.append((r.status_code, began, ended, r.headers.get("Retry-After"), r.json()))
                if r.status_code == 200:
                    return tries
                assert r.status_code in (429, 503), r.text
                # As the agent does: wait what Retry-After says (capped here to keep it short).
                await asyncio.sleep(min(float(r.headers["Retry-After"]), 0.5))
            raise AssertionError(f"never stored after {MAX_ATTEMPTS} attempts")

        async def main() -> list[list[Any]]:
            limits = httpx.Limits(max_connections=SENDERS * 2)
            async with httpx.AsyncClient(
                base_url=url, timeout=TIMEOUT_SECONDS, limits=limits
            ) as client:
                return await asyncio.gather(*(send(client, t, b) for t, b in senders))

        # A request that runs into TIMEOUT_SECONDS raises here: no sender waits out its timeout.
        attempts = [a for tries in asyncio.run(main()) for a in tries]

    outcomes = Counter(code for code, *_ in attempts)
    assert set(outcomes) <= {200, 429, 503}, outcomes
    assert outcomes[200] == SENDERS and outcomes[503] >= 1, outcomes
    stored = [(began, ended) for code, began, ended, _, _ in attempts if code == 200]
    for code, began, ended, retry_after, body in attempts:
        if code == 200:
            continue
        assert retry_after is not None and retry_after.isdigit(), (code, retry_after)
        assert "nothing stored" in body["detail"], body
        # Refused while the slots were busy: it overlapped a batch that was being stored.
        assert any(b < ended and began < e for b, e in stored), (began, ended)
    # Each batch was stored by its one accepted attempt (a refused attempt stored nothing, or the
    # accepted one would find its samples already there), and every sample is there once.
    total = SENDERS * GPUS * POLLS
    new = [body["samples_stored"] for code, _, _, _, body in attempts if code == 200]
    assert new == [GPUS * POLLS] * SENDERS
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(samples)).scalar_one() == total


def test_a_batch_past_the_clients_timeout_is_answered_503_and_not_stored(
    app, http: httpx.Client, tokens, engine, clock
) -> None:
    batch = make_batch(start=clock(), count=3)
    agent = auth(tokens["agent"])
    # A nanosecond: the deadline has passed by the time the batch could be committed.
    late = http.post("/api/v1/ingest", json=batch, headers=agent | {"X-Request-Timeout": "1e-9"})
    assert late.status_code == 503, late.text
    assert late.headers["Retry-After"].isdigit()
    assert "nothing stored" in late.json()["detail"]
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(samples)).scalar_one() == 0
    r = http.post("/api/v1/ingest", json=batch, headers=agent | {"X-Request-Timeout": "30"})
    assert r.status_code == 200, r.text
    assert r.json()["samples_stored"] == 3


def test_a_malformed_request_timeout_is_a_422_naming_the_header(
    http: httpx.Client, tokens, clock
) -> None:
    batch = make_batch(start=clock())
    for bad in ("soon", "0", "-5", "nan", "inf"):
        r = http.post(
            "/api/v1/ingest",
            json=batch,
            headers=auth(tokens["agent"]) | {"X-Request-Timeout": bad},
        )
        assert r.status_code == 422, (bad, r.text)
        assert "X-Request-Timeout" in r.text, r.text


def test_a_batch_whose_client_hung_up_while_it_was_stored_is_rolled_back(
    app, server: str, tokens, engine, clock
) -> None:
    batch = make_batch(start=clock(), count=5)
    body = json.dumps(batch).encode()
    host, port = server.removeprefix("http://").split(":")
    head = (
        f"POST /api/v1/ingest HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {tokens['agent']}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    outcomes = app.state.ctx.telemetry.ingest_batches
    with _writes_held(engine):
        # The batch's writes wait on the lock: the client hangs up while it is being stored.
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(head.encode() + body)
            _until(lambda: app.state.admission.busy().get("ingest") == 1)
        # The server notices the hang-up on its idle event loop, then the lock goes.
        time.sleep(1.0)
    _until(lambda: _count(outcomes, "stored", "refused", "error") >= 1)
    assert _count(outcomes, "refused") == 1 and _count(outcomes, "stored") == 0
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(samples)).scalar_one() == 0


@contextmanager
def _writes_held(engine: Any) -> Iterator[None]:
    """Every other writer of the samples waits while the block runs."""
    if engine.dialect.name == "sqlite":
        held = sqlite3.connect(engine.url.database, isolation_level=None)
        held.execute("BEGIN IMMEDIATE")  # SQLite's one writer
        try:
            yield
        finally:
            held.execute("ROLLBACK")
            held.close()
        return
    with engine.connect() as conn:
        conn.execute(text("LOCK TABLE samples IN SHARE ROW EXCLUSIVE MODE"))
        yield
        conn.rollback()


def _count(counter: Any, *outcomes: str) -> float:
    return float(sum(counter.labels(o)._value.get() for o in outcomes))


def _until(done: Any) -> None:
    give_up_at = time.monotonic() + 60  # catches a hang only
    while not done():
        assert time.monotonic() < give_up_at, "timed out"
        time.sleep(0.05)
