"""Every response says the service's own time for it (``Server-Timing: app;dur=<ms>``), so a
benchmark or an operator tells server time from time on the wire or in a client's queue."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import httpx

from tests.support import FakeClock, make_batch

DUR = re.compile(r"^app;dur=(\d+\.\d)$")


def _server_ms(r: httpx.Response) -> float:
    found = DUR.match(r.headers.get("server-timing", ""))
    assert found, r.headers
    return float(found.group(1))


def test_answers_carry_the_servers_time_within_the_clients(
    http: httpx.Client, tokens: dict[str, str], clock: FakeClock
) -> None:
    agent = {"Authorization": f"Bearer {tokens['agent']}"}
    reader = {"Authorization": f"Bearer {tokens['reader']}"}
    batch = make_batch(start=clock() - timedelta(minutes=5), count=30)
    answers = []
    for method, path, kwargs in (
        ("POST", "/api/v1/ingest", {"json": batch, "headers": agent}),
        ("GET", "/api/v1/fleet", {"headers": reader}),
        ("GET", "/api/v1/reports/cost", {"headers": reader, "params": {"since": "1h"}}),
        ("GET", "/api/v1/reports/cost", {"headers": reader, "params": {"limit": "-1"}}),
        ("GET", "/api/v1/fleet", {}),  # no token: 401
        ("GET", "/healthz", {}),
    ):
        t0 = time.perf_counter()
        r = http.request(method, path, **kwargs)
        wall_ms = (time.perf_counter() - t0) * 1000.0
        answers.append(r.status_code)
        assert 0.0 <= _server_ms(r) <= wall_ms + 0.1, (path, r.headers["server-timing"], wall_ms)
    assert answers == [200, 200, 200, 422, 401, 200]
