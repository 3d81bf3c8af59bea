"""``/api/v1/prices``: the GPU price table (USD per GPU-hour by model pattern)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from service.api.deps import Admin, Ctx, ReadConn, Reader
from service.api.schemas.costs import PriceIn, PricePublic
from service.costs.default_prices import KNOWN_MODEL_NAMES
from service.costs.prices import PriceRow, matches
from service.db import changes_repo, prices_repo
from service.usecases import price_table

router = APIRouter(prefix="/prices", tags=["prices"])


def _public(table: price_table.PriceTable) -> list[PricePublic]:
    return [
        PricePublic(
            model_pattern=r.model_pattern,
            usd_per_gpu_hour=r.usd_per_gpu_hour,
            effective_from=r.effective_from,
            note=r.note,
            source=table.source,
        )
        for r in table.rows
    ]


@router.get("", response_model=list[PricePublic])
def get_prices(ctx: Ctx, conn: ReadConn, _: Reader) -> list[PricePublic]:
    """The price table in force: the one PUT here, else the config file's, else the default."""
    return _public(price_table.effective_prices(conn, ctx.settings))


@router.put("", response_model=list[PricePublic])
def put_prices(body: list[PriceIn], ctx: Ctx, token: Admin) -> list[PricePublic]:
    """Replace the whole price table; an empty list falls back to the config file or default."""
    # Commit before answering, so a client that reads right after sees the new table.
    with ctx.engine.begin() as conn:
        models = [*prices_repo.fleet_models(conn), *KNOWN_MODEL_NAMES]
        seen: set[tuple[str, object]] = set()
        for i, p in enumerate(body):
            if not any(matches(p.model_pattern, m) for m in models):
                raise HTTPException(
                    status.HTTP_422_UNPROCESSABLE_CONTENT,
                    detail=[
                        {
                            "loc": ["body", i, "model_pattern"],
                            "msg": f"pattern {p.model_pattern!r} matches no GPU model in the fleet "
                            "and no known NVIDIA model name",
                            "type": "value_error",
                        }
                    ],
                )
            key = (p.model_pattern, p.effective_from)
            if key in seen:
                raise HTTPException(
                    status.HTTP_422_UNPROCESSABLE_CONTENT,
                    detail=[
                        {
                            "loc": ["body", i],
                            "msg": f"duplicate row for {p.model_pattern!r} effective "
                            f"{p.effective_from.isoformat()}",
                            "type": "value_error",
                        }
                    ],
                )
            seen.add(key)
        rows = [
            PriceRow(p.model_pattern, p.usd_per_gpu_hour, p.effective_from, p.note) for p in body
        ]
        prices_repo.replace_prices(conn, rows=rows)
        changes_repo.record(conn, actor=token.actor, kind="prices", name="price table",
                            action="update", now=ctx.clock())  # fmt: skip
        return _public(price_table.effective_prices(conn, ctx.settings))
