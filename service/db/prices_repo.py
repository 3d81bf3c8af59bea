"""The stored price table (what ``PUT /api/v1/prices`` wrote)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, delete, insert, select

from service.costs.prices import PriceRow
from service.db.schema import gpus, prices


def load_prices(conn: Connection) -> list[PriceRow]:
    """The stored rows, oldest effective_from first."""
    rows = conn.execute(select(prices).order_by(prices.c.effective_from, prices.c.id))
    return [PriceRow(r.model_pattern, r.usd_per_gpu_hour, r.effective_from, r.note) for r in rows]


def replace_prices(conn: Connection, *, rows: Sequence[PriceRow]) -> None:
    """Replace the whole stored table with ``rows``."""
    conn.execute(delete(prices))
    if rows:
        conn.execute(
            insert(prices),
            [
                {
                    "model_pattern": r.model_pattern,
                    "usd_per_gpu_hour": r.usd_per_gpu_hour,
                    "effective_from": r.effective_from,
                    "note": r.note,
                }
                for r in rows
            ],
        )


def fleet_models(conn: Connection) -> list[str]:
    """The distinct GPU model names in the fleet."""
    return list(conn.execute(select(gpus.c.model).distinct()).scalars())
