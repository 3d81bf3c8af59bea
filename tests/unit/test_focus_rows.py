"""FOCUS rows from cost report rows (pure): cents that add up, periods, resources and SKUs."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from service.costs.focus import COLUMNS, ReportDay, billing_period, focus_rows, running_cents
from service.usecases.costing.focus_report import day_bounds

DAY = datetime(2026, 12, 31, tzinfo=UTC)


def test_thirds_of_a_dollar_add_up_to_the_dollar() -> None:
    # Each rounded alone they would make $0.99.
    assert running_cents([1 / 3] * 3) == [Decimal("0.33"), Decimal("0.34"), Decimal("0.33")]
    assert running_cents([None, 0.004, 0.004]) == [
        Decimal("0.00"),
        Decimal("0.00"),
        Decimal("0.01"),
    ]


@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), max_size=50))
def test_cents_add_up_to_the_exact_total_and_no_row_moves_over_a_cent(values: list[float]) -> None:
    out = running_cents(values)
    exact = sum((Decimal(repr(v)) for v in values), Decimal(0))
    assert sum(out, Decimal(0)) == exact.quantize(Decimal("0.01"))
    assert all(
        abs(c - Decimal(repr(v))) <= Decimal("0.01") for c, v in zip(out, values, strict=True)
    )


def test_the_billing_period_is_the_calendar_month() -> None:
    assert billing_period(datetime(2026, 12, 31, 23, 59, tzinfo=UTC)) == (
        datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)
    )  # fmt: skip
    assert billing_period(datetime(2026, 2, 14, tzinfo=UTC))[1] == datetime(2026, 3, 1, tzinfo=UTC)


def test_a_window_is_cut_at_utc_midnights() -> None:
    start, end = datetime(2026, 12, 30, 22, tzinfo=UTC), datetime(2027, 1, 1, 3, tzinfo=UTC)
    assert day_bounds(start, end) == [
        (start, DAY), (DAY, datetime(2027, 1, 1, tzinfo=UTC)), (datetime(2027, 1, 1, tzinfo=UTC), end)
    ]  # fmt: skip


def row(key: str, seconds: float, cost: float | None, **extra: Any) -> dict[str, Any]:
    return {"key": key, "held_seconds": seconds, "cost_usd": cost, "waste_usd": 0.0,
            "idle_usd": 0.0, "fixable_usd": 0.0, "gpus": 1, "unpriced_seconds": 0.0,
            "gpu_models": ["H100"], **extra}  # fmt: skip


def cells(rows: list[list[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(COLUMNS, r, strict=True)) for r in rows]


def test_resources_skus_and_unpriced_time() -> None:
    day = ReportDay(DAY, datetime(2027, 1, 1, tzinfo=UTC), [
        row("slurm:1", 7200, 8.0, gpu_models=["A100", "H100"], user="ann"),
        row("__unallocated__", 1800, 2.0),
        row("slurm:2", 0, 0.0),  # held nothing that day: no charge
        row("slurm:3", 3600, None, unpriced_seconds=3600),
    ])  # fmt: skip
    job, idle, unpriced = cells(focus_rows([day], group_by="job"))
    assert (job["ResourceId"], job["SkuId"], job["Tags"]) == ("slurm:1", "mixed", '{"user":"ann"}')
    assert job["ListUnitPrice"] == Decimal("4.000000") and job["ConsumedQuantity"] == Decimal(2)
    assert (idle["ResourceId"], idle["ResourceType"], idle["SkuId"]) == (None, None, "H100")
    assert unpriced["BilledCost"] == Decimal(0) and unpriced["ListUnitPrice"] is None
    assert unpriced["x_UnpricedGpuHours"] == Decimal(1)
    (gpu,) = cells(focus_rows([ReportDay(DAY, DAY, [row("GPU-a0", 60, 0.1)])], group_by="gpu"))
    assert (gpu["ResourceType"], gpu["ChargePeriodEnd"]) == ("GPU", "2026-12-31T00:00:00Z")
