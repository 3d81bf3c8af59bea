"""The price of a GPU model: the longest matching pattern in effect wins, then the latest."""

from __future__ import annotations

from datetime import UTC, datetime

from service.costs.price_match import PriceRow, price_per_gpu_hour

JAN = datetime(2026, 1, 1, tzinfo=UTC)
JUN = datetime(2026, 6, 1, tzinfo=UTC)
NOW = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
H100 = "NVIDIA H100 80GB HBM3"


def test_no_matching_pattern_gives_none():
    assert price_per_gpu_hour(H100, [PriceRow("*A100*", 2.0, JAN)], NOW) is None


def test_longest_pattern_wins_over_a_newer_shorter_one():
    rows = [
        PriceRow("*", 1.0, JUN),
        PriceRow("*H100*", 4.0, JAN),
        PriceRow("*H100 80GB*", 4.5, JAN),
    ]
    assert price_per_gpu_hour(H100, rows, NOW) == 4.5


def test_latest_effective_row_of_a_pattern_wins():
    rows = [PriceRow("*H100*", 4.0, JAN), PriceRow("*H100*", 3.5, JUN)]
    assert price_per_gpu_hour(H100, rows, NOW) == 3.5
    assert price_per_gpu_hour(H100, list(reversed(rows)), NOW) == 3.5


def test_rows_not_yet_in_effect_are_ignored():
    rows = [PriceRow("*H100*", 4.0, JAN), PriceRow("*H100*", 9.0, datetime(2027, 1, 1, tzinfo=UTC))]
    assert price_per_gpu_hour(H100, rows, NOW) == 4.0
    assert price_per_gpu_hour(H100, rows, datetime(2025, 1, 1, tzinfo=UTC)) is None


def test_match_is_case_sensitive_shell_style():
    assert price_per_gpu_hour(H100, [PriceRow("*h100*", 4.0, JAN)], NOW) is None
    assert price_per_gpu_hour(H100, [PriceRow("NVIDIA H1?0 *", 4.0, JAN)], NOW) == 4.0
