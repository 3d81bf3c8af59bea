"""Each GPU's latest cause and first sample's time kept on its row (what a fleet view filters
by and since when a report holds the GPU, reading no samples): they follow the newest and the
oldest sample, whatever order batches and their samples come in, on SQLite and PostgreSQL; and
the migration that adds them fills them from the stored samples and minutes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, insert, select

from service.core.diagnosis import Cause
from service.db.migrate import upgrade
from service.db.schema import gpus, nodes, rollup_1m, samples
from tests.alerting_support import auth
from tests.conftest import empty_engine
from tests.support import FakeClock, iso, make_batch

IDLE_HELD = {"sm_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": 20 * 2**30}
TENSOR = {"sm_active": 0.95, "tensor_active": 0.9, "dram_active": 0.3, "gr_engine_active": 0.99}
LAUNCH = {"sm_active": 0.03, "gr_engine_active": 0.33, "gpu_util": 0.33}


def _post(http: httpx.Client, token: str, batch: dict[str, Any]) -> None:
    r = http.post("/api/v1/ingest", json=batch, headers=auth(token))
    assert r.status_code == 200, r.text


def _causes(http: httpx.Client, token: str) -> tuple[str | None, set[str]]:
    """GPU-a0's cause in the fleet's full row, and the causes its index lets a filter find."""
    reader = auth(token)
    row = http.get("/api/v1/fleet", headers=reader).json()["gpus"][0]
    found = {
        c.label
        for c in Cause
        if http.get("/api/v1/fleet", params={"cause": c.label}, headers=reader).json()["gpus"]
    }
    return row["cause"], found


def _first_sample_at(engine: Engine) -> datetime | None:
    with engine.connect() as conn:
        first: datetime | None = conn.execute(select(gpus.c.first_sample_at)).scalar_one()
    return first


def test_the_latest_cause_follows_the_newest_sample_not_the_last_batch(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock
) -> None:
    agent, start = tokens["agent"], clock() - timedelta(minutes=2)
    _post(http, agent, make_batch(start=start, count=3, metrics=IDLE_HELD))
    assert _causes(http, tokens["reader"]) == ("idle_held", {"idle_held"})
    assert _first_sample_at(engine) == start

    # A batch whose samples come newest first: the newest one's cause, not the last listed.
    newer = make_batch(start=start + timedelta(seconds=30), count=3, metrics=TENSOR)
    newer["samples"][-1]["metrics"] = LAUNCH
    newer["samples"].reverse()
    _post(http, agent, newer)
    assert _causes(http, tokens["reader"]) == ("launch_bound", {"launch_bound"})

    # A spool replayed late (older samples) and a resend of the newest sample change nothing.
    _post(http, agent, make_batch(start=start - timedelta(minutes=5), count=3, metrics=TENSOR))
    resent = make_batch(start=start + timedelta(seconds=50), count=1, metrics=IDLE_HELD)
    _post(http, agent, resent)
    assert _causes(http, tokens["reader"]) == ("launch_bound", {"launch_bound"})
    assert _first_sample_at(engine) == start - timedelta(minutes=5)
    body = http.get("/api/v1/fleet", headers=auth(tokens["reader"])).json()
    assert body["gpus"][0]["last_seen_at"] == iso(start + timedelta(seconds=50))


T0 = datetime(2026, 12, 2, 5, 0, tzinfo=UTC)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_migration_fills_the_latest_cause_from_the_stored_samples(
    backend: str, tmp_path: Path
) -> None:
    with empty_engine(backend, tmp_path) as engine:
        upgrade(engine, "0024")
        _store_gpus_of_an_older_version(engine)
        upgrade(engine)
        with engine.connect() as conn:
            got = {
                uuid: (cause, first)
                for uuid, cause, first in conn.execute(
                    select(gpus.c.uuid, gpus.c.last_cause, gpus.c.first_sample_at)
                )
            }
        # GPU-m0's first minute is older than its first raw sample (raw kept for less long).
        assert got == {
            "GPU-m0": (Cause.IDLE_HELD, T0 - timedelta(minutes=3)),
            "GPU-m1": (None, None),
        }


def _store_gpus_of_an_older_version(engine: Engine) -> None:
    """GPU-m0 with a minute rolled up 3 minutes before its samples, launch-bound then
    idle-held; GPU-m1 never sampled."""
    ts = [T0 + timedelta(seconds=10 * k) for k in range(4)]
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            from service.db.partitions import ensure_partitions

            ensure_partitions(conn, {T0.date()})
        conn.execute(
            insert(nodes).values(id=1, hostname="n", labels={}, first_seen_at=T0, last_seen_at=T0)
        )
        conn.execute(
            insert(gpus),
            [{"id": 1, "uuid": "GPU-m0", "node_id": 1, "gpu_index": 0, "model": "H100",
              "first_seen_at": T0, "last_sample_at": ts[-1]},
             {"id": 2, "uuid": "GPU-m1", "node_id": 1, "gpu_index": 1, "model": "H100",
              "first_seen_at": T0, "last_sample_at": None}],
        )  # fmt: skip
        conn.execute(
            insert(samples),
            [{"gpu_id": 1, "ts": t, "source": "gpm",
              "cause": int(Cause.LAUNCH_BOUND if k < 3 else Cause.IDLE_HELD)}
             for k, t in enumerate(ts)],
        )  # fmt: skip
        conn.execute(
            insert(rollup_1m).values(gpu_id=1, bucket_start=T0 - timedelta(minutes=3),
                                     sample_count=6, covered_seconds=60.0)
        )  # fmt: skip
