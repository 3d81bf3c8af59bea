"""GET /jobs/{id} names a GPU of a multi-GPU job whose activity departs from its peers' over the
last useful-work hold time (odd_gpus), on SQLite and PostgreSQL: a dead rank idle while its
three peers spin in a collective is named with its duty and theirs; a job whose GPUs agree, and
a job on two GPUs (no majority to depart from), have none. Simulated samples: no multi-GPU
recording exists (docs/diagnosis.md says what is unverified)."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from sqlalchemy import Engine

from tests.alerting_support import add_job
from tests.integration.cost_data import GIB, store_series
from tests.support import FakeClock

SPIN = {"sm_active": 0.02, "gr_engine_active": 1.0, "gpu_util": 1.0, "fb_used_bytes": 30 * GIB}
DEAD = {"sm_active": 0.0, "gr_engine_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": 30 * GIB}


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize(
    ("job_id", "patterns", "odd"),
    [
        ("slurm:61", (SPIN, SPIN, DEAD, SPIN), ["GPU-slurm:61-2"]),
        ("slurm:62", (SPIN, SPIN, SPIN, SPIN), []),
        ("slurm:63", (SPIN, DEAD), []),
    ],
)
def test_the_gpu_departing_from_its_peers_is_on_the_job_page(
    http: httpx.Client,
    tokens: dict[str, str],
    engine: Engine,
    clock: FakeClock,
    job_id: str,
    patterns: tuple[dict[str, float], ...],
    odd: list[str],
) -> None:
    start = clock()
    clock.set(start + timedelta(minutes=15))
    uuids = tuple(f"GPU-{job_id}-{i}" for i in range(len(patterns)))
    for i, (uuid, metrics) in enumerate(zip(uuids, patterns, strict=True)):
        # 15 minutes of 10 s samples: more than the 10-minute hold time.
        store_series(engine, clock, uuid=uuid, index=i, start=start, metrics=[metrics] * 90)
    add_job(engine, job_id, uuids, started_at=start)
    r = http.get(f"/api/v1/jobs/{job_id}", headers=_auth(tokens["reader"]))
    assert r.status_code == 200, r.text
    got = r.json()["odd_gpus"]
    assert [o["gpu_uuid"] for o in got] == odd
    for o in got:
        assert o["mean_duty"] == 0.0 and o["peers_duty"] == 1.0
    schema = http.get("/openapi.json").json()["components"]["schemas"]
    assert set(schema["OddGpuPublic"]["required"]) == {"gpu_uuid", "mean_duty", "peers_duty"}
