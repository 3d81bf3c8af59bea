"""Small inputs, bounded costs: collection limits, repeats inside a batch, and a capped 422 echo."""

from __future__ import annotations

import gzip
import json
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, func, select

from service.api.validation import MAX_ERRORS
from service.db.schema import gpu_processes, samples
from service.vocabulary import MAX_LABEL_KEY_CHARS
from service.wire import (
    MAX_BATCH_PROCESSES,
    MAX_BATCH_SAMPLES,
    MAX_LABEL_VALUE_CHARS,
    MAX_NODE_LABELS,
)
from tests.support import FakeClock, auth, iso, make_batch


def count(engine: Engine, table: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def labels_batch(clock: FakeClock, labels: dict[str, str]) -> dict[str, Any]:
    b = make_batch(start=clock() - timedelta(seconds=30))
    b["node"]["labels"] = labels
    return b


@pytest.mark.parametrize(
    ("labels", "loc"),
    [
        ({f"k{i}": "v" for i in range(MAX_NODE_LABELS + 1)}, ["node", "labels"]),
        ({"k" * (MAX_LABEL_KEY_CHARS + 1): "v"}, ["node", "labels", "k" * 64, "[key]"]),
        ({"rack": "v" * (MAX_LABEL_VALUE_CHARS + 1)}, ["node", "labels", "rack"]),
    ],
    ids=["65-pairs", "64-char-key", "257-char-value"],
)
def test_node_label_limits(
    http: httpx.Client,
    tokens,
    engine: Engine,
    clock: FakeClock,
    labels: dict[str, str],
    loc: list[Any],
) -> None:
    r = http.post("/api/v1/ingest", json=labels_batch(clock, labels), headers=auth(tokens["agent"]))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", *loc]
    assert count(engine, samples) == 0


def test_node_labels_at_the_limits_are_stored(http: httpx.Client, tokens, clock: FakeClock) -> None:
    labels = {f"k{i:02d}" + "x" * (MAX_LABEL_KEY_CHARS - 3): "v" * MAX_LABEL_VALUE_CHARS
              for i in range(MAX_NODE_LABELS)}  # fmt: skip
    r = http.post("/api/v1/ingest", json=labels_batch(clock, labels), headers=auth(tokens["agent"]))
    assert r.status_code == 200, r.text


def test_samples_and_processes_per_batch_are_bounded(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock
) -> None:
    start = clock() - timedelta(hours=2)
    uuids = tuple(f"GPU-a{i}" for i in range(4))
    ok = make_batch(gpu_uuids=uuids, start=start, count=MAX_BATCH_SAMPLES // 4, interval_seconds=1)
    assert len(ok["samples"]) == MAX_BATCH_SAMPLES
    r = http.post("/api/v1/ingest", json=ok, headers=auth(tokens["agent"]))
    assert r.status_code == 200, r.text
    assert r.json()["samples_stored"] == MAX_BATCH_SAMPLES

    over = json.loads(json.dumps(ok))
    over["samples"].append({**over["samples"][0], "ts": iso(clock())})
    r = http.post("/api/v1/ingest", json=over, headers=auth(tokens["agent"]))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "samples"]
    assert str(MAX_BATCH_SAMPLES) in r.json()["detail"][0]["msg"]

    proc = {"gpu_uuid": "GPU-a0", "ts": iso(clock()), "pid": 1, "fb_used_bytes": 1}
    procs = make_batch(gpu_uuids=uuids, start=clock(), count=1)
    procs["processes"] = [{**proc, "pid": i} for i in range(MAX_BATCH_PROCESSES + 1)]
    r = http.post("/api/v1/ingest", json=procs, headers=auth(tokens["agent"]))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "processes"]
    procs["processes"].pop()
    r = http.post("/api/v1/ingest", json=procs, headers=auth(tokens["agent"]))
    assert r.status_code == 200, r.text
    assert count(engine, gpu_processes) == MAX_BATCH_PROCESSES


def test_a_repeat_inside_one_batch_is_stored_once_and_counted_once(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock
) -> None:
    b = make_batch(start=clock() - timedelta(minutes=1), count=3)
    first = b["samples"][0]
    b["samples"].append({**first, "metrics": {"sm_active": 0.9}})  # same GPU and ts
    b["processes"] = [{"gpu_uuid": "GPU-a0", "ts": first["ts"], "pid": 7}] * 2
    r = http.post("/api/v1/ingest", json=b, headers=auth(tokens["agent"]))
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["samples_received"], body["samples_stored"]) == (3, 3)
    assert body["processes_received"] == 1
    assert count(engine, samples) == 3 and count(engine, gpu_processes) == 1


def test_a_gzip_bomb_of_bad_items_gets_a_short_answer(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock
) -> None:
    # Megabytes of invalid samples in a few KB of gzip: every item fails validation.
    bad = '{"gpu_uuid":"GPU-a0","ts":"not a time","metrics":{"sm_active":"x"}},'
    text = '{"node":{"hostname":"node-a"},"samples":[' + bad * 60_000 + bad[:-1] + "]}"
    body = gzip.compress(text.encode(), 9)
    assert len(body) < 20_000 and len(text) > 4_000_000
    headers = {**auth(tokens["agent"]), "Content-Encoding": "gzip",
               "Content-Type": "application/json"}  # fmt: skip
    # Its cost is bounded by the list limit, not by what the body expands to: timed in
    # bench/ingest_bomb.py (docs/benchmarks.md); here the answer (the client's 30 s: a hang).
    r = http.post("/api/v1/ingest", content=body, headers=headers)
    assert r.status_code == 422
    assert len(r.content) < 8_000, len(r.content)
    assert r.json()["detail"][0]["loc"] == ["body", "samples"]


def test_a_long_bad_value_is_echoed_short(http: httpx.Client, tokens, clock: FakeClock) -> None:
    b = make_batch(start=clock())
    b["samples"] = [
        {"gpu_uuid": "GPU-a0", "ts": "x" * 100_000 + str(i), "metrics": {}} for i in range(50)
    ]
    r = http.post("/api/v1/ingest", json=b, headers=auth(tokens["agent"]))
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert len(r.content) < 8_000
    assert len(detail) == MAX_ERRORS + 1 and detail[-1]["type"] == "too_many_errors"
    assert detail[0]["loc"] == ["body", "samples", 0, "ts"]


def test_job_labels_have_the_node_label_limits(
    http: httpx.Client, tokens, clock: FakeClock
) -> None:
    admin = auth(tokens["admin"])
    too_many = {f"k{i}": "v" for i in range(MAX_NODE_LABELS + 1)}
    body = {"id": "j", "gpus": [], "started_at": iso(clock()), "labels": too_many}
    r = http.post("/api/v1/jobs", json=body, headers=admin)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "labels"]
    r = http.patch("/api/v1/jobs/j", json={"labels": {"k": "v" * 257}}, headers=admin)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "labels", "k"]
