"""MIG on the central side: a destroyed instance retires (never lost, never a hardware fault), and
migration 0008 rewrites the MIG ids the dcgm-exporter backend used to store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, insert, select

from service.db import scopes_repo, windows_repo
from service.db.migrate import upgrade
from service.db.schema import gpus, nodes
from service.db.types import UTCDateTime
from tests.conftest import empty_engine
from tests.support import FakeClock, iso

# The gpus table as revision 0007 left it (no retired_at yet).
gpus_0007 = Table(
    "gpus",
    MetaData(),
    Column("id", Integer, primary_key=True),
    Column("uuid", String(96)),
    Column("node_id", Integer),
    Column("gpu_index", Integer),
    Column("model", String(255)),
    Column("first_seen_at", UTCDateTime),
)
PARENT = "GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"
KEEP = f"MIG-{PARENT}/7/1g.10gb@20261202T070000Z"
GONE = f"MIG-{PARENT}/8/1g.10gb@20261202T070000Z"
MODEL = "NVIDIA H100 80GB HBM3 MIG 1g.10gb"


def gpu(uid: str, **extra: Any) -> dict[str, Any]:
    return {"uuid": uid, "index": 0, "model": MODEL, "mig_parent_uuid": PARENT, **extra}


def test_a_destroyed_instance_is_retired_not_lost(
    http: httpx.Client, tokens: dict[str, str], engine: Engine, clock: FakeClock
):
    auth = {"Authorization": f"Bearer {tokens['agent']}"}
    t = clock() - timedelta(minutes=2)
    batch = {
        "node": {"hostname": "node-a"},
        "gpus": [gpu(KEEP), gpu(GONE)],
        "samples": [
            {"gpu_uuid": u, "ts": iso(t), "metrics": {"gr_engine_active": 0.4}}
            for u in (KEEP, GONE)
        ],
    }
    assert http.post("/api/v1/ingest", json=batch, headers=auth).status_code == 200
    # The administrator destroys instance 8; the agent reports it retired once, as it ships.
    batch = {
        "node": {"hostname": "node-a"},
        "gpus": [gpu(KEEP), gpu(GONE, retired=True)],
        "samples": [
            {
                "gpu_uuid": KEEP,
                "ts": iso(t + timedelta(seconds=60)),
                "metrics": {"gr_engine_active": 0.5},
            }
        ],
    }
    assert http.post("/api/v1/ingest", json=batch, headers=auth).status_code == 200
    reader = {"Authorization": f"Bearer {tokens['reader']}"}
    listed = {g["uuid"]: g for g in http.get("/api/v1/gpus", headers=reader).json()}
    assert listed[GONE]["retired_at"] is not None and listed[GONE]["lost"] is False
    assert listed[KEEP]["retired_at"] is None
    with engine.connect() as conn:
        scopes = scopes_repo.scope_members(conn, now=clock(), start_skew_seconds=300.0)
        ids = dict(conn.execute(select(gpus.c.uuid, gpus.c.id)).all())
        faults = windows_repo.window_stats(
            conn,
            windows={300.0: ["hardware_fault"]},
            now=clock(),
            gpu_ids=scopes.gpu_ids,
            lost_gpu_ids=scopes.lost_gpu_ids,
        )[300.0]
    assert ids[GONE] not in scopes.gpu_ids and ids[GONE] not in scopes.lost_gpu_ids
    assert faults[ids[KEEP]]["hardware_fault"].max == 0.0
    # /metrics does not list it as a lost GPU either.
    assert GONE not in http.get("/metrics").text.split("gpuwarden_gpu_lost", 1)[-1]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migration_0008_rewrites_dcgm_exporter_mig_ids(backend: str, tmp_path: Path) -> None:
    seen = datetime(2026, 11, 30, 9, 15, 7, tzinfo=UTC)
    with empty_engine(backend, tmp_path) as engine:
        upgrade(engine, "0007")
        with engine.begin() as conn:
            conn.execute(
                insert(nodes).values(hostname="n", labels={}, first_seen_at=seen, last_seen_at=seen)
            )
            node_id = conn.execute(select(nodes.c.id)).scalar_one()
            rows = [
                (f"{PARENT}::gi7", MODEL),  # what the dcgm-exporter backend stored
                (f"{PARENT}::gi9", "NVIDIA H100 80GB HBM3 MIG 3g.40gb"),
                ("MIG-6c5b0007-aaaa-bbbb-cccc-000000000000", "NVIDIA H100 80GB HBM3 MIG"),  # NVML's
                (PARENT, "NVIDIA H100 80GB HBM3"),
            ]
            for uid, model in rows:
                conn.execute(
                    insert(gpus_0007).values(
                        uuid=uid, node_id=node_id, gpu_index=0, model=model, first_seen_at=seen
                    )
                )
        upgrade(engine)
        with engine.connect() as conn:
            got = set(conn.execute(select(gpus.c.uuid)).scalars())
        assert got == {
            f"MIG-{PARENT}/7/1g.10gb@20261130T091507Z",
            f"MIG-{PARENT}/9/3g.40gb@20261130T091507Z",
            "MIG-6c5b0007-aaaa-bbbb-cccc-000000000000",
            PARENT,
        }
