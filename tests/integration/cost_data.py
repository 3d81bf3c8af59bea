"""Helpers for cost tests: store sample series through the real ingest path and roll them up."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine

from service.context import ServiceContext
from service.costs.integrals import Thresholds
from service.db import rollup_repo
from service.settings import Settings
from service.usecases import ingest as ingest_service
from service.wire import IngestBatch
from tests.support import FakeClock, iso

GIB = 1024**3


def store_series(
    engine: Engine,
    clock: FakeClock,
    *,
    uuid: str,
    start: datetime,
    metrics: Sequence[dict[str, Any]],
    interval_seconds: float = 10.0,
    hostname: str = "node-a",
    model: str = "NVIDIA H100 80GB HBM3",
    index: int = 0,
) -> None:
    """Ingest one sample per entry of ``metrics``, ``interval_seconds`` apart from ``start``."""
    ctx = ServiceContext(
        settings=Settings(database_url="sqlite://", run_scheduler=False), engine=engine, clock=clock
    )
    for i in range(0, len(metrics), 2000):
        batch = {
            "node": {"hostname": hostname, "labels": {}},
            "gpus": [{"uuid": uuid, "index": index, "model": model, "fb_total_bytes": 80 * GIB}],
            "samples": [
                {
                    "gpu_uuid": uuid,
                    "ts": iso(start + timedelta(seconds=(i + k) * interval_seconds)),
                    "metrics": m,
                }
                for k, m in enumerate(metrics[i : i + 2000])
            ],
        }
        ingest_service.ingest(ctx, IngestBatch.model_validate(batch), token_node=hostname)


def roll_up(engine: Engine, thresholds: Thresholds | None = None) -> None:
    """Recompute every dirty rollup bucket now (tests run the scheduler's job by hand)."""
    while True:
        with engine.begin() as conn:
            n = rollup_repo.process_dirty(conn, thresholds=thresholds or Thresholds())
        if n == 0:
            return


def worked_example_metrics() -> list[dict[str, Any]]:
    """The worked example of docs/costs.md: 30 min at sm_active 0.0 holding 20 GiB, then 30 min at 0.8, every 10 s."""
    return [
        {"sm_active": 0.0 if k < 180 else 0.8, "fb_used_bytes": 20 * GIB, "tensor_active": 0.5}
        for k in range(360)
    ]


def money_example_metrics() -> list[dict[str, Any]]:
    """The money model's worked example (docs/costs.md): 30 min idle holding 20 GiB, 20 min of
    fp32 GEMMs without tensor cores (SM 0.96), every 10 s; then one sample with no activity
    figure, after which the agent sends nothing (10 min of nodata in a held hour)."""
    idle = {"sm_active": 0.0, "tensor_active": 0.0, "dram_active": 0.0, "fb_used_bytes": 20 * GIB}
    fp32 = {"sm_active": 0.96, "tensor_active": 0.0, "dram_active": 0.3, "fb_used_bytes": 20 * GIB}
    return [idle] * 180 + [fp32] * 120 + [{"temperature_celsius": 40.0}]
