"""A page of a report is the same rows, in the same order, as the whole report sorted and sliced,
while the money of groups that cannot reach the page is never worked out; and a report's totals
summed a field at a time equal the groups merged one by one."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.costs.integrals import CAUSE_FIELDS, CAUSE_SIGNALS
from service.costs.money import SORT_BYS, Money, money_of, rank, sort_rows
from service.costs.paging import Page, RankKey, bounds, page_keys, page_of
from service.costs.recommend import FixAssumptions
from service.costs.waste import USAGE_FIELDS, Line, Summary, Usage
from tests.hypothesis_support import examples

seconds = st.floats(min_value=0, max_value=7200, allow_nan=False, allow_infinity=False)
share = st.floats(min_value=0, max_value=1, allow_nan=False)


@st.composite
def summaries(draw: st.DrawFn, key: str) -> Summary:
    """A group: random seconds per cause with random signals on them (so fixes use the
    group's own shares), priced at one of a few prices (equal waste happens) or unpriced."""
    usage = Usage()
    for f in CAUSE_FIELDS:
        setattr(usage, f, draw(st.sampled_from([0.0, 60.0, 3600.0]) | seconds))
    for signal in CAUSE_SIGNALS:
        cause_seconds = getattr(usage, CAUSE_FIELDS[int(signal.cause) - 1])
        scale = 3e10 if signal.signal == "pcie" else 1.0  # bytes per second, else a ratio
        setattr(usage, signal.field, draw(share) * cause_seconds * scale)
    usage.covered_seconds = sum(getattr(usage, f) for f in CAUSE_FIELDS)
    usage.idle_seconds = usage.idle_empty_seconds + usage.idle_held_seconds
    usage.unused_seconds = draw(share) * usage.covered_seconds
    usage.tensor_active_sum = draw(share) * usage.covered_seconds
    usage.tensor_active_count = usage.covered_seconds
    price = draw(st.sampled_from([None, 2.0, 6.88]) | st.floats(min_value=0.5, max_value=12))
    s = Summary(key)
    s.add_line(Line(key, draw(st.integers(0, 50)), usage.covered_seconds + draw(seconds), usage,
                    price, False))  # fmt: skip
    return s


@st.composite
def reports(draw: st.DrawFn) -> list[Summary]:
    n = draw(st.integers(0, 40))
    return [draw(summaries(f"job-{i:03d}")) for i in range(n)]


def full_order(groups: list[Summary], sort_by: str, a: FixAssumptions) -> list[str]:
    """The keys in the order the whole report lists them (rows built, then sorted)."""
    rows: list[dict[str, object]] = []
    for s in groups:
        m = money_of(s, a)
        rows.append({"key": s.key, "waste_usd": m.waste_usd, "cost_usd": m.cost_usd,
                     "idle_usd": m.idle_usd, "fixable_usd": m.fixable_usd,
                     # unpriced groups rank among themselves by the same figure in GPU-hours
                     "waste_gpu_hours": m.waste_gpu_hours, "held_gpu_hours": m.held_gpu_hours,
                     "idle_gpu_hours": m.idle_gpu_hours,
                     "fixable_gpu_hours": m.fixable_gpu_hours})  # fmt: skip
    return [str(r["key"]) for r in sort_rows(rows, sort_by)]


@settings(max_examples=examples(150), deadline=None)
@given(
    reports(),
    st.sampled_from(SORT_BYS),
    st.integers(0, 45),
    st.one_of(st.none(), st.integers(0, 45)),
    st.sampled_from(["H100", "A100", None]),
)
def test_a_page_is_the_whole_report_sliced(
    groups: list[Summary], sort_by: str, offset: int, limit: int | None, model: str | None
) -> None:
    a = FixAssumptions(gpu_model=model)
    asked: list[str] = []

    def money(s: Summary) -> Money:
        asked.append(s.key)
        return money_of(s, a)

    page = page_of(groups, Page(sort_by, offset, limit), money)
    stop = None if limit is None else offset + limit
    assert [s.key for s in page] == full_order(groups, sort_by, a)[offset:stop]
    assert len(asked) == len(set(asked)) <= len(groups)


@settings(max_examples=examples(150), deadline=None)
@given(summaries("j"), st.sampled_from(SORT_BYS), st.sampled_from(["H100", "H200", None]))
def test_bounds_hold_the_exact_figure(s: Summary, sort_by: str, model: str | None) -> None:
    m = money_of(s, FixAssumptions(gpu_model=model))
    value = {"waste": m.waste_usd, "cost": m.cost_usd, "idle": m.idle_usd,
             "fixable": m.fixable_usd}[sort_by]  # fmt: skip
    if value is None:
        assert not s.priced
        return
    low, high = bounds(s, sort_by)
    assert low - 1e-9 * max(1.0, low) <= value <= high + 1e-9 * max(1.0, high)


def test_a_short_page_of_a_long_report_works_out_few_groups() -> None:
    """Most of a fleet's jobs have little waste: the first 10 of 1,000 by waste need the money
    of the few whose idle dollars alone could place them."""
    groups = []
    for i in range(1000):
        usage = Usage(
            covered_seconds=3600.0, idle_empty_seconds=float(i), compute_tensor_seconds=3600.0 - i
        )
        s = Summary(f"job-{i:04d}")
        s.add_line(Line(s.key, 0, 3600.0, usage, 6.88, False))
        groups.append(s)
    asked: list[str] = []

    def money(s: Summary) -> Money:
        asked.append(s.key)
        return money_of(s, FixAssumptions())

    page = page_of(groups, Page("waste", 0, 10), money)
    assert [s.key for s in page] == [f"job-{i:04d}" for i in range(999, 989, -1)]
    assert len(asked) < 50


@pytest.mark.parametrize(("offset", "limit"), [(-1, None), (0, -1)])
def test_a_page_refuses_negative_counts(offset: int, limit: int | None) -> None:
    with pytest.raises(ValueError, match="0 or more"):
        Page("waste", offset, limit)


@settings(max_examples=examples(100), deadline=None)
@given(reports())
def test_totals_a_field_at_a_time_equal_merging_one_by_one(groups: list[Summary]) -> None:
    merged = Summary("__total__")
    for s in groups:
        merged.merge(s)
    total = Summary.total_of("__total__", groups)
    for name in ("held_seconds", "cost_usd", "nodata_seconds", "nodata_usd", "unpriced_seconds"):
        assert getattr(total, name) == pytest.approx(getattr(merged, name), rel=1e-12, abs=1e-9)
    for name in USAGE_FIELDS:
        assert getattr(total.usage, name) == pytest.approx(
            getattr(merged.usage, name), rel=1e-12, abs=1e-6
        )
    assert total.cause_cost_usd == pytest.approx(merged.cause_cost_usd, rel=1e-12, abs=1e-9)
    assert (total.gpu_ids, total.job_ids) == (merged.gpu_ids, merged.job_ids)


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([0.0, 1.0, 5.0]) | st.floats(0, 1e4), share), max_size=60),
    st.integers(0, 30),
    st.integers(1, 30),
    st.integers(1, 80),
)
def test_a_walk_by_bounds_asks_in_growing_batches_and_finds_the_page(
    groups: list[tuple[float, float]], offset: int, limit: int, first_batch: int
) -> None:
    """Groups with upper bounds and a value at or under each: the walk's page is the groups
    sorted by value and sliced, its batches start at ``first_batch`` and double, and it asks
    for no batch once the page is decided."""
    uppers = {f"g{i:02d}": upper for i, (upper, _) in enumerate(groups)}
    values = {f"g{i:02d}": upper * s for i, (upper, s) in enumerate(groups)}
    page = Page("waste", offset, limit)
    if page.stop is None or page.stop >= len(uppers):
        with pytest.raises(ValueError, match="ends before the last"):
            page_keys(uppers, page, lambda keys: {}, first_batch=first_batch)
        return
    batches: list[list[str]] = []

    def ranks(keys: Sequence[str]) -> dict[str, RankKey]:
        batches.append(list(keys))
        return {k: rank(values[k], k) for k in keys}

    got = page_keys(uppers, page, ranks, first_batch=first_batch)
    want = sorted(values, key=lambda k: rank(values[k], k))[offset : page.stop]
    assert got == want
    sizes = [len(b) for b in batches]
    assert sizes[:-1] == [first_batch * 2**i for i in range(len(sizes) - 1)]
    asked = [k for b in batches for k in b]
    assert len(asked) == len(set(asked))
    by_upper = sorted(uppers, key=lambda k: -uppers[k])
    # Every batch but the first was asked for because the page was not decided before it.
    for b in batches[1:]:
        before = by_upper[: by_upper.index(b[0])]
        top = sorted((values[k] for k in before), reverse=True)[: page.stop]
        assert len(top) < page.stop or uppers[b[0]] >= top[-1] - 1e-9 * max(1.0, top[-1])
