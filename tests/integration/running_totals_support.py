"""The check that rollup_1m's running totals are the running sums of its minutes."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, select

from service.db.schema import CUMULATIVE_FIELDS, rollup_1m


def assert_totals_are_running_sums(engine: Engine) -> int:
    """Every row's cum_* equals the sum of its GPU's rows up to it; returns the row count."""
    with engine.connect() as conn:
        rows = (
            conn.execute(select(rollup_1m).order_by(rollup_1m.c.gpu_id, rollup_1m.c.bucket_start))
            .mappings()
            .all()
        )
    running: dict[int, list[float]] = {}
    for r in rows:
        acc = running.setdefault(r["gpu_id"], [0.0] * len(CUMULATIVE_FIELDS))
        for i, f in enumerate(CUMULATIVE_FIELDS):
            acc[i] += r[f] or 0.0
            assert r[f"cum_{f}"] == pytest.approx(acc[i], rel=1e-12, abs=1e-9), (
                r["bucket_start"],
                f,
            )
    return len(rows)
