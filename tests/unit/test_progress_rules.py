"""The progress counter's rules and summary (core/progress.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from service.core.progress import (
    Reading,
    check_next,
    gpu_seconds_per_unit,
    is_repeat,
    summarize,
    unit_of_work,
)
from service.errors import Conflict, ValidationFailed

T0 = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)


def _at(seconds: float, value: float, unit: str = "steps") -> Reading:
    return Reading(at=T0 + timedelta(seconds=seconds), unit=unit, value=value)  # type: ignore[arg-type]


def test_summary_of_readings() -> None:
    got = summarize([_at(0, 10), _at(30, 40), _at(60, 40)])
    assert got is not None
    assert (got.first_value, got.last_value, got.units_advanced) == (10, 40, 30)
    assert got.rate_per_second == 0.5
    assert got.last_advanced_at == T0 + timedelta(seconds=30)
    assert summarize([]) is None
    one = summarize([_at(0, 5)])
    assert one is not None and one.rate_per_second is None and one.last_advanced_at is None


def test_gpu_seconds_per_unit() -> None:
    summary = summarize([_at(0, 0), _at(100, 500)])
    assert gpu_seconds_per_unit(800.0, summary) == 1.6
    assert gpu_seconds_per_unit(800.0, None) is None
    assert gpu_seconds_per_unit(800.0, summarize([_at(0, 3), _at(9, 3)])) is None


@pytest.mark.parametrize(
    ("new", "error", "field"),
    [
        (_at(20, 9), Conflict, "value"),
        (_at(5, 11), Conflict, "at"),
        (_at(20, 11, "tokens"), Conflict, "unit"),
        (_at(20, float("nan")), ValidationFailed, "value"),
        (_at(20, -1), ValidationFailed, "value"),
        (_at(20, 11, "epochs"), ValidationFailed, "unit"),
    ],
)
def test_refusals_name_the_field(new: Reading, error: type[Exception], field: str) -> None:
    with pytest.raises(error, match=f"^{field}:"):
        check_next(new, _at(10, 10))


def test_equal_total_later_is_accepted_and_a_retry_is_a_repeat() -> None:
    check_next(_at(20, 10), _at(10, 10))
    assert is_repeat(_at(10, 10), _at(10, 10))
    assert not is_repeat(_at(20, 10), _at(10, 10))


def test_unit_of_work_in_words() -> None:
    work = unit_of_work(7200.0, summarize([_at(0, 0, "samples"), _at(60, 4800, "samples")]))
    assert (work.unit, work.gpu_seconds_per_unit) == ("sample", 1.5)
    assert work.text == "1.5 GPU-seconds per sample (4,800 samples in 2.00 GPU-h)"
    run = unit_of_work(7200.0, None)
    assert run.unit == "run" and run.gpu_seconds_per_unit is None
    assert "whole run" in run.text and "2.00 GPU-h" in run.text
