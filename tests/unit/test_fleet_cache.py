"""The fleet page's dollars are reused for one rollup interval, and never across midnight."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from service.usecases.fleet import WastedToday, WastedTodayCache

DAY = datetime(2026, 12, 3, tzinfo=UTC)


def _figures(day: datetime) -> WastedToday:
    return WastedToday(
        day, day, {"GPU-a": {"waste_usd": 1.5}, "GPU-b": {"waste_usd": None}}, "api", []
    )


def test_fresh_figures_of_the_same_day_are_reused() -> None:
    cache = WastedTodayCache(max_age_seconds=3600)
    assert cache.get(DAY) is None
    cache.put(_figures(DAY))
    assert cache.get(DAY) == _figures(DAY)
    assert cache.get(DAY + timedelta(days=1)) is None  # a new day starts from nothing


def test_figures_older_than_the_interval_are_not() -> None:
    cache = WastedTodayCache(max_age_seconds=0)
    cache.put(_figures(DAY))
    assert cache.get(DAY) is None
