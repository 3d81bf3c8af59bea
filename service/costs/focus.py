"""The cost report as FOCUS 1.0 rows (the FinOps Foundation's cost and usage format): one
``Usage`` charge per report row (a job or a GPU) per UTC day, GPU-hours as the consumed
quantity, waste and its cause as ``x_`` columns.

Pure: each day's report rows in, rows of cells out. Dollars are decimal to the cent, each
column rounded along its running sum, so a column adds up to its unrounded sum to the cent.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from service.costs.waste import UNALLOCATED

# Who runs the GPUs is who provides, publishes and invoices them: the fleet itself.
PROVIDER = "GPU Warden"
CURRENCY = "USD"  # the money model's prices are USD per GPU-hour
CONSUMED_UNIT = "GPU-Hours"
# The spec's columns (FOCUS 1.0), in its alphabetical order, then ours.
SPEC_COLUMNS: tuple[str, ...] = (
    "AvailabilityZone", "BilledCost", "BillingAccountId", "BillingAccountName",
    "BillingCurrency", "BillingPeriodEnd", "BillingPeriodStart", "ChargeCategory",
    "ChargeClass", "ChargeDescription", "ChargeFrequency", "ChargePeriodEnd",
    "ChargePeriodStart", "CommitmentDiscountCategory", "CommitmentDiscountId",
    "CommitmentDiscountName", "CommitmentDiscountStatus", "CommitmentDiscountType",
    "ConsumedQuantity", "ConsumedUnit", "ContractedCost", "ContractedUnitPrice", "EffectiveCost",
    "InvoiceIssuerName", "ListCost", "ListUnitPrice", "PricingCategory", "PricingQuantity",
    "PricingUnit", "ProviderName", "PublisherName", "RegionId", "RegionName", "ResourceId",
    "ResourceName", "ResourceType", "ServiceCategory", "ServiceName", "SkuId", "SkuPriceId",
    "SubAccountId", "SubAccountName", "Tags",
)  # fmt: skip
EXTRA_COLUMNS: tuple[str, ...] = (
    "x_WasteCost", "x_IdleCost", "x_FixableCost", "x_TopWasteCause", "x_SmActiveAvg",
    "x_GpuCount", "x_UnpricedGpuHours",
)  # fmt: skip
COLUMNS = SPEC_COLUMNS + EXTRA_COLUMNS
# Columns of dollars, each rounded to the cent along its own running sum.
_MONEY = {"BilledCost": "cost_usd", "x_WasteCost": "waste_usd", "x_IdleCost": "idle_usd",
          "x_FixableCost": "fixable_usd"}  # fmt: skip
_CENT = Decimal("0.01")
_UNIT_PRICE = Decimal("0.000001")
_QUANTITY = Decimal("0.000001")


@dataclass(frozen=True, slots=True)
class ReportDay:
    """One UTC day (or the part of it the window covers) of a cost report: its rows."""

    start: datetime
    end: datetime
    rows: Sequence[dict[str, Any]]


def iso(t: datetime) -> str:
    """An instant as FOCUS dates it: ISO 8601 in UTC with a Z, to the second."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def billing_period(t: datetime) -> tuple[datetime, datetime]:
    """The calendar month (UTC) holding ``t``: [its first day, the next month's first day)."""
    t = t.astimezone(UTC)
    start = datetime(t.year, t.month, 1, tzinfo=UTC)
    end = datetime(t.year + t.month // 12, t.month % 12 + 1, 1, tzinfo=UTC)
    return start, end


def running_cents(values: Iterable[float | None]) -> list[Decimal]:
    """Each value to the cent such that every prefix sums to its unrounded sum rounded (None
    counts as 0): the column's total is its exact total to the cent, no row off by a cent."""
    out: list[Decimal] = []
    exact = Decimal(0)
    shown = Decimal(0)
    for v in values:
        exact += Decimal(repr(v or 0.0))
        cents = exact.quantize(_CENT, rounding=ROUND_HALF_EVEN)
        out.append(cents - shown)
        shown = cents
    return out


def _tags(row: dict[str, Any]) -> str:
    """A job's owner fields as the FOCUS Tags JSON object (only those set)."""
    tags = {k: row[k] for k in ("user", "team", "project") if row.get(k)}
    return json.dumps(tags, sort_keys=True, separators=(",", ":"))


def _resource(row: dict[str, Any], group_by: str) -> tuple[str | None, str | None, str]:
    """The row's ResourceId, ResourceType and ChargeDescription."""
    key = str(row["key"])
    if key == UNALLOCATED:
        return None, None, "GPU time no job held"
    if group_by == "gpu":
        return key, "GPU", f"GPU time of GPU {key}"
    return key, "GPU job", f"GPU time of job {key}"


def _sku(row: dict[str, Any]) -> str:
    """The row's GPU model as its SKU ("mixed" when it spans several models)."""
    models = row.get("gpu_models") or []
    return str(models[0]) if len(models) == 1 else "mixed"


def _unit_price(row: dict[str, Any], hours: float) -> Decimal | None:
    """USD per GPU-hour over the row (the mean where its GPUs' prices differ)."""
    if row.get("cost_usd") is None or hours <= 0:
        return None
    return Decimal(repr(row["cost_usd"] / hours)).quantize(_UNIT_PRICE)


def _charge(day: ReportDay, row: dict[str, Any], group_by: str) -> dict[str, Any]:
    """One row's FOCUS cells, the dollar columns left to ``focus_rows``."""
    hours = float(row["held_seconds"]) / 3600
    resource_id, resource_type, description = _resource(row, group_by)
    period_start, period_end = billing_period(day.start)
    quantity = Decimal(repr(hours)).quantize(_QUANTITY)
    price = _unit_price(row, hours)
    sku = _sku(row)
    efficiency = row.get("efficiency")
    return {
        "BillingAccountId": PROVIDER, "BillingAccountName": PROVIDER,
        "BillingCurrency": CURRENCY,
        "BillingPeriodStart": iso(period_start), "BillingPeriodEnd": iso(period_end),
        "ChargeCategory": "Usage", "ChargeDescription": description,
        "ChargeFrequency": "Usage-Based",
        "ChargePeriodStart": iso(day.start), "ChargePeriodEnd": iso(day.end),
        "ConsumedQuantity": quantity, "ConsumedUnit": CONSUMED_UNIT,
        "PricingQuantity": quantity, "PricingUnit": CONSUMED_UNIT,
        "ListUnitPrice": price, "ContractedUnitPrice": price, "PricingCategory": "Standard",
        "InvoiceIssuerName": PROVIDER, "ProviderName": PROVIDER, "PublisherName": PROVIDER,
        "ResourceId": resource_id, "ResourceName": resource_id, "ResourceType": resource_type,
        "ServiceCategory": "Compute", "ServiceName": "GPU time",
        "SkuId": sku, "SkuPriceId": f"{sku} per GPU-hour",
        "Tags": _tags(row),
        "x_TopWasteCause": row.get("top_cause"),
        "x_SmActiveAvg": None if efficiency is None else round(float(efficiency), 4),
        "x_GpuCount": row.get("gpus"),
        "x_UnpricedGpuHours": Decimal(repr(float(row.get("unpriced_seconds") or 0) / 3600))
        .quantize(_QUANTITY),
    }  # fmt: skip


def focus_rows(days: Sequence[ReportDay], *, group_by: str) -> list[list[Any]]:
    """Every day's report rows as FOCUS rows, cells in ``COLUMNS`` order (None is empty); rows
    that held no GPU time are left out. BilledCost = EffectiveCost = ListCost = ContractedCost:
    the price is the fleet's own, with no discount or commitment."""
    pairs = [(d, r) for d in days for r in d.rows if float(r["held_seconds"]) > 0]
    charges = [_charge(d, r, group_by) for d, r in pairs]
    for column, figure in _MONEY.items():
        cents = running_cents(r.get(figure) for _, r in pairs)
        for charge, value in zip(charges, cents, strict=True):
            charge[column] = value
    for charge in charges:
        for same in ("EffectiveCost", "ListCost", "ContractedCost"):
            charge[same] = charge["BilledCost"]
    return [[charge.get(c) for c in COLUMNS] for charge in charges]
