"""Reads first: a background round's next statement waits while an API read of the process
runs, within the round's allowance; outside a round, or with no read in flight, nothing waits."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, event, text

from service.db import foreground


@pytest.fixture
def giving_way(engine: Engine) -> Iterator[Engine]:
    """The test database's engine, its background rounds giving way to reads (undone after)."""
    foreground.give_way_at_statements(engine)
    foreground.give_way_at_statements(engine)  # a second call adds nothing
    yield engine
    event.remove(engine, "before_cursor_execute", foreground._before_statement)


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
            foreground._local.round[0] -= 60.0  # it has run for a minute: may pause a minute
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
            foreground._local.round[0] += 60.0  # it has run for no time: no allowance
            assert foreground.give_way() == 0.0
            with giving_way.connect() as conn:
                assert conn.execute(text("SELECT 1")).scalar_one() == 1
    assert list(foreground.every_rows(range(2000))) == list(range(2000))
