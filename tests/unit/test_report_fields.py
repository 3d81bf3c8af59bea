"""The cost report's row fields are declared once: the pure summary, the response model and the
CSV columns agree."""

from __future__ import annotations

from service.api.routers.reports import CSV_COLUMNS
from service.api.schemas.costs import CostRowPublic
from service.core.diagnosis import CAUSE_NAMES
from service.costs.recommend import FixAssumptions
from service.costs.waste import Summary
from service.settings import Settings
from service.usecases.costing.cost_report import report_row

JOB_METADATA = {"user", "team", "project", "faults"}


def test_summary_row_has_exactly_the_response_models_figures():
    row = report_row(Summary("k"), Settings(), FixAssumptions())
    assert set(row) == set(CostRowPublic.model_fields) - JOB_METADATA


def test_csv_has_every_figure_and_cause_once():
    assert len(CSV_COLUMNS) == len(set(CSV_COLUMNS))
    figures = set(CostRowPublic.model_fields) - {"causes", "fixes", "faults"}
    per_cause = {f"{c}_{unit}" for c in CAUSE_NAMES for unit in ("seconds", "usd", "waste_usd")}
    extra = {"top_fix", "top_fix_saving_usd", "hardware_faults"}
    savings = ("realised_usd", "promised_usd")  # proven savings: appended at the end
    assert set(CSV_COLUMNS) == figures | per_cause | extra | set(savings)
    assert CSV_COLUMNS[0] == "key" and CSV_COLUMNS[-2:] == savings


def test_the_old_overlapping_names_are_gone_from_every_row_and_column():
    old = {"unused_cost_usd", "idle_cost_usd", "wasted_usd", "dominant_cause",
           "dominant_waste_cause", "fixes_saving_usd", "tags"}  # fmt: skip
    assert not old & set(CSV_COLUMNS)
    assert not old & set(CostRowPublic.model_fields)
    assert not old & set(report_row(Summary("k"), Settings(), FixAssumptions()))
