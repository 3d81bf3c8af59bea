"""Reads first: a background round's next statement waits while an API read of the process
runs, within the round's allowance; outside a round, with no read in flight, or while its
transaction holds writes another writer could wait for, nothing waits."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection, Engine, insert, text

from service.db import foreground
from service.db.schema import rollup_dirty

PAUSE_SECONDS = 0.2  # the longest pause these tests let a round take


@pytest.fixture
def giving_way(engine: Engine) -> Iterator[Engine]:
    """The test database's engine, its background rounds giving way to reads (undone after)."""
    foreground.give_way_at_statements(engine)
    foreground.give_way_at_statements(engine)  # a second call adds nothing
    yield engine
    foreground.stop_giving_way(engine)


@pytest.fixture
def short_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pauses of at most PAUSE_SECONDS, so a round that pauses with no one to end it goes on."""
    monkeypatch.setattr(foreground, "MAX_PAUSE_SECONDS", PAUSE_SECONDS)


def _has_run_a_minute() -> None:
    round_ = foreground._current()
    assert round_ is not None
    round_.started -= 60.0  # it has worked a minute: its allowance is no limit here


def _mark(conn: Connection) -> None:
    """A write a rollup makes (a keyless dirty mark), in ``conn``'s open transaction."""
    at = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
    conn.execute(insert(rollup_dirty).values(gpu_id=1, bucket_start=at))


def test_a_round_s_statement_waits_for_the_read_in_flight(
    giving_way: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(foreground, "MAX_PAUSE_SECONDS", 60.0)
    order: list[str] = []
    in_read, read_may_end = threading.Event(), threading.Event()

    def read() -> None:
        with foreground.reading(), giving_way.connect() as conn:
            conn.execute(text("SELECT 1"))  # not a round: never waits
            in_read.set()
            read_may_end.wait(30)
            order.append("read ends")

    def background() -> None:
        with foreground.background_round():
            _has_run_a_minute()
            with giving_way.connect() as conn:
                conn.execute(text("SELECT 1"))
                order.append("round's statement")

    reader = threading.Thread(target=read)
    reader.start()
    assert in_read.wait(30)
    worker = threading.Thread(target=background)
    worker.start()
    worker.join(0.5)
    assert worker.is_alive() and order == []  # waiting at its statement
    read_may_end.set()
    reader.join(30)
    worker.join(30)
    assert order == ["read ends", "round's statement"]


def test_a_round_that_has_not_run_yet_or_no_read_waits_for_nothing(giving_way: Engine) -> None:
    assert foreground.give_way() == 0.0  # not in a round
    with foreground.background_round():
        assert foreground.give_way() == 0.0  # no read in flight
        with foreground.reading():
            round_ = foreground._current()
            assert round_ is not None
            round_.started += 60.0  # it has run for no time: no allowance
            assert foreground.give_way() == 0.0
            with giving_way.connect() as conn:
                assert conn.execute(text("SELECT 1")).scalar_one() == 1
    assert list(foreground.every_rows(range(2000))) == list(range(2000))


def test_a_round_never_pauses_while_its_writes_could_hold_a_writer_up(
    giving_way: Engine, short_pauses: None
) -> None:
    with foreground.background_round(), foreground.reading():
        _has_run_a_minute()
        with giving_way.connect() as conn:
            assert foreground.give_way() > 0.0  # nothing written yet: it pauses
            _mark(conn)
            assert foreground.give_way() == 0.0  # its open transaction holds a write
            conn.execute(text("SELECT 1"))  # nor at its statements
            conn.commit()
            assert foreground.give_way() > 0.0  # written and committed: it pauses again
            _mark(conn)
            conn.rollback()
            assert foreground.give_way() > 0.0
            _mark(conn)
        assert foreground.give_way() > 0.0  # closed without a commit: rolled back on return


def test_a_round_whose_rows_are_its_own_may_pause_holding_them_on_postgresql_only(
    giving_way: Engine, short_pauses: None
) -> None:
    # PostgreSQL's readers never wait for writes and no one else writes these rows; SQLite's
    # one writer holds the whole database, so there it waits.
    pauses = giving_way.dialect.name == "postgresql"
    with foreground.background_round(own_rows=True), foreground.reading():
        _has_run_a_minute()
        with giving_way.begin() as conn:
            _mark(conn)
            assert (foreground.give_way() > 0.0) is pauses
            conn.execute(text("DELETE FROM rollup_dirty"))


def test_a_write_past_the_statement_events_holds_the_round_until_its_transaction_ends(
    giving_way: Engine, short_pauses: None
) -> None:
    with foreground.background_round(), foreground.reading():
        _has_run_a_minute()
        with giving_way.connect() as conn:
            conn.execute(text("SELECT 1"))
            foreground.wrote(conn)  # a COPY through the driver
            foreground.wrote(conn)  # said twice, counted once
            assert foreground.give_way() == 0.0
            conn.commit()
            assert foreground.give_way() > 0.0


@pytest.mark.parametrize(
    ("statement", "writes"),
    [
        ("SELECT a, recoverable_share FROM t", False),
        ("  with x as (select 1) select * from x", False),
        ("SAVEPOINT sa_savepoint_1", False),
        ("SET LOCAL jit = off", False),
        ("INSERT INTO t VALUES (1)", True),
        ("WITH gone AS (DELETE FROM t RETURNING *) SELECT count(*) FROM gone", True),
        ("SELECT * FROM t FOR UPDATE SKIP LOCKED", True),
        ("SELECT * FROM t FOR KEY SHARE", True),
        ("CREATE TEMP TABLE s (x int)", True),
        ("PRAGMA wal_checkpoint", True),
    ],
)
def test_what_counts_as_a_write(statement: str, writes: bool) -> None:
    assert foreground.is_write(statement) is writes
