"""One request guard for every body: encoded or not, any size up to its route's limit.

Real uvicorn on loopback on SQLite and PostgreSQL (where a NUL that reaches a query is a 500):
a NUL is a 422 naming the field whatever the encoding or size, every route has a body limit
(413), an unknown encoding is a 415, and a gzip body of several members is read whole.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, func, select

from service.api.app import create_app
from service.db.schema import samples
from service.settings import Settings
from tests.alerting_support import auth
from tests.support import FakeClock, iso, live_server, make_batch

MIB = 1024 * 1024


def _job(clock: FakeClock, **fields: Any) -> dict[str, Any]:
    started = iso(clock() - timedelta(minutes=5))
    return {"id": "slurm:7", "user": "u", "gpus": ["GPU-a0"], "started_at": started, **fields}


@pytest.fixture
def guarded(settings: Settings, engine: Engine, clock: FakeClock) -> Iterator[httpx.Client]:
    """The service with a 4 MiB limit for bodies of routes other than ingest."""
    settings = settings.model_copy(update={"max_body_bytes": 4 * MIB})
    with (
        live_server(create_app(settings, engine=engine, clock=clock)) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        yield client


def _post(client: httpx.Client, token: str, body: bytes, **headers: str) -> httpx.Response:
    return client.post(
        "/api/v1/jobs",
        content=body,
        headers=auth(token) | {"Content-Type": "application/json"} | headers,
    )


@pytest.mark.parametrize(
    ("encoding", "padding_bytes"),
    [("gzip", 0), ("x-gzip", 0), ("identity", 0), ("", 2 * MIB), ("gzip", 2 * MIB)],
    ids=["gzip", "x-gzip", "identity", "2-mib", "2-mib-gzip"],
)
def test_a_nul_is_a_422_naming_the_field_however_the_body_comes(
    guarded: httpx.Client,
    tokens: dict[str, str],
    clock: FakeClock,
    encoding: str,
    padding_bytes: int,
) -> None:
    batch = make_batch(start=clock() - timedelta(seconds=30))
    assert guarded.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"])).is_success
    doc = json.dumps(_job(clock, user="a\u0000b"))
    raw = (doc[:-1] + " " * padding_bytes + "}").encode()
    body = gzip.compress(raw) if "gzip" in encoding else raw
    headers = {"Content-Encoding": encoding} if encoding else {}
    for token in (tokens["admin"], tokens["agent"]):
        r = _post(guarded, token, body, **headers)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "user"]
    # The same job without the NUL goes in, encoded as it came.
    clean = json.dumps(_job(clock)).encode()
    r = _post(guarded, tokens["admin"], gzip.compress(clean) if "gzip" in encoding else clean,
              **headers)  # fmt: skip
    assert r.status_code == 201, r.text


def test_every_route_has_a_body_limit(guarded: httpx.Client, tokens: dict[str, str]) -> None:
    admin = auth(tokens["admin"]) | {"Content-Type": "application/json"}
    big = b"[" + b" " * (4 * MIB) + b"]"
    for method, path in [
        ("PUT", "/api/v1/prices"),
        ("POST", "/api/v1/silences"),
        ("POST", "/api/v1/policies"),
        ("POST", "/api/v1/session"),
    ]:
        r = guarded.request(method, path, content=big, headers=admin)
        assert r.status_code == 413, (path, r.text)
        # Streamed without a Content-Length, and as a small gzip that expands past the limit.
        r = guarded.request(method, path, content=iter([big[:MIB], big[MIB:]]), headers=admin)
        assert r.status_code == 413, (path, r.text)
        bomb = gzip.compress(big)
        assert len(bomb) < 64 * 1024
        r = guarded.request(
            method, path, content=bomb, headers=admin | {"Content-Encoding": "gzip"}
        )
        assert r.status_code == 413, (path, r.text)


@pytest.mark.parametrize("encoding", ["br", "deflate", "gzip, gzip", "compress"])
def test_an_encoding_other_than_gzip_is_a_415_on_every_route(
    guarded: httpx.Client, tokens: dict[str, str], clock: FakeClock, encoding: str
) -> None:
    body = json.dumps(_job(clock)).encode()
    r = _post(guarded, tokens["admin"], body, **{"Content-Encoding": encoding})
    assert r.status_code == 415, r.text
    batch = json.dumps(make_batch(start=clock() - timedelta(seconds=30))).encode()
    r = guarded.post(
        "/api/v1/ingest",
        content=batch,
        headers=auth(tokens["agent"]) | {"Content-Encoding": encoding},
    )
    assert r.status_code == 415, r.text


def _count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(samples)).scalar_one())


def test_a_gzip_body_of_several_members_is_read_whole(
    guarded: httpx.Client, tokens: dict[str, str], clock: FakeClock, engine: Engine
) -> None:
    agent = auth(tokens["agent"]) | {"Content-Encoding": "gzip"}
    first = make_batch(start=clock() - timedelta(seconds=60), count=3)
    second = make_batch(start=clock() - timedelta(seconds=30), count=3)
    # Two whole batches, one per member: not one JSON document, so refused whole.
    two = gzip.compress(json.dumps(first).encode()) + gzip.compress(json.dumps(second).encode())
    r = guarded.post("/api/v1/ingest", content=two, headers=agent)
    assert r.status_code == 422, r.text
    assert _count(engine) == 0
    # One batch split across members is read whole: every sample stored.
    raw = json.dumps(first).encode()
    split = gzip.compress(raw[:40]) + gzip.compress(raw[40:])
    r = guarded.post("/api/v1/ingest", content=split, headers=agent)
    assert r.status_code == 200, r.text
    assert r.json()["samples_stored"] == 3 and _count(engine) == 3
    # Bytes after the last member that are not gzip are refused, naming the body.
    r = guarded.post(
        "/api/v1/ingest", content=gzip.compress(json.dumps(second).encode()) + b"junk",
        headers=agent,
    )  # fmt: skip
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body"]
    assert _count(engine) == 3


def test_an_ingest_body_is_read_only_after_the_agent_token_is_checked(
    guarded: httpx.Client, tokens: dict[str, str]
) -> None:
    """A client without an agent token never makes the service hold or expand a body."""
    bomb = gzip.compress(b"[" + b" " * (64 * MIB) + b"]")
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    for token in ("gw_not-a-token", tokens["reader"]):
        r = guarded.post("/api/v1/ingest", content=bomb, headers=auth(token) | headers)
        assert r.status_code in (401, 403), r.text
    r = guarded.post("/api/v1/ingest", content=bomb, headers=auth(tokens["agent"]) | headers)
    assert r.status_code == 413, r.text
