"""The money model on random jobs: cost splits without remainder into causes + nodata + lost,
waste = idle + fixable = the cause fixes' savings, never above the cost, and no fix saves more
than its cause's dollars."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.diagnosis import CAUSES, IDLE_CAUSES, Cause
from service.costs.integrals import CAUSE_FIELDS
from service.costs.money import FIXABLE_CAUSES, money_of, waste_share
from service.costs.recommend import FixAssumptions, cause_fixes
from service.costs.rightsizing import GpuUse, recommend_job
from service.costs.waste import Line, Summary, Usage
from tests.hypothesis_support import examples

CENT = 0.005
T0 = datetime(2026, 12, 1, tzinfo=UTC)

seconds = st.floats(min_value=0, max_value=7200, allow_nan=False, allow_infinity=False)
prices = st.one_of(st.none(), st.floats(min_value=0, max_value=40, allow_nan=False))
assumptions = st.builds(
    FixAssumptions,
    tensor_speedup=st.floats(min_value=1, max_value=16),
    memory_speedup=st.floats(min_value=1, max_value=4),
    starved_util=st.floats(min_value=0.05, max_value=0.95),
    launch_fill=st.floats(min_value=0.05, max_value=0.95),
    busy=st.floats(min_value=0.05, max_value=0.95),
)


@st.composite
def lines(draw: st.DrawFn) -> Line:
    """One line: random seconds per cause, a held time at least as long (the rest uncovered),
    a price or none, lost or not."""
    usage = Usage()
    for f in CAUSE_FIELDS:
        setattr(usage, f, draw(seconds))
    usage.covered_seconds = sum(getattr(usage, f) for f in CAUSE_FIELDS)
    usage.idle_seconds = usage.idle_empty_seconds + usage.idle_held_seconds
    usage.unused_seconds = draw(st.floats(min_value=0, max_value=1)) * usage.covered_seconds
    held = usage.covered_seconds + draw(seconds)
    return Line("j", draw(st.integers(0, 3)), held, usage, draw(prices), draw(st.booleans()))


def summary_of(ls: list[Line]) -> Summary:
    s = Summary("j")
    for line in ls:
        s.add_line(line)
    return s


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(lines(), min_size=1, max_size=6), assumptions)
def test_cost_splits_into_causes_nodata_and_lost_and_waste_is_at_most_the_cost(
    ls: list[Line], a: FixAssumptions
) -> None:
    s = summary_of(ls)
    m = money_of(s, a)
    if not s.priced:
        assert m.cost_usd is None and m.waste_usd is None and m.lost_usd is None
        return
    assert m.cost_usd is not None and m.waste_usd is not None
    assert m.nodata_usd is not None and m.lost_usd is not None
    parts = sum(s.cause_usd(c) for c in CAUSES) + m.nodata_usd + m.lost_usd
    assert abs(m.cost_usd - parts) <= 1e-9 * max(1.0, m.cost_usd)
    held_usd = sum((ln.usd_per_gpu_hour or 0.0) * ln.held_seconds / 3600 for ln in ls)
    assert abs(m.cost_usd - held_usd) <= 1e-9 * max(1.0, held_usd)  # every held second
    assert 0 <= m.waste_usd <= m.cost_usd + 1e-9
    assert m.idle_usd is not None and m.fixable_usd is not None
    assert abs(m.waste_usd - (m.idle_usd + m.fixable_usd)) <= 1e-9 * max(1.0, m.waste_usd)
    assert abs(m.idle_usd - sum(s.cause_usd(c) for c in IDLE_CAUSES)) <= 1e-9 * max(1, m.idle_usd)
    # nodata and lost are never waste: the waste is within the covered dollars.
    assert m.waste_usd <= sum(s.cause_usd(c) for c in CAUSES) + 1e-9


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(lines(), min_size=1, max_size=6), assumptions)
def test_waste_is_the_sum_of_the_cause_fixes_savings_none_above_its_cause(
    ls: list[Line], a: FixAssumptions
) -> None:
    s = summary_of(ls)
    m = money_of(s, a)
    fixes = cause_fixes(s, a)
    for f in fixes:
        assert f.cause is not None
        cause = Cause[f.cause.upper()]
        if s.priced:
            assert f.saving_usd is not None and f.usd is not None
            assert 0 <= f.saving_usd <= s.cause_usd(cause) + 1e-9
            assert abs(f.saving_usd - s.cause_usd(cause) * waste_share(cause, a, s.usage)) <= 1e-9
    if s.priced:
        assert m.waste_usd is not None
        saved = sum(f.saving_usd or 0.0 for f in fixes)
        assert abs(saved - m.waste_usd) <= 1e-9 * max(1.0, m.waste_usd)
        # The fixable part is exactly the inefficient causes' fixes.
        fixable = sum(
            f.saving_usd or 0.0 for f in fixes if Cause[str(f.cause).upper()] in FIXABLE_CAUSES
        )
        assert m.fixable_usd is not None and abs(fixable - m.fixable_usd) <= 1e-9 * max(1, fixable)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(lines(), min_size=2, max_size=4), assumptions)
def test_a_jobs_fixes_with_fewer_gpus_save_its_waste_and_none_above_its_dollars(
    ls: list[Line], a: FixAssumptions
) -> None:
    """Per GPU summaries and the job's: the fewer-GPUs fix takes the spare GPUs' idle dollars
    from the idle fixes, so the cause and fewer-GPU fixes still add up to the waste."""
    by_gpu: dict[int, list[Line]] = {}
    for line in ls:
        by_gpu.setdefault(line.gpu_id, []).append(line)
    total = summary_of(ls)
    uses = [
        GpuUse(f"GPU-{g}", "NVIDIA H100 80GB HBM3", 80e9, None, summary_of(group))
        for g, group in sorted(by_gpu.items())
    ]
    fixes = recommend_job(total, uses, a, when=T0 + timedelta(hours=1))
    m = money_of(total, a)
    assert not [f for f in fixes if f.kind == "mig"]  # no peak memory known: no slice offered
    if total.priced:
        assert m.waste_usd is not None and m.cost_usd is not None
        saved = sum(f.saving_usd or 0.0 for f in fixes)
        assert abs(saved - m.waste_usd) <= CENT
        assert saved <= m.cost_usd + 1e-9
        for f in fixes:
            assert f.usd is not None and f.saving_usd is not None
            assert f.saving_usd <= f.usd + 1e-9
