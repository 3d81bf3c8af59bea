"""Each node's clock, measured from the Date header its agent sends with every batch (the
ladder does not act on samples of a node whose clock is off: test_ladder_safety.py)."""

from __future__ import annotations

import email.utils
import time
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import Engine, select

from service.collectors.shipper import Shipper
from service.db.schema import nodes
from tests.receivers import Receiver
from tests.support import FakeClock, make_batch


def offset(engine: Engine) -> float | None:
    with engine.connect() as conn:
        value: float | None = conn.execute(
            select(nodes.c.clock_offset_seconds).where(nodes.c.hostname == "node-a")
        ).scalar_one()
    return value


def post(http: httpx.Client, token: str, clock: FakeClock, date: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} | ({"Date": date} if date else {})
    batch = make_batch(start=clock() - timedelta(minutes=1), count=3)
    return http.post("/api/v1/ingest", json=batch, headers=headers)


@pytest.mark.parametrize("behind_seconds", [600, 0, -45])
def test_the_date_header_measures_the_nodes_clock(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock,
    behind_seconds: int,
) -> None:  # fmt: skip
    date = email.utils.format_datetime(clock() - timedelta(seconds=behind_seconds), usegmt=True)
    r = post(http, tokens["agent"], clock, date)
    assert r.status_code == 200, r.text
    assert offset(engine) == pytest.approx(-behind_seconds, abs=1)


def test_metrics_report_each_nodes_clock(
    http: httpx.Client, tokens: dict[str, str], clock: FakeClock
) -> None:
    date = email.utils.format_datetime(clock() - timedelta(seconds=600), usegmt=True)
    assert post(http, tokens["agent"], clock, date).status_code == 200
    lines = [
        ln for ln in http.get("/metrics").text.splitlines() if ln.startswith("gpuwarden_node_clock")
    ]
    assert lines == ['gpuwarden_node_clock_offset_seconds{node="node-a"} -600.0']


@pytest.mark.parametrize("date", [None, "yesterday", "Mon, 07 Dec 2026 04:51:46"])
def test_no_readable_date_measures_nothing_and_loses_nothing(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock,
    date: str | None,
) -> None:  # fmt: skip
    r = post(http, tokens["agent"], clock, date)
    assert r.status_code == 200 and r.json()["samples_stored"] == 3, r.text
    assert offset(engine) is None


def test_the_agent_sends_its_clock_with_every_batch() -> None:
    receiver = Receiver()
    try:
        shipper = Shipper(central_url=receiver.url, token="t", timeout_seconds=5)
        assert shipper.send(b"\x1f\x8b").status == 200
        sent = email.utils.parsedate_to_datetime(receiver.received[0].headers["date"])
        # The send time by this machine's clock (generous: a loaded CI machine is slow).
        assert abs(sent.timestamp() - time.time()) < 120
    finally:
        receiver.close()
