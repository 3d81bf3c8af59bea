"""The running totals of rollup_1m (cum_*) stay equal to the sums of the buckets before them."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, delete, func, insert, select

from service.db import rollup_repo
from service.db.migrate import upgrade
from service.db.rollup_repo import fill_cumulative
from service.db.schema import rollup_1m
from tests.conftest import empty_engine
from tests.integration.cost_data import GIB, roll_up, store_series
from tests.integration.running_totals_support import assert_totals_are_running_sums
from tests.support import FakeClock

T0 = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)


def metrics(n: int, phase: int = 0) -> list[dict[str, float | int]]:
    return [
        {
            "sm_active": ((k + phase) % 7) / 7,
            "tensor_active": ((k + phase) % 3) / 3,
            "fb_used_bytes": 2 * GIB,
            "power_watts": 200.0 + k % 5,
        }
        for k in range(n)
    ]


def test_totals_follow_ingest_in_order(engine: Engine, clock: FakeClock):
    store_series(engine, clock, uuid="GPU-a", start=T0, metrics=metrics(90))
    roll_up(engine)
    store_series(
        engine, clock, uuid="GPU-a", start=T0 + timedelta(seconds=900), metrics=metrics(90, 1)
    )
    store_series(engine, clock, uuid="GPU-b", start=T0, metrics=metrics(60, 2), index=1)
    roll_up(engine)
    assert assert_totals_are_running_sums(engine) > 30


def test_a_late_bucket_before_others_shifts_every_total_after_it(engine: Engine, clock: FakeClock):
    store_series(engine, clock, uuid="GPU-a", start=T0 + timedelta(hours=1), metrics=metrics(120))
    roll_up(engine)
    with engine.connect() as conn:
        last_before = conn.execute(select(func.max(rollup_1m.c.cum_covered_seconds))).scalar_one()
    # Two minutes of older data arrive late (an agent's spool replayed after an outage).
    store_series(engine, clock, uuid="GPU-a", start=T0, metrics=metrics(12, 3))
    roll_up(engine)
    assert_totals_are_running_sums(engine)
    with engine.connect() as conn:
        assert (
            conn.execute(select(func.max(rollup_1m.c.cum_covered_seconds))).scalar_one()
            > last_before
        )


def test_retention_of_early_buckets_keeps_later_totals_usable(engine: Engine, clock: FakeClock):
    store_series(engine, clock, uuid="GPU-a", start=T0, metrics=metrics(180))
    roll_up(engine)
    with engine.begin() as conn:
        conn.execute(delete(rollup_1m).where(rollup_1m.c.bucket_start < T0 + timedelta(minutes=10)))
    store_series(
        engine, clock, uuid="GPU-a", start=T0 + timedelta(seconds=1800), metrics=metrics(30)
    )
    roll_up(engine)
    with engine.connect() as conn:
        rows = conn.execute(
            select(rollup_1m.c.covered_seconds, rollup_1m.c.cum_covered_seconds).order_by(
                rollup_1m.c.bucket_start
            )
        ).all()
    # The totals no longer start at 0 (the early buckets are gone) but still step by each bucket.
    assert rows[0].cum_covered_seconds > rows[0].covered_seconds
    for prev, row in itertools.pairwise(rows):
        assert row.cum_covered_seconds == pytest.approx(
            prev.cum_covered_seconds + row.covered_seconds
        )


def test_fill_computes_totals_left_pending_by_any_writer(engine: Engine, clock: FakeClock):
    store_series(engine, clock, uuid="GPU-a", start=T0, metrics=metrics(120))
    roll_up(engine)
    with engine.begin() as conn:
        conn.execute(rollup_1m.update().values(cum_covered_seconds=None, cum_idle_seconds=-1.0))
        assert fill_cumulative(conn) > 10
    assert_totals_are_running_sums(engine)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migration_0005_fills_the_totals_of_rollups_already_stored(
    backend: str, tmp_path: Path
) -> None:
    with empty_engine(backend, tmp_path) as engine:
        upgrade(engine, "0004")
        with engine.begin() as conn:  # rollups written by a version without running totals
            conn.execute(
                insert(rollup_1m),
                [
                    {"gpu_id": g, "bucket_start": T0 + timedelta(minutes=m), "sample_count": 6,
                     "covered_seconds": 60.0, "idle_seconds": float(m % 3) * 10,
                     "idle_held_seconds": 0.0, "unused_seconds": 30.0 + m,
                     "fallback_seconds": 0.0, "energy_used_joules": 1000.0 * g,
                     "tensor_active_sum": None if m % 4 == 0 else 0.5, "tensor_active_count": 6}
                    for g in (1, 2) for m in range(30)
                ],
            )  # fmt: skip
        upgrade(engine)
        assert assert_totals_are_running_sums(engine) == 60


def test_in_order_buckets_get_their_totals_on_insert_late_ones_from_the_fill(
    engine: Engine, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
):
    # Writing each rollup row once matters on PostgreSQL (an update of an indexed column is
    # a second full row write); only late buckets are left for fill_cumulative.
    filled: list[int] = []
    real_fill = rollup_repo.fill_cumulative
    monkeypatch.setattr(rollup_repo, "fill_cumulative", lambda conn: filled.append(real_fill(conn)))
    store_series(engine, clock, uuid="GPU-a", start=T0 + timedelta(hours=1), metrics=metrics(60))
    roll_up(engine)
    store_series(engine, clock, uuid="GPU-a", start=T0 + timedelta(hours=1, minutes=10),
                 metrics=metrics(60, 1))  # fmt: skip
    roll_up(engine)
    assert sum(filled) == 0
    assert_totals_are_running_sums(engine)
    store_series(engine, clock, uuid="GPU-a", start=T0, metrics=metrics(12, 3))  # late
    roll_up(engine)
    assert sum(filled) > 0
    assert_totals_are_running_sums(engine)
