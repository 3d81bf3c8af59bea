"""The money's door picks the source of each part of a window: whole days from the day sums,
mid-day edges from finer data (rollups, tenant rows, raw edges), today from today's sums."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from service.usecases.costing.dollars import _FORCED, ReadPath, forced, may_read_sums, plan_sources

NOW = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)
DAY = timedelta(days=1)


def day(n: int, hour: int = 0, minute: int = 0) -> datetime:
    """December ``n``, 2026 at ``hour``:``minute`` UTC."""
    return datetime(2026, 12, n, hour, minute, tzinfo=UTC)


def test_whole_days_come_from_the_day_sums_and_their_edges_from_finer_data() -> None:
    start, end = day(1, 6), day(3, 18)
    plan = plan_sources(start, end, NOW, sums_until=None)
    assert plan.days == (day(2), day(3))
    assert plan.finer == ((start, day(2), None), (day(3), end, None))
    assert plan.end == end
    assert plan.source_of(day(2, 12)) == "day_sums"
    assert plan.source_of(day(1, 23, 59)) == "finer"
    assert plan.source_of(day(3, 0)) == "finer"  # the last day is cut: not whole


def test_a_window_inside_one_day_reads_finer_data_only() -> None:
    start, end = day(3, 8), day(3, 10)
    assert not may_read_sums(start, end, NOW)
    plan = plan_sources(start, end, NOW, sums_until=None)
    assert plan.days is None
    assert plan.finer == ((start, end, None),)
    assert plan.source_of(day(3, 9)) == "finer"


def test_today_reads_its_sums_so_far_and_ends_where_they_do() -> None:
    today = day(5)
    assert may_read_sums(today, NOW, NOW)
    until = NOW - timedelta(minutes=2)
    plan = plan_sources(today, NOW, NOW, sums_until=until)
    assert plan.days == (today, until)
    assert plan.finer == ()  # from midnight to the sums' end: nothing left to finer data
    assert plan.end == until
    assert plan.source_of(day(5, 9)) == "day_sums"


def test_today_without_current_sums_reads_finer_data_to_now() -> None:
    plan = plan_sources(day(5), NOW, NOW, sums_until=None)
    assert plan.days is None and plan.finer == ((day(5), NOW, None),) and plan.end == NOW


def test_days_before_today_and_today_so_far_join_with_no_gap() -> None:
    until = NOW - timedelta(minutes=5)
    plan = plan_sources(day(2, 12), NOW, NOW, sums_until=until)
    assert plan.days == (day(3), until)
    assert plan.finer == ((day(2, 12), day(3), None),)


def test_the_stale_gpus_days_are_read_from_finer_data() -> None:
    plan = plan_sources(day(1), day(4), NOW, sums_until=None, stale=frozenset({7, 3}))
    assert plan.days == (day(1), day(4))
    # The edges are empty (midnight to midnight) and dropped; the stale GPUs' days remain.
    assert plan.finer == ((day(1), day(4), (3, 7)),)


def test_a_window_reaching_past_now_reads_no_day_not_over_yet() -> None:
    plan = plan_sources(day(3, 12), day(7), NOW, sums_until=None)
    assert plan.days == (day(4), day(5))
    assert plan.finer == ((day(3, 12), day(4), None), (day(5), day(7), None))


def test_a_forced_read_path_holds_only_inside_its_block() -> None:
    assert _FORCED.get() is None
    with forced(ReadPath(edges="raw", day_sums=False)):
        assert _FORCED.get() == ReadPath(edges="raw", day_sums=False)
    assert _FORCED.get() is None
