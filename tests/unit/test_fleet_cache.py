"""The fleet page's dollars are reused for one rollup interval (while a report would still read
the sums they come from, where they do), and never across midnight."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from service.usecases.fleet import WastedToday, WastedTodayCache

DAY = datetime(2026, 12, 3, tzinfo=UTC)


def _figures(day: datetime, *, from_sums: bool = False) -> WastedToday:
    return WastedToday(
        day, day, {"GPU-a": {"waste_usd": 1.5}, "GPU-b": {"waste_usd": None}}, "api", [],
        from_sums=from_sums,
    )  # fmt: skip


def test_fresh_figures_of_the_same_day_are_reused() -> None:
    cache = WastedTodayCache(max_age_seconds=3600)
    assert cache.get(DAY, DAY) is None
    cache.put(_figures(DAY))
    assert cache.get(DAY, DAY) == _figures(DAY)
    assert (
        cache.get(DAY + timedelta(days=1), DAY + timedelta(days=1)) is None
    )  # a new day starts from nothing


def test_figures_older_than_the_interval_are_not() -> None:
    cache = WastedTodayCache(max_age_seconds=0)
    cache.put(_figures(DAY))
    assert cache.get(DAY, DAY) is None


def test_figures_read_from_today_s_sums_are_reused_while_those_sums_would_be_read() -> None:
    cache = WastedTodayCache(max_age_seconds=0, sums_lag_seconds=300)
    cache.put(_figures(DAY, from_sums=True))  # summed up to DAY
    assert cache.get(DAY, DAY + timedelta(seconds=300)) == _figures(DAY, from_sums=True)
    assert cache.get(DAY, DAY + timedelta(seconds=301)) is None  # a report reads finer data
    assert cache.latest() == _figures(DAY, from_sums=True)


def test_the_figures_are_watched_for_a_while_after_a_page_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seconds = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: seconds[0])
    cache = WastedTodayCache(max_age_seconds=15, watched_seconds=120)
    assert not cache.watched()  # no page asked yet
    cache.get(DAY, DAY)  # a page asks, whatever it finds
    seconds[0] += 120
    assert cache.watched()
    seconds[0] += 0.5
    assert not cache.watched()
