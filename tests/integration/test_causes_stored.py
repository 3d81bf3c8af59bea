"""Seconds per cause stored once and read everywhere: the rollups (1m and 1h), their running
totals, the cost report and the job summary agree per cause, on SQLite and PostgreSQL; the
migration that brings causes decides the samples already stored; policies on cause:<name>."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, insert, select

from service.core.diagnosis import CAUSE_NAMES, Cause
from service.costs.integrals import CAUSE_FIELDS, ActivityPoint, Thresholds, integrate
from service.db import jobs_repo, windows_repo
from service.db.migrate import upgrade
from service.db.schema import gpus, nodes, rollup_1h, rollup_1m, rollup_dirty, samples
from service.settings import Settings
from service.usecases.costing.cost_report import cost_report
from service.usecases.job_summary import job_summary
from tests.alerting_support import add_job
from tests.conftest import empty_engine
from tests.integration.cost_data import GIB, roll_up, store_series
from tests.integration.running_totals_support import assert_totals_are_running_sums
from tests.support import FakeClock

T0 = datetime(2026, 12, 2, 5, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=2, minutes=45)

# Ten minutes of each kind of second, as a GPM GPU reports them, every 10 s.
PHASES: list[tuple[str, dict[str, Any]]] = [
    ("idle_empty", {"sm_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": GIB // 2}),
    ("launch_bound", {"sm_active": 0.01, "gr_engine_active": 0.3, "gpu_util": 0.3}),
    ("compute_tensor", {"sm_active": 0.95, "gr_engine_active": 1.0, "tensor_active": 0.9}),
    ("input_starved", {"sm_active": 0.1, "gr_engine_active": 0.12, "tensor_active": 0.1}),
    ("transfer_bound", {"sm_active": 0.0, "gpu_util": 0.99, "pcie_rx_bytes_per_second": 25e9}),
    ("memory_bound", {"sm_active": 0.99, "gr_engine_active": 1.0, "dram_active": 0.87}),
    ("compute_no_tensor", {"sm_active": 0.96, "gr_engine_active": 1.0, "tensor_active": 0.0}),
    ("idle_held", {"sm_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": 20 * GIB}),
]


def series(repeat: int = 2) -> list[dict[str, Any]]:
    return [m for _ in range(repeat) for _, m in PHASES for _ in range(60)]


@pytest.fixture
def stored(engine: Engine, clock: FakeClock) -> Settings:
    clock.set(NOW)
    store_series(engine, clock, uuid="GPU-c", start=T0, metrics=series())  # 160 min
    roll_up(engine)
    add_job(engine, "j1", ("GPU-c",), started_at=T0 + timedelta(minutes=25))
    return Settings(
        database_url=str(engine.url.render_as_string(hide_password=False)), run_scheduler=False
    )


def test_rollups_running_totals_report_and_job_summary_agree_per_cause(
    engine: Engine, stored: Settings
) -> None:
    with engine.connect() as conn:
        rows = conn.execute(select(samples).order_by(samples.c.ts)).all()
        points = [
            ActivityPoint(r.ts.timestamp(), r.activity, r.activity_rung, r.cause) for r in rows
        ]
        start, end = T0 + timedelta(minutes=25), NOW
        raw = integrate(points, start.timestamp(), end.timestamp(), Thresholds())
        for table in (rollup_1m, rollup_1h):
            sums = conn.execute(
                select(*(func.sum(table.c[f]) for f in ("covered_seconds", *CAUSE_FIELDS)))
            ).one()
            # Every covered second of the rollups has one cause.
            assert sum(sums[1:]) == pytest.approx(sums[0])
            for name, total in zip(CAUSE_NAMES, sums[1:], strict=True):
                # The last sample covers max_gap (60 s), 50 s past the series' end.
                want = {"unclassified": 0.0, "sham": 0.0, "hung": 0.0, "idle_held": 1250.0}.get(
                    name, 1200.0
                )
                assert total == pytest.approx(want, abs=1.0), (table.name, name)
        report = cost_report(conn, settings=stored, start=start, end=end, now=NOW, group_by="job")
        job = jobs_repo.get_job(conn, job_id="j1")
        assert job is not None
        summary = job_summary(conn, settings=stored, job=job, now=NOW).as_dict()
    assert assert_totals_are_running_sums(engine) > 100
    row = next(r for r in report["rows"] if r["key"] == "j1")
    for name, field in zip(CAUSE_NAMES, CAUSE_FIELDS, strict=True):
        want = getattr(raw, field)
        assert row["causes"][name]["seconds"] == pytest.approx(want, abs=1e-6), name
        assert summary["summary"]["causes"][name]["seconds"] == pytest.approx(want, abs=1e-6)
    assert row["idle_seconds"] == pytest.approx(raw.idle_empty_seconds + raw.idle_held_seconds)
    # Launch-bound and input-starved seconds are waste of their own, not idle.
    assert row["idle_seconds"] < row["allocated_seconds"] / 4
    assert summary["summary"]["top_cause"] == row["top_cause"]
    assert row["top_cause"] in CAUSE_NAMES


def test_policies_read_the_share_of_time_in_a_cause(engine: Engine, stored: Settings) -> None:
    with engine.connect() as conn:
        gpu_id = conn.execute(select(gpus.c.id)).scalar_one()
        wanted = ["cause:idle_held", "cause:launch_bound", "cause:compute_tensor"]
        stats = windows_repo.window_stats(
            conn, windows={600.0: wanted, 9000.0: wanted}, now=NOW, gpu_ids=[gpu_id]
        )
    short, long = stats[600.0][gpu_id], stats[9000.0][gpu_id]
    # The last ten minutes are idle_held. The 2.5 h window starts 15 min into the series and
    # covers 145 min 50 s of it: the second half of the first launch-bound phase, then one
    # whole phase more; both compute_tensor phases whole.
    assert short["cause:idle_held"].sum / short["cause:idle_held"].count == 1.0
    assert short["cause:launch_bound"].max == 0.0
    covered = 145 + 50 / 60
    assert long["cause:launch_bound"].value("avg") == pytest.approx(15 / covered)
    assert long["cause:compute_tensor"].value("avg") == pytest.approx(20 / covered)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migration_0006_decides_stored_samples_and_recomputes_their_rollups(
    backend: str, tmp_path: Path
) -> None:
    with empty_engine(backend, tmp_path) as engine:
        upgrade(engine, "0005")
        ts = [T0 + timedelta(seconds=10 * k) for k in range(12)]
        with engine.begin() as conn:  # data written by a version without causes
            if engine.dialect.name == "postgresql":
                from service.db.partitions import ensure_partitions

                ensure_partitions(conn, {T0.date()})
            conn.execute(
                insert(nodes).values(id=1, hostname="n", labels={}, first_seen_at=T0,
                                     last_seen_at=T0)
            )  # fmt: skip
            conn.execute(
                insert(gpus).values(id=1, uuid="GPU-m", node_id=1, gpu_index=0, model="H100",
                                    first_seen_at=T0)
            )  # fmt: skip
            conn.execute(
                insert(samples),
                [{"gpu_id": 1, "ts": t, "source": "gpm",
                  "sm_active": 0.03 if k < 6 else 0.0, "gpu_util": 0.33 if k < 6 else 0.0,
                  "fb_used_bytes": 20 * GIB} for k, t in enumerate(ts)],
            )  # fmt: skip
            conn.execute(
                insert(rollup_1m),
                [{"gpu_id": 1, "bucket_start": T0, "sample_count": 6, "covered_seconds": 60.0,
                  "idle_seconds": 60.0, "idle_held_seconds": 60.0, "unused_seconds": 59.0},
                 {"gpu_id": 1, "bucket_start": T0 + timedelta(minutes=1), "sample_count": 6,
                  "covered_seconds": 60.0, "idle_seconds": 60.0, "idle_held_seconds": 60.0,
                  "unused_seconds": 60.0}],
            )  # fmt: skip
        upgrade(engine)
        with engine.connect() as conn:
            causes = [r.cause for r in conn.execute(select(samples).order_by(samples.c.ts))]
            dirty = conn.execute(select(func.count()).select_from(rollup_dirty)).scalar_one()
        assert causes == [Cause.LAUNCH_BOUND] * 6 + [Cause.IDLE_HELD] * 6
        assert dirty == 2
        roll_up(engine)
        with engine.connect() as conn:
            first = conn.execute(select(rollup_1m).where(rollup_1m.c.bucket_start == T0)).one()
        # The tiny-kernel minute is launch-bound now, no longer idle.
        assert first.idle_seconds == 0.0 and first.launch_bound_seconds == pytest.approx(60.0)
        assert_totals_are_running_sums(engine)
