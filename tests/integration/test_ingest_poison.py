"""One bad value never stops a node: each poison value is a 4xx naming it, on both stores.

The agent retries a 5xx and drops a 4xx to its dead-letter file, so answering these with a 500
would leave the batch at the head of its spool and every newer batch queued behind it.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, func, select

from service.db.schema import gpu_processes, samples
from service.vocabulary import METRIC_BOUNDS, METRICS_BY_NAME
from tests.support import FakeClock, auth, iso, make_batch


def batch_text(clock: FakeClock) -> str:
    """A good batch with one sample and one process, as JSON text with placeholders to poison."""
    b = make_batch(start=clock() - timedelta(seconds=30))
    b["samples"][0]["metrics"] = {"power_watts": "@POWER@", "fb_used_bytes": "@FB@"}
    b["gpus"][0]["fb_total_bytes"] = "@FBTOTAL@"
    b["processes"] = [
        {
            "gpu_uuid": "GPU-a0",
            "ts": iso(clock() - timedelta(seconds=30)),
            "pid": "@PID@",
            "fb_used_bytes": 2**30,
            "job_id": "@JOB@",
            "user": "alice",
        }
    ]
    return json.dumps(b)


GOOD = {"POWER": "300.5", "FB": str(2**30), "FBTOTAL": str(80 * 2**30), "PID": "4242",
        "JOB": '"slurm:1"'}  # fmt: skip

# (case, placeholder, poison JSON text, the location the 4xx must name)
POISON: list[tuple[str, str, str, list[Any]]] = [
    ("nan", "POWER", "NaN", ["samples", 0, "metrics", "power_watts"]),
    ("infinity", "POWER", "Infinity", ["samples", 0, "metrics", "power_watts"]),
    ("minus-infinity", "POWER", "-Infinity", ["samples", 0, "metrics", "power_watts"]),
    ("float-overflow", "POWER", "1e400", ["samples", 0, "metrics", "power_watts"]),
    ("int-2^63-metric", "FB", str(2**63), ["samples", 0, "metrics", "fb_used_bytes"]),
    ("int-2^63-gpu", "FBTOTAL", str(2**63), ["gpus", 0, "fb_total_bytes"]),
    ("int-huge", "FBTOTAL", "9" * 400, ["gpus", 0, "fb_total_bytes"]),
    ("pid-2^31", "PID", str(2**31), ["processes", 0, "pid"]),
    # Strict types: a number written as text, or a boolean, is not read as a number.
    ("float-as-text", "POWER", '"0.5"', ["samples", 0, "metrics", "power_watts"]),
    ("float-as-bool", "POWER", "true", ["samples", 0, "metrics", "power_watts"]),
    ("int-as-text", "FB", f'"{2**30}"', ["samples", 0, "metrics", "fb_used_bytes"]),
    ("int-as-bool", "FB", "false", ["samples", 0, "metrics", "fb_used_bytes"]),
    ("int-as-fraction", "FB", "1.5", ["samples", 0, "metrics", "fb_used_bytes"]),
    ("gpu-int-as-text", "FBTOTAL", '"1"', ["gpus", 0, "fb_total_bytes"]),
    ("pid-as-bool", "PID", "true", ["processes", 0, "pid"]),
    ("nul-job-id", "JOB", '"slurm:\\u00001"', ["processes", 0, "job_id"]),
]


def stored(engine: Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        return (
            int(conn.execute(select(func.count()).select_from(samples)).scalar_one()),
            int(conn.execute(select(func.count()).select_from(gpu_processes)).scalar_one()),
        )


def post_text(http: httpx.Client, token: str, text: bytes) -> httpx.Response:
    headers = {**auth(token), "Content-Type": "application/json"}
    return http.post("/api/v1/ingest", content=text, headers=headers)


def fill(template: str, **over: str) -> str:
    for key, value in {**GOOD, **over}.items():
        template = template.replace(f'"@{key}@"', value)
    return template


@pytest.mark.parametrize(("case", "key", "poison", "loc"), POISON, ids=[p[0] for p in POISON])
def test_poison_value_is_a_4xx_naming_it_and_the_next_batch_is_stored(
    http: httpx.Client,
    tokens,
    engine: Engine,
    clock: FakeClock,
    case: str,
    key: str,
    poison: str,
    loc: list[Any],
) -> None:
    template = batch_text(clock)
    r = post_text(http, tokens["agent"], fill(template, **{key: poison}).encode())
    assert r.status_code == 422, (case, r.status_code, r.text)
    assert [d["loc"] for d in r.json()["detail"]] == [["body", *loc]], r.text
    assert stored(engine) == (0, 0)  # rejected whole
    r = post_text(http, tokens["agent"], fill(template).encode())
    assert r.status_code == 200, r.text
    assert stored(engine) == (1, 1)


def test_invalid_utf8_is_a_4xx_saying_where(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock
) -> None:
    body = fill(batch_text(clock), JOB='"slurm:@BAD@"').encode().replace(b"@BAD@", b"\xff\xfe")
    r = post_text(http, tokens["agent"], body)
    assert r.status_code == 422, r.text
    (detail,) = r.json()["detail"]
    assert detail["loc"] == ["body"] and "column" in detail["msg"]
    assert stored(engine) == (0, 0)


@pytest.mark.parametrize(
    "path",
    [
        ["node", "labels", "rack"],
        ["gpus", 0, "model"],
        ["gpus", 0, "uuid"],
        ["samples", 0, "gpu_uuid"],
        ["processes", 0, "user"],
    ],
    ids=lambda p: ".".join(map(str, p)),
)
def test_nul_in_any_string_names_it(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock, path: list[Any]
) -> None:
    batch = json.loads(fill(batch_text(clock)))
    target = batch
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = "x\x00y"
    r = http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"]))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", *path]
    assert stored(engine) == (0, 0)


# Finite values past what hardware can report (the probes), and a step past each bound.
BEYOND: list[tuple[str, float]] = [
    ("pcie_tx_bytes_per_second", 1.797e308),
    ("nvlink_rx_bytes_per_second", 1.797e308),
    ("energy_joules", 1.797e308),
    *((name, high * 1.5 + 1) for name, (_, high) in METRIC_BOUNDS.items() if name != "activity"),
]


@pytest.mark.parametrize(("name", "value"), BEYOND, ids=[f"{n}={v:g}" for n, v in BEYOND])
def test_a_value_past_what_hardware_reports_is_a_422_naming_it(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock, name: str, value: float
) -> None:
    spec = METRICS_BY_NAME[name]
    high = METRIC_BOUNDS[name][1]
    kind = int if spec.kind == "int" else float
    b = make_batch(start=clock() - timedelta(seconds=30), metrics={name: kind(value)})
    r = http.post("/api/v1/ingest", json=b, headers=auth(tokens["agent"]))
    assert r.status_code == 422, r.text
    assert [d["loc"] for d in r.json()["detail"]] == [["body", "samples", 0, "metrics", name]]
    assert stored(engine) == (0, 0)
    b = make_batch(start=clock() - timedelta(seconds=30), metrics={name: kind(high)})
    r = http.post("/api/v1/ingest", json=b, headers=auth(tokens["agent"]))
    assert r.status_code == 200, r.text  # the bound itself is a reading
