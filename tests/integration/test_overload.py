"""Overload is refused, not absorbed: bad tokens, floods of readers and agents at the same time."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import event, func, select

from service.api.app import create_app
from service.db.schema import samples
from tests.alerting_support import auth
from tests.conftest import make_token
from tests.support import live_server, make_batch


def _count_statements(engine: Any) -> list[str]:
    seen: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _record(_c: Any, _cur: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    return seen


def _token_lookups(statements: list[str]) -> int:
    return sum("api_tokens" in s for s in statements)


def test_a_bad_token_costs_one_lookup_then_none(app, http: httpx.Client) -> None:
    statements = _count_statements(app.state.ctx.ingest_engine)
    bad = {"Authorization": "Bearer gw_not-a-real-token"}
    answers = [http.get("/api/v1/gpus", headers=bad).status_code for _ in range(5)]
    assert answers == [401] * 5
    assert _token_lookups(statements) == 1


def test_failures_are_throttled_per_client_but_valid_tokens_never(
    settings, engine, clock, tokens
) -> None:
    settings = settings.model_copy(
        update={"auth_failure_burst": 5, "auth_failure_refill_per_second": 0.01}
    )
    app = create_app(settings, engine=engine, clock=clock)
    with live_server(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        reader, agent = auth(tokens["reader"]), auth(tokens["agent"])
        assert http.get("/api/v1/gpus", headers=reader).status_code == 200
        batch = make_batch(start=clock())
        assert http.post("/api/v1/ingest", json=batch, headers=agent).status_code == 200
        statements = _count_statements(app.state.ctx.ingest_engine)
        codes = [
            http.get("/api/v1/gpus", headers=auth(secrets.token_urlsafe(16))).status_code
            for _ in range(12)
        ]
        assert codes == [401] * 5 + [429] * 7
        # The same bad token again costs no lookup, from a throttled client or not.
        looked_up = _token_lookups(statements)
        again = auth("gw_the-same-bad-token")
        assert [http.get("/api/v1/gpus", headers=again).status_code for _ in range(4)] == [429] * 4
        assert _token_lookups(statements) == looked_up + 1
        r = http.get("/api/v1/gpus")
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        # Tokens seen valid pass, also once their cache entry has expired (a later lookup).
        app.state.gate._good.clear()
        assert http.get("/api/v1/gpus", headers=reader).status_code == 200
        assert http.post("/api/v1/ingest", json=batch, headers=agent).status_code == 200
        # X-Forwarded-For is not believed from a peer that is not a trusted proxy.
        spoofed = auth("nope") | {"X-Forwarded-For": "203.0.113.9"}
        assert http.get("/api/v1/gpus", headers=spoofed).status_code == 429


def test_a_failing_client_never_blocks_a_valid_tokens_first_request(
    settings, engine, clock
) -> None:
    """Clients behind one address (a NAT, a proxy, a node): one fails, the others get in."""
    settings = settings.model_copy(
        update={"auth_failure_burst": 3, "auth_failure_refill_per_second": 0.001}
    )
    app = create_app(settings, engine=engine, clock=clock)
    with live_server(app) as url, httpx.Client(base_url=url, timeout=10) as http:

        def fail() -> int:
            return http.get("/api/v1/gpus", headers=auth(secrets.token_urlsafe(16))).status_code

        assert [fail() for _ in range(5)] == [401] * 3 + [429] * 2
        for _ in range(10):
            # Each new valid token's first request passes while the address keeps failing.
            assert fail() == 429
            reader = make_token(engine, "reader")
            assert http.get("/api/v1/gpus", headers=auth(reader)).status_code == 200
            assert fail() == 429
            admin = make_token(engine, "admin")
            login = http.post("/api/v1/session", json={"token": admin})
            assert login.status_code == 200, login.text
            http.cookies.clear()
            assert fail() == 429
            node = f"node-{secrets.token_hex(4)}"
            agent = make_token(engine, "agent", node)
            batch = make_batch(start=clock(), hostname=node, gpu_uuids=(f"GPU-{node}",))
            r = http.post("/api/v1/ingest", json=batch, headers=auth(agent))
            assert r.status_code == 200, r.text
        # The failing client stays throttled, with or without a token.
        assert fail() == 429
        assert http.get("/api/v1/gpus").status_code == 429


def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_budget(
    settings, engine, clock
) -> None:
    settings = settings.model_copy(
        update={
            "auth_failure_burst": 2,
            "auth_failure_refill_per_second": 0.01,
            "trusted_proxies": "127.0.0.1/32",
        }
    )
    app = create_app(settings, engine=engine, clock=clock)
    with live_server(app) as url, httpx.Client(base_url=url, timeout=10) as http:

        def attempt(client: str) -> int:
            headers = auth("nope") | {"X-Forwarded-For": f"{client}, 127.0.0.1"}
            return http.get("/api/v1/gpus", headers=headers).status_code

        assert [attempt("198.51.100.1") for _ in range(3)] == [401, 401, 429]
        assert [attempt("198.51.100.2") for _ in range(3)] == [401, 401, 429]


def test_readers_past_the_bound_get_503_fast_while_agents_ingest(
    settings, engine, clock, tokens
) -> None:
    settings = settings.model_copy(
        update={"max_concurrent_reads": 2, "max_expensive_reads": 1, "admission_wait_seconds": 0.2}
    )
    app = create_app(settings, engine=engine, clock=clock)
    reader, agent = auth(tokens["reader"]), auth(tokens["agent"])
    with live_server(app) as url:

        async def read(client: httpx.AsyncClient, path: str) -> tuple[int, float, float]:
            began = time.perf_counter()  # for order only: which requests overlapped
            r = await client.get(path, headers=reader)
            if r.status_code == 503:
                assert r.headers["Retry-After"].isdigit()
            return r.status_code, began, time.perf_counter()

        async def ship(client: httpx.AsyncClient, k: int) -> int:
            await asyncio.sleep(0.05 * k)
            batch = make_batch(start=clock() - timedelta(seconds=k))
            r = await client.post("/api/v1/ingest", json=batch, headers=agent)
            return r.status_code

        async def main() -> tuple[list[Any], list[Any]]:
            limits = httpx.Limits(max_connections=300)
            async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
                paths = ["/api/v1/reports/cost", "/api/v1/gpus", "/api/v1/jobs"] * 40
                readers = [read(client, p) for p in paths]
                agents = [ship(client, k) for k in range(10)]
                got = await asyncio.gather(*readers, *agents)
            return list(got[: len(paths)]), list(got[len(paths) :])

        reads, ships = asyncio.run(main())
    outcomes = Counter(code for code, _, _ in reads)
    assert set(outcomes) <= {200, 503}, outcomes
    assert outcomes[200] >= 2 and outcomes[503] >= 1, outcomes
    # Each 503 came while the slots were held: it overlapped a read that was let in, so it was
    # answered before that slot freed, not after waiting its turn.
    served = [(began, ended) for code, began, ended in reads if code == 200]
    for code, began, ended in reads:
        if code == 503:
            assert any(b < ended and began < e for b, e in served), (began, ended)
    # Every agent's batch was taken and stored meanwhile: nothing lost to the readers.
    assert ships == [200] * 10
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(samples)).scalar_one() == 10


@pytest.mark.parametrize("n", [60])
def test_a_burst_of_bad_tokens_is_answered_without_waiting_for_connections(
    server: str, n: int
) -> None:
    async def main() -> list[int]:
        async with httpx.AsyncClient(base_url=server, timeout=30) as client:
            rs = await asyncio.gather(
                *(client.get("/api/v1/gpus", headers=auth(f"bad-{i}")) for i in range(n))
            )
        return [r.status_code for r in rs]

    codes = asyncio.run(main())  # the client's timeout (30 s) catches a hang; speed: bench/
    assert len(codes) == n and set(codes) <= {401, 429}, Counter(codes)
