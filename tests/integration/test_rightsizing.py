"""Right-sizing on a real store: a multi-GPU job whose GPUs sat idle while one worked is told
to ask for fewer, with those GPUs' idle dollars as the saving; on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine

from tests.alerting_support import add_job
from tests.support import FakeClock


def _four_gpu_job(engine: Engine, clock: FakeClock, *, nvlink_bytes_per_second: float) -> Any:
    """Job ``ddp`` on four H100s for 10 minutes, one running bf16 GEMMs and three holding
    2 GiB and running nothing, each link at ``nvlink_bytes_per_second``; its summary as JSON."""
    from service.db import jobs_repo
    from service.settings import Settings
    from service.usecases.job_summary import job_summary
    from tests.integration.cost_data import roll_up, store_series

    start = clock() - timedelta(minutes=10)
    link = {"pcie_tx_bytes_per_second": 1e9, "pcie_rx_bytes_per_second": 2e9,
            "nvlink_tx_bytes_per_second": nvlink_bytes_per_second,
            "nvlink_rx_bytes_per_second": nvlink_bytes_per_second}  # fmt: skip
    busy = {"sm_active": 0.95, "gr_engine_active": 1.0, "tensor_active": 0.9, **link}
    idle = {"sm_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": 2 * 2**30, **link}
    for i in range(4):
        metrics = [busy if i == 0 else idle] * 60
        store_series(engine, clock, uuid=f"GPU-m{i}", start=start, metrics=metrics, index=i)
    roll_up(engine)
    add_job(engine, "ddp", tuple(f"GPU-m{i}" for i in range(4)), started_at=start)
    settings = Settings(
        database_url=engine.url.render_as_string(hide_password=False), run_scheduler=False
    )
    with engine.connect() as conn:
        job = jobs_repo.get_job(conn, job_id="ddp")
        assert job is not None
        out = job_summary(conn, settings=settings, job=job, now=clock()).as_dict()
    return out


def test_a_job_whose_gpus_sat_idle_while_one_worked_is_told_to_ask_for_fewer(
    engine, clock: FakeClock
) -> None:
    """Four H100s for 10 minutes: one runs bf16 GEMMs, three hold 2 GiB and run nothing."""
    out = _four_gpu_job(engine, clock, nvlink_bytes_per_second=0.0)
    top = out["recommendations"][0]
    assert top["kind"] == "fewer_gpus" and top["gpus"] == 1, out["recommendations"]
    assert (
        "3 of 4 GPUs idle 100% of the time or more while the others worked: ask for 1"
        in (top["action"])
    )
    # The three idle GPUs' whole cost, and no idle fix claims those seconds again.
    per_gpu = {g["gpu_uuid"]: g for g in out["per_gpu"]}
    idle_cost = sum(per_gpu[f"GPU-m{i}"]["cost_usd"] for i in (1, 2, 3))
    assert top["saving_usd"] == pytest.approx(idle_cost)
    assert not [f for f in out["recommendations"] if f["cause"] == "idle_held"]
    assert out["savings_usd"] <= out["summary"]["cost_usd"] + 1e-9


def test_gpus_that_talk_over_nvlink_are_ranks_not_spares(engine, clock: FakeClock) -> None:
    """The same four GPUs, but the three quiet ones exchange 20 GB/s over NVLink with the
    busy one (a collective's ranks waiting on it): none is given back."""
    out = _four_gpu_job(engine, clock, nvlink_bytes_per_second=2e10)
    kinds = {f["kind"] for f in out["recommendations"]}
    assert "fewer_gpus" not in kinds and "mig" not in kinds, out["recommendations"]
