"""What the /metrics tests share: a parsed scrape, a batch ingested, a job added."""

from __future__ import annotations

from datetime import datetime

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, insert

from service.db.schema import gpus, job_gpus, jobs
from tests.alerting_support import auth


def scrape(http: httpx.Client) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] of one /metrics scrape."""
    r = http.get("/metrics")
    assert r.status_code == 200, r.text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def ingest(http: httpx.Client, token: str, batch: dict) -> None:  # type: ignore[type-arg]
    r = http.post("/api/v1/ingest", json=batch, headers=auth(token))
    assert r.status_code == 200, r.text


def add_job(engine: Engine, *, job_id: str, uuid: str, started: datetime, **cols: str) -> None:
    with engine.begin() as conn:
        gpu_id = conn.execute(gpus.select().where(gpus.c.uuid == uuid)).one().id
        conn.execute(
            insert(jobs).values(
                id=job_id,
                source="api",
                started_at=started,
                created_at=started,
                updated_at=started,
                labels={},
                **cols,
            )
        )
        conn.execute(
            insert(job_gpus).values(job_id=job_id, gpu_id=gpu_id, started_at=started, source="api")
        )
