"""GPU prices from a running OpenCost (GPUWARDEN_OPENCOST_URL): its /allocation/compute answer,
served by a real HTTP server on loopback, prices the GPUs of the nodes it names; the source is
shown as opencost; a failed read keeps the prices last read and says so, never fails a report;
the recorded real answer of a cluster without GPUs leaves the price table in force. On SQLite
and PostgreSQL."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from service.settings import Settings
from service.usecases import opencost_prices
from tests.integration.cost_data import money_example_metrics, roll_up, store_series
from tests.receivers import LoopbackHttp
from tests.support import FakeClock, auth, iso

RECORDED = Path(__file__).resolve().parents[1] / "data" / "opencost"
T0 = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)  # the clock stands at 08:00
WINDOW_HOURS = 7 * 24.0


def recorded() -> dict[str, Any]:
    """The real answer OpenCost's project publishes (tests/data/opencost/README.md)."""
    answer: dict[str, Any] = json.loads(
        (RECORDED / "allocation-compute-by-namespace.json").read_text()
    )
    return answer


def gpu_answer(node: str, usd_per_gpu_hour: float) -> dict[str, Any]:
    """The recorded answer with its ``opencost`` allocation moved onto ``node`` and holding one
    GPU for the whole week at ``usd_per_gpu_hour`` (no other field changed)."""
    answer = copy.deepcopy(recorded())
    alloc = answer["data"][0]["opencost"]
    alloc["properties"]["node"] = node
    alloc.update(gpuCount=1, gpuHours=WINDOW_HOURS, gpuCost=WINDOW_HOURS * usd_per_gpu_hour)
    return answer


@dataclass
class FakeOpenCost(LoopbackHttp):
    """OpenCost's API on loopback: answers GET with ``answer`` (JSON) and ``status``."""

    answer: Any = None
    status: int = 200
    asked: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.asked.append(self.path)
                body = json.dumps(outer.answer).encode()
                self.send_response(outer.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.serve(Handler)


@pytest.fixture
def opencost() -> Iterator[FakeOpenCost]:
    opencost_prices.forget()
    server = FakeOpenCost(answer=gpu_answer("node-a.eu-west-1.compute.internal", 2.5))
    yield server
    server.close()
    opencost_prices.forget()


@pytest.fixture
def settings(engine: Engine, opencost: FakeOpenCost) -> Settings:
    # Read again at every price lookup, so a test sees OpenCost's next answer at once.
    return Settings(
        database_url=str(engine.url.render_as_string(hide_password=False)),
        run_scheduler=False,
        opencost_url=opencost.url,
        opencost_refresh_seconds=1e-6,
    )


@pytest.fixture
def held_hour(engine: Engine, clock: FakeClock, http: httpx.Client, tokens: dict[str, str]) -> None:
    """GPU-a0 (an H100 on node-a) with the money example over 06:00-07:00, held by slurm:9."""
    store_series(engine, clock, uuid="GPU-a0", start=T0, metrics=money_example_metrics())
    roll_up(engine)
    body = {"id": "slurm:9", "gpus": ["GPU-a0"], "started_at": iso(T0),
            "ended_at": iso(T0 + timedelta(hours=1))}  # fmt: skip
    http.post("/api/v1/jobs", json=body, headers=auth(tokens["admin"])).raise_for_status()


def report(http: httpx.Client, tokens: dict[str, str]) -> dict[str, Any]:
    params = {"start": iso(T0), "end": iso(T0 + timedelta(hours=1)), "group_by": "job"}
    r = http.get("/api/v1/reports/cost", params=params, headers=auth(tokens["reader"]))
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_opencosts_gpu_price_prices_the_report_and_is_named_its_source(
    http: httpx.Client, tokens: dict[str, str], held_hour: None, opencost: FakeOpenCost
) -> None:
    rep = report(http, tokens)
    assert rep["price_source"] == "opencost"
    (row,) = [r for r in rep["rows"] if r["key"] == "slurm:9"]
    assert row["cost_usd"] == pytest.approx(2.5)  # an hour at OpenCost's $2.50, not $6.88
    assert opencost.asked[0].startswith("/allocation/compute?")
    for part in ("window=7d", "aggregate=node", "accumulate=true"):
        assert part in opencost.asked[0]
    prices = http.get("/api/v1/prices", headers=auth(tokens["reader"])).json()
    first = prices[0]
    assert first["model_pattern"] == "NVIDIA H100 80GB HBM3" and first["source"] == "opencost"
    assert first["usd_per_gpu_hour"] == 2.5 and "OpenCost" in first["note"]
    job = http.get("/api/v1/jobs/slurm:9", headers=auth(tokens["reader"])).json()
    assert job["summary"]["cost_usd"] == pytest.approx(2.5)

    # OpenCost fails: the last prices stand, the report says so and does not fail.
    opencost.status, opencost.answer = 500, {"code": 500, "message": "prometheus unreachable"}
    rep = report(http, tokens)
    assert rep["price_source"] == "opencost"
    (row,) = [r for r in rep["rows"] if r["key"] == "slurm:9"]
    assert row["cost_usd"] == pytest.approx(2.5)
    (warning,) = [w for w in rep["warnings"] if "OpenCost" in w]
    assert "could not be read" in warning and "prices are those it gave at" in warning
    opencost.close()  # gone altogether: the same
    rep = report(http, tokens)
    assert rep["price_source"] == "opencost"
    assert any("could not be read" in w for w in rep["warnings"])


def test_the_recorded_answer_of_a_cluster_without_gpus_leaves_the_table_in_force(
    http: httpx.Client, tokens: dict[str, str], held_hour: None, opencost: FakeOpenCost
) -> None:
    opencost.answer = recorded()
    rep = report(http, tokens)
    assert rep["price_source"] == "default"
    (row,) = [r for r in rep["rows"] if r["key"] == "slurm:9"]
    assert row["cost_usd"] == pytest.approx(6.88)  # the shipped H100 default
    assert any("priced no GPU on a node GPU Warden knows" in w for w in rep["warnings"])


def test_an_opencost_that_never_answered_leaves_the_table_and_says_why(
    http: httpx.Client, tokens: dict[str, str], held_hour: None, opencost: FakeOpenCost
) -> None:
    opencost.close()
    rows = [{"model_pattern": "*H100*", "usd_per_gpu_hour": 4.0, "effective_from": iso(T0)}]
    http.put("/api/v1/prices", json=rows, headers=auth(tokens["admin"])).raise_for_status()
    rep = report(http, tokens)
    assert rep["price_source"] == "api"
    (row,) = [r for r in rep["rows"] if r["key"] == "slurm:9"]
    assert row["cost_usd"] == pytest.approx(4.0)
    (warning,) = [w for w in rep["warnings"] if "OpenCost" in w]
    assert "could not be read" in warning and "the price table's until it answers" in warning
