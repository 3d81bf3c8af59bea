"""Dirty-minute marks: ingest marking a minute while a rollup recomputes it (the rollup's
transaction still open, its marks of that minute deleted) neither waits for that rollup nor
loses the mark, and a minute marked many times is rolled up once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, Engine, func, select, text

from service.core.diagnosis import Thresholds
from service.db import ingest_repo, partitions, rollup_repo
from service.db.schema import rollup_1m, rollup_dirty
from service.wire import IngestBatch
from tests.support import make_batch

T0 = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)
THRESHOLDS = Thresholds()


def _store(conn: Connection, start: datetime, count: int) -> None:
    batch = IngestBatch.model_validate(make_batch(start=start, count=count))
    pending = ingest_repo.IngestCache()
    ingest_repo.store_batch(
        conn, batch=batch, now=T0 + timedelta(minutes=10), thresholds=THRESHOLDS,
        cache=ingest_repo.IngestCache(), pending=pending,
    )  # fmt: skip


def _partition(engine: Engine) -> None:
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            partitions.ensure_partitions(conn, {T0.date()})


def _marks(engine: Engine) -> list[tuple[int, datetime]]:
    with engine.connect() as conn:
        c = rollup_dirty.c
        return [(g, b) for g, b in conn.execute(select(c.gpu_id, c.bucket_start)).all()]


def _minute_samples(engine: Engine, minute: datetime) -> int:
    with engine.connect() as conn:
        found = conn.execute(
            select(func.sum(rollup_1m.c.sample_count)).where(rollup_1m.c.bucket_start == minute)
        ).scalar_one()
    return int(found or 0)


def test_a_minute_marked_many_times_is_rolled_up_once(engine: Engine) -> None:
    _partition(engine)
    for first in (0, 2, 4):  # three batches whose marked minutes overlap
        with engine.begin() as conn:
            _store(conn, T0 + timedelta(seconds=10 * first), count=2)
    marks = _marks(engine)
    assert len(marks) > len(set(marks))  # the overlapping minutes were marked more than once
    with engine.begin() as conn:
        keys = rollup_repo.dirty_keys(conn, limit=1000)
        assert sorted(keys) == sorted(set(marks))
        assert rollup_repo.process_dirty(conn, thresholds=THRESHOLDS) == len(set(marks))
    assert _marks(engine) == []
    assert _minute_samples(engine, T0) == 6


def test_ingest_marks_a_minute_a_rollup_holds_without_waiting_and_keeps_the_mark(
    engine: Engine,
) -> None:
    _partition(engine)
    with engine.begin() as conn:
        _store(conn, T0, count=3)  # 10:00:00, :10, :20
    rollup = engine.connect()
    try:
        with rollup.begin():
            assert rollup_repo.process_dirty(rollup, thresholds=THRESHOLDS) > 0
            assert _minute_samples(engine, T0) == 0  # not committed yet
            if engine.dialect.name == "postgresql":
                # Another replica's ingest while that rollup's transaction is open: waiting on
                # its locks would raise here, where before it waited for the whole rollup.
                with engine.begin() as ingest:
                    ingest.execute(text("SET LOCAL lock_timeout = '5s'"))
                    _store(ingest, T0 + timedelta(seconds=30), count=2)  # :30, :40
    finally:
        rollup.close()
    if engine.dialect.name != "postgresql":  # SQLite has one writer: ingest comes after
        with engine.begin() as conn:
            _store(conn, T0 + timedelta(seconds=30), count=2)
    assert (1, T0) in set(_marks(engine))  # the later samples' mark outlived the rollup
    with engine.begin() as conn:
        rollup_repo.process_dirty(conn, thresholds=THRESHOLDS)
    assert _minute_samples(engine, T0) == 5
