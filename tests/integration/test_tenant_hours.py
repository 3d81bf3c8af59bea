"""Shared minutes summed per hour: reports read whole hours of a shared stretch from tenant_1h
and get what reading every tenant_1m row gets; the rollup job keeps the hours, retention
prunes them and migration 0013 fills them from rows already stored."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, delete, func, insert, select, update

from service.context import ServiceContext
from service.costs.integrals import INTEGRAL_FIELDS, Thresholds
from service.costs.prices import PriceRow, price_lookup
from service.costs.tenants import SplitRule, tenant_line
from service.db import rollup_repo, tenant_marks, tenants_repo
from service.db.costing import costs_repo
from service.db.migrate import upgrade
from service.db.retention import enforce_retention
from service.db.schema import (
    gpus,
    job_gpus,
    jobs,
    nodes,
    prices,
    shared_1h,
    tenant_1d,
    tenant_1h,
    tenant_1m,
)
from service.settings import Settings
from service.usecases import ingest as ingest_service
from service.usecases import price_table
from service.usecases.costing import cost_report, shared_minutes
from service.wire import IngestBatch
from tests.conftest import empty_engine
from tests.support import FakeClock, iso

GIB = 1024**3
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
STEP = 30  # seconds between samples
MINUTES = 300
T0 = datetime(2026, 12, 2, 2, 0, tzinfo=UTC)  # five hours of data before the clock's 08:00
PRICE_CHANGE = T0 + timedelta(minutes=190, seconds=30)  # inside a shared stretch, mid-minute
# (job, GPU, start, end in minutes from T0, SM share, memory held): job-b joins GPU-h0 mid-hour
# and mid-minute, so GPU-h0 is shared from 00:47:13 to 04:50:31 (whole hours 1, 2 and 3);
# GPU-h1 is shared from 01:05:40 to 02:10 (no whole hour).
HOLDS = [
    ("job-a", "GPU-h0", 0.0, 300.0, 0.8, 2 * GIB),
    ("job-b", "GPU-h0", 47 + 13 / 60, 290 + 31 / 60, 0.0, 8 * GIB),
    ("job-c", "GPU-h1", 5.0, 130.0, 0.5, 4 * GIB),
    ("job-d", "GPU-h1", 65 + 40 / 60, 195.0, 0.2, 1 * GIB),
]


def _store(engine: Engine, clock: FakeClock) -> None:
    ctx = ServiceContext(
        settings=Settings(database_url="sqlite://", run_scheduler=False), engine=engine, clock=clock
    )
    uuids = ("GPU-h0", "GPU-h1")
    for first in range(0, MINUTES * 60 // STEP, 600):
        samples: list[dict[str, Any]] = []
        procs: list[dict[str, Any]] = []
        for k in range(first, min(first + 600, MINUTES * 60 // STEP)):
            ts = T0 + timedelta(seconds=k * STEP)
            minute = k * STEP / 60
            for uuid in uuids:
                mine = [h for h in HOLDS if h[1] == uuid and h[2] <= minute < h[3]]
                busy = any(h[4] > 0 for h in mine) and k % 7 != 0
                samples.append({"gpu_uuid": uuid, "ts": iso(ts), "metrics": {
                    "sm_active": 0.9 if busy else 0.0, "gr_engine_active": 0.95 if busy else 0.0,
                    "gpu_util": 1.0 if busy else 0.0, "tensor_active": 0.6 if busy else 0.0,
                    "dram_active": 0.1, "fb_used_bytes": sum(h[5] for h in mine) + GIB // 2,
                    "power_watts": 500.0 if busy else 90.0 + k % 5,
                }})  # fmt: skip
                for n, h in enumerate(mine):
                    procs.append({"gpu_uuid": uuid, "ts": iso(ts),
                                  "pid": 1000 + HOLDS.index(h) * 10 + n, "fb_used_bytes": h[5],
                                  "job_id": h[0], "sm_util": h[4] * 0.05, "mem_util": 0.01})  # fmt: skip
        batch = {
            "node": {"hostname": "node-h", "labels": {}},
            "gpus": [
                {
                    "uuid": u,
                    "index": i,
                    "model": "NVIDIA H100 80GB HBM3",
                    "fb_total_bytes": 80 * GIB,
                }
                for i, u in enumerate(uuids)
            ],
            "samples": samples,
            "processes": procs,
        }
        ingest_service.ingest(ctx, IngestBatch.model_validate(batch), token_node="node-h")


def _register(engine: Engine) -> None:
    with engine.begin() as conn:
        ids = dict(conn.execute(select(gpus.c.uuid, gpus.c.id)).all())
        conn.execute(delete(job_gpus))  # the observed jobs ingest opened: registered ones instead
        conn.execute(delete(jobs))
        for job in sorted({h[0] for h in HOLDS}):
            conn.execute(insert(jobs).values(
                id=job, user=job, team=f"team-{job}", project="p", labels={}, source="api",
                started_at=T0, created_at=T0, updated_at=T0,
            ))  # fmt: skip
        for job, uuid, s, e, _sm, _fb in HOLDS:
            conn.execute(insert(job_gpus).values(
                job_id=job, gpu_id=ids[uuid], source="api",
                started_at=T0 + timedelta(minutes=s), ended_at=T0 + timedelta(minutes=e),
            ))  # fmt: skip
        conn.execute(insert(prices), [
            {"model_pattern": "*", "usd_per_gpu_hour": 4.0, "effective_from": T0 - timedelta(days=1)},
            {"model_pattern": "*", "usd_per_gpu_hour": 6.5, "effective_from": PRICE_CHANGE},
        ])  # fmt: skip


def _roll_up(engine: Engine, rule: SplitRule) -> None:
    while True:
        with engine.begin() as conn:
            if rollup_repo.process_dirty(conn, thresholds=Thresholds(), split_rule=rule) == 0:
                return


@pytest.fixture
def shared(engine: Engine, clock: FakeClock) -> Engine:
    _store(engine, clock)
    _register(engine)  # registered after ingest: the rollup still sees who held what
    _roll_up(engine, SplitRule.MEMORY)
    return engine


def _usd(row: PriceRow | None) -> float | None:
    return None if row is None else row.usd_per_gpu_hour


def _per_row(
    conn: Connection, settings: Settings, start: datetime, end: datetime, now: datetime,
    gpu_ids: list[int] | None,
) -> tuple[dict[tuple[str | None, int, float | None], list[float]], set[str]]:  # fmt: skip
    """What a report read before hours: every tenant_1m row of the window, one line each
    (a part of a cut minute raw samples still hold split again from them), summed per job,
    GPU and price."""
    end = min(end, now)
    lookup = price_lookup(price_table.effective_prices(conn, settings).rows)
    info = costs_repo.load_gpus(conn, gpu_ids=gpu_ids)
    raw_from = now - timedelta(days=settings.retention_raw_days)
    t = tenant_1m.c
    q = select(tenant_1m).where(t.bucket_start > start - MINUTE, t.bucket_start < end)
    if gpu_ids is not None:
        q = q.where(t.gpu_id.in_(gpu_ids))
    rules: set[str] = set()
    lines = []
    cut: dict[tuple[int, datetime], tuple[datetime, datetime, str]] = {}
    for row in (dict(r._mapping) for r in conn.execute(q)):
        gpu_id, bucket = row["gpu_id"], row["bucket_start"]
        lo, hi = max(bucket, start, info[gpu_id].known_from), min(bucket + MINUTE, end)
        if lo >= hi:
            continue
        rules.add(row["split_rule"])
        if hi - lo < MINUTE and lo >= raw_from:
            cut[(gpu_id, bucket)] = (lo, hi, row["split_rule"])
            continue
        line = tenant_line(row, (hi - lo) / MINUTE)
        line.usd_per_gpu_hour = _usd(lookup(info[gpu_id].model, bucket))
        lines.append(line)
    for (gpu_id, bucket), (lo, hi, rule) in cut.items():
        for part in tenants_repo.split_part(
            conn, gpu_id=gpu_id, start=lo, end=hi, thresholds=Thresholds(), rule=SplitRule(rule)
        ):
            line = tenant_line(part, 1.0)
            line.usd_per_gpu_hour = _usd(lookup(info[gpu_id].model, bucket))
            lines.append(line)
    return _summed(lines), rules


def _summed(lines: list[Any]) -> dict[tuple[str | None, int, float | None], list[float]]:
    out: dict[tuple[str | None, int, float | None], list[float]] = defaultdict(
        lambda: [0.0] * (1 + len(INTEGRAL_FIELDS))
    )
    for line in lines:
        acc = out[(line.job_id, line.gpu_id, line.usd_per_gpu_hour)]
        acc[0] += line.held_seconds
        for i, f in enumerate(INTEGRAL_FIELDS):
            acc[i + 1] += getattr(line.usage, f)
    return dict(out)


def _by_hours(
    conn: Connection, settings: Settings, start: datetime, end: datetime, now: datetime,
    gpu_ids: list[int] | None,
) -> tuple[dict[tuple[str | None, int, float | None], list[float]], set[str]]:  # fmt: skip
    """What a report reads now: the stretches of shared minutes, whole minutes summed in the
    database (whole hours from tenant_1h), cut minutes row by row."""
    end = min(end, now)
    table = price_table.effective_prices(conn, settings)
    lookup = price_lookup(table.rows)
    info = costs_repo.load_gpus(conn, gpu_ids=gpu_ids)
    stretches = tenants_repo.shared_stretches(conn, start=start, end=end, gpu_ids=gpu_ids)
    lines, rules = shared_minutes.shared_lines(
        conn, stretches=stretches, gpu_info=info,
        held_from_of={g: max(start, i.known_from) for g, i in info.items()}, end=end,
        prices=table.rows,
        price_of=lambda seg: _usd(lookup(info[seg.gpu_id].model, seg.start)),
        raw_from=now - timedelta(days=settings.retention_raw_days), settings=settings,
    )  # fmt: skip
    return _summed(lines), rules


WINDOWS = [
    (T0, T0 + timedelta(minutes=MINUTES)),  # all of it, on whole minutes and hours
    (T0 + timedelta(minutes=50, seconds=20), T0 + timedelta(minutes=250, seconds=40)),
    (T0 + timedelta(minutes=61), T0 + timedelta(minutes=179, seconds=59.5)),
    (T0 + timedelta(minutes=120), T0 + timedelta(minutes=240)),  # exactly two whole hours
    (T0 + timedelta(minutes=100, seconds=5), T0 + timedelta(minutes=100, seconds=35)),
]


@pytest.mark.parametrize("raw_kept", [True, False], ids=["raw-kept", "raw-gone"])
def test_whole_hours_give_what_every_row_gives(
    shared: Engine, clock: FakeClock, settings: Settings, raw_kept: bool
) -> None:
    """Windows that cut shared minutes (split from raw samples while raw retention holds them,
    pro rata after), a price change inside a stretch, a job joining mid-hour: per job, GPU and
    price the same seconds, integrals and split rules as one line per stored row."""
    if not raw_kept:
        settings.retention_raw_days = 0.01  # 14 min: the raw samples of every window are past it
    with shared.connect() as conn:
        hours = conn.execute(select(func.count()).select_from(tenant_1h)).scalar_one()
        assert hours and conn.execute(
            select(func.count()).select_from(shared_1h).where(
                shared_1h.c.minute_mask == tenants_repo.FULL_HOUR
            )
        ).scalar_one() == 3  # GPU-h0's hours 1, 2 and 3  # fmt: skip
        gpu_h0 = conn.execute(select(gpus.c.id).where(gpus.c.uuid == "GPU-h0")).scalar_one()
        for start, end in WINDOWS:
            for gpu_ids in (None, [gpu_h0]):
                want, want_rules = _per_row(conn, settings, start, end, clock(), gpu_ids)
                got, got_rules = _by_hours(conn, settings, start, end, clock(), gpu_ids)
                assert got_rules == want_rules == {"memory"}
                assert set(got) == set(want), (start, end)
                for key, values in want.items():
                    assert got[key] == pytest.approx(values, rel=1e-9, abs=1e-9), (key, start, end)
        # Both prices show up: the stretch on GPU-h0 spans the change.
        prices_seen = {key[2] for key in _per_row(conn, settings, *WINDOWS[0], clock(), None)[0]}
    assert prices_seen == {4.0, 6.5}


def test_reports_over_shared_hours_reconcile_to_the_cent(
    shared: Engine, clock: FakeClock, settings: Settings
) -> None:
    settings.cost_split_rule = "memory"
    with shared.connect() as conn:
        for start, end in WINDOWS[:4]:
            by_job = cost_report.cost_report(conn, settings=settings, start=start, end=end,
                                             now=clock(), group_by="job")  # fmt: skip
            by_gpu = cost_report.cost_report(conn, settings=settings, start=start, end=end,
                                             now=clock(), group_by="gpu")  # fmt: skip
            gpu_cost = sum(r["cost_usd"] for r in by_gpu["rows"])
            job_cost = sum(r["cost_usd"] for r in by_job["rows"])
            assert job_cost == pytest.approx(gpu_cost, abs=1e-6)
            assert by_job["warnings"] == [] and by_job["split_rule"] == "memory"
    rows = {r["key"]: r for r in by_job["rows"]}
    # job-b never ran a kernel: all its time on GPU-h0 is idle_held.
    assert rows["job-b"]["idle_held_seconds"] == pytest.approx(rows["job-b"]["allocated_seconds"])


def _hours_from_minutes(conn: Connection) -> tuple[dict[Any, list[float]], dict[Any, int]]:
    """tenant_1h and shared_1h as they should be: tenant_1m summed per hour in Python."""
    sums: dict[Any, list[float]] = defaultdict(lambda: [0.0] * (1 + len(INTEGRAL_FIELDS)))
    masks: dict[Any, int] = defaultdict(int)
    for row in conn.execute(select(tenant_1m)):
        hour = row.bucket_start.replace(minute=0)
        acc = sums[(row.gpu_id, hour, row.tenant, row.split_rule)]
        acc[0] += row.held_seconds
        for i, f in enumerate(INTEGRAL_FIELDS):
            acc[i + 1] += getattr(row, f)
        masks[(row.gpu_id, hour)] |= 1 << row.bucket_start.minute
    return dict(sums), dict(masks)


def assert_hours_match_minutes(engine: Engine) -> None:
    """tenant_1h and shared_1h hold exactly tenant_1m's sums and minutes per hour, tenant_1d
    its sums per day."""
    with engine.connect() as conn:
        sums, masks = _hours_from_minutes(conn)
        stored = {
            (r.gpu_id, r.bucket_start, r.tenant, r.split_rule): [
                r.held_seconds,
                *(getattr(r, f) for f in INTEGRAL_FIELDS),
            ]
            for r in conn.execute(select(tenant_1h))
        }
        stored_masks = {
            (r.gpu_id, r.bucket_start): int(r.minute_mask) for r in conn.execute(select(shared_1h))
        }
    assert stored_masks == masks
    assert set(stored) == set(sums)
    for key, values in sums.items():
        assert stored[key] == pytest.approx(values, rel=1e-12, abs=1e-9)
    days: dict[Any, list[float]] = defaultdict(lambda: [0.0] * (1 + len(INTEGRAL_FIELDS)))
    for (gpu_id, hour, tenant, rule), values in sums.items():
        acc = days[(gpu_id, hour.replace(hour=0), tenant, rule)]
        for i, v in enumerate(values):
            acc[i] += v
    with engine.connect() as conn:
        stored_days = {
            (r.gpu_id, r.bucket_start, r.tenant, r.split_rule): [
                r.held_seconds,
                *(getattr(r, f) for f in INTEGRAL_FIELDS),
            ]
            for r in conn.execute(select(tenant_1d))
        }
    assert set(stored_days) == set(days)
    for key, values in days.items():
        assert stored_days[key] == pytest.approx(values, rel=1e-12, abs=1e-9)


def test_the_rollup_job_keeps_the_hours_when_minutes_are_split_again(
    shared: Engine, clock: FakeClock
) -> None:
    assert_hours_match_minutes(shared)
    ended = T0 + timedelta(minutes=140, seconds=10)
    with shared.begin() as conn:  # job-b's interval ends early (as end_job closes one)
        h0 = conn.execute(select(gpus.c.id).where(gpus.c.uuid == "GPU-h0")).scalar_one()
        conn.execute(update(job_gpus).where(job_gpus.c.job_id == "job-b").values(ended_at=ended))
        tenant_marks.mark_after(conn, gpu_ids=[h0], since=ended)
    _roll_up(shared, SplitRule.EQUAL)
    assert_hours_match_minutes(shared)
    with shared.connect() as conn:
        rules = set(conn.execute(select(tenant_1h.c.split_rule).distinct()).scalars())
        last = conn.execute(
            select(func.max(shared_1h.c.bucket_start)).where(shared_1h.c.gpu_id == h0)
        ).scalar_one()
    assert rules == {"memory", "equal"}  # the hour job-b ended in mixes both rules
    assert last == T0 + 2 * HOUR  # GPU-h0 was shared to minute 290; now to minute 140


def test_retention_prunes_the_hours_with_the_minutes(shared: Engine, clock: FakeClock) -> None:
    # 1h retention ending at 03:30: tenant_1m keeps 03:30 on; the hours go once they are past.
    days = (clock() - (T0 + timedelta(minutes=90))) / timedelta(days=1)
    with shared.begin() as conn:
        out = enforce_retention(conn, now=clock(), raw_days=days, minute_days=days, hour_days=days)
    assert out["tenant_1h_deleted"] > 0 and out["shared_1h_deleted"] > 0
    with shared.connect() as conn:
        first_minute = conn.execute(select(func.min(tenant_1m.c.bucket_start))).scalar_one()
        first_hours = {
            conn.execute(select(func.min(t.c.bucket_start))).scalar_one()
            for t in (tenant_1h, shared_1h)
        }
    assert first_minute == T0 + timedelta(minutes=90)
    assert first_hours == {T0 + HOUR}  # the hour 03:00 still has minutes; 02:00 went
    assert out["tenant_1d_deleted"] == 0  # the day still has hours
    with shared.begin() as conn:  # a day later: the whole day is past
        out = enforce_retention(conn, now=clock() + timedelta(days=1), raw_days=days,
                                minute_days=days, hour_days=days)  # fmt: skip
        left = [conn.execute(select(func.count()).select_from(t)).scalar_one()
                for t in (tenant_1m, tenant_1h, shared_1h, tenant_1d)]  # fmt: skip
    assert out["tenant_1d_deleted"] > 0 and left == [0, 0, 0, 0]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migrations_0013_and_0014_sum_the_tenant_rows_already_stored(
    backend: str, tmp_path: Path
) -> None:
    with empty_engine(backend, tmp_path) as engine:
        upgrade(engine, "0012")
        rows = []
        for m in (*range(55, 125), 200, 202, 203):  # two hours and a bit, then three minutes
            bucket = T0 + timedelta(minutes=m)
            for n, tenant in enumerate(("job-x", "job-y", "")[: 2 + m % 2]):
                rows.append({"gpu_id": 7, "bucket_start": bucket, "tenant": tenant,
                             "interval_id": n, "split_rule": "equal" if m < 100 else "activity",
                             "held_seconds": 60.0 / (2 + m % 2), "covered_seconds": 20.0 + n,
                             "energy_used_joules": 100.0 * m})  # fmt: skip
        with engine.begin() as conn:
            conn.execute(insert(tenant_1m), rows)
        upgrade(engine)
        assert_hours_match_minutes(engine)
        with engine.connect() as conn:
            masks = dict(
                conn.execute(select(shared_1h.c.bucket_start, shared_1h.c.minute_mask)).all()
            )
        assert masks[T0 + HOUR] == tenants_repo.FULL_HOUR
        assert masks[T0 + 3 * HOUR] == (1 << 20) | (1 << 22) | (1 << 23)


D0 = datetime(2026, 11, 28, 0, 0, tzinfo=UTC)
IST, CET = timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=1))
DAY_PRICE_CHANGE = D0 + timedelta(days=2, hours=1, minutes=30, seconds=30)


def _days_of_rows(engine: Engine) -> None:
    """Three days of tenant rows on two GPUs, as the rollup job writes them: stretches that
    start mid-hour and cross midnight, gaps of minutes and of hours, a third job for a while,
    the split rule changed on the second day; then their hours and days."""
    rows = []
    minutes = [
        *range(3 * 60 + 17, 20 * 60),  # GPU 1: 03:17 on day 0 ...
        *range(20 * 60 + 3, 22 * 60),  # ... a three-minute gap ...
        *range(24 * 60 + 2 * 60, 2 * 24 * 60 + 5 * 60 + 41),  # ... two hours off, to day 2
    ]
    for gpu_id, offsets in ((1, minutes), (2, [*range(50, 200), *range(1430, 1500)])):
        for m in offsets:
            bucket = D0 + timedelta(minutes=m)
            tenants = ["job-x", "job-y"] + (["job-z"] if 600 <= m < 2000 else [])
            if m % 97 == 0:
                tenants.append("")  # a moment of the minute nobody held
            for n, tenant in enumerate(tenants):
                row: dict[str, Any] = {
                    f: (m % 13 + n + i) * 0.37 for i, f in enumerate(INTEGRAL_FIELDS)
                }
                row.update(gpu_id=gpu_id, bucket_start=bucket, tenant=tenant, interval_id=n,
                           split_rule="equal" if m < 1800 else "memory",
                           held_seconds=60.0 / len(tenants))  # fmt: skip
                rows.append(row)
    with engine.begin() as conn:
        conn.execute(insert(nodes).values(id=1, hostname="n", labels={}, first_seen_at=D0,
                                          last_seen_at=D0))  # fmt: skip
        conn.execute(insert(gpus), [
            {"id": g, "uuid": f"GPU-d{g}", "node_id": 1, "gpu_index": g, "model": "NVIDIA H200",
             "first_seen_at": D0 - timedelta(days=1)} for g in (1, 2)
        ])  # fmt: skip
        conn.execute(insert(prices), [
            {"model_pattern": "*", "usd_per_gpu_hour": 9.0, "effective_from": D0 - timedelta(days=9)},
            {"model_pattern": "*H200*", "usd_per_gpu_hour": 7.25, "effective_from": DAY_PRICE_CHANGE},
        ])  # fmt: skip
        conn.execute(insert(tenant_1m), rows)
        keys = sorted({(r["gpu_id"], r["bucket_start"]) for r in rows})
        hours = sorted({(g, b.replace(minute=0)) for g, b in keys})
        tenants_repo.rollup_hours(conn, hours, keys)


def test_whole_days_give_what_every_row_gives(
    engine: Engine, clock: FakeClock, settings: Settings
) -> None:
    _days_of_rows(engine)
    assert_hours_match_minutes(engine)
    settings.retention_raw_days = 0.01  # no raw samples: cut minutes count pro rata
    windows = [
        (D0, D0 + timedelta(days=3)),
        (D0 + timedelta(days=1), D0 + timedelta(days=2)),  # one whole day
        (
            D0 + timedelta(hours=5, minutes=30, seconds=20),
            D0 + timedelta(days=2, hours=1, seconds=40),
        ),
        (
            D0 + timedelta(hours=23, minutes=59, seconds=30),
            D0 + timedelta(days=1, hours=23, minutes=1),
        ),
        # Windows given in India's and Central Europe's time: hours and days stay UTC's.
        (datetime(2026, 11, 28, 9, 30, tzinfo=IST), datetime(2026, 11, 30, 5, 30, 17, tzinfo=IST)),
        (datetime(2026, 11, 28, 1, 0, tzinfo=CET), datetime(2026, 11, 30, 1, 0, tzinfo=CET)),
    ]
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(tenant_1d)).scalar_one() > 0
        for start, end in windows:
            for gpu_ids in (None, [2]):
                want, want_rules = _per_row(conn, settings, start, end, clock(), gpu_ids)
                got, got_rules = _by_hours(conn, settings, start, end, clock(), gpu_ids)
                assert got_rules == want_rules
                assert set(got) == set(want), (start, end)
                for key, values in want.items():
                    assert got[key] == pytest.approx(values, rel=1e-9, abs=1e-9), (key, start, end)
        everything = _per_row(conn, settings, *windows[0], clock(), None)
    assert {key[2] for key in everything[0]} == {9.0, 7.25}
    assert everything[1] == {"equal", "memory"}
    assert {key[0] for key in everything[0]} == {"job-x", "job-y", "job-z", None}
