"""``/api/v1/reports/cost``: what GPUs cost and how much of that was waste (JSON, CSV)."""

from __future__ import annotations

import csv
import io
import string
from typing import Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Query, Response
from sqlalchemy import Connection

from service.api import query
from service.api.deps import Ctx, Expensive, ReadConn, Scope
from service.api.schemas.costs import CostReportPublic, CostRowPublic
from service.context import ServiceContext
from service.core.diagnosis import CAUSE_NAMES
from service.costs import focus
from service.costs.money import SORT_BYS
from service.costs.waste import GROUP_BYS
from service.usecases import savings_columns
from service.usecases.costing import cost_report as cost_usecase
from service.usecases.costing import focus_report

router = APIRouter(prefix="/reports", tags=["reports"])

# The response model's fields in its order, with the per-cause figures flattened at the end
# (idle_held_seconds is both a waste figure and a cause's seconds: one column).
CSV_COLUMNS: tuple[str, ...] = tuple(
    dict.fromkeys(
        [
            *(
                name
                for name in CostRowPublic.model_fields
                if name not in ("causes", "fixes", "faults")
            ),
            *(
                f"{cause}_{unit}"
                for cause in CAUSE_NAMES
                for unit in ("seconds", "usd", "waste_usd")
            ),
            "top_fix",
            "top_fix_saving_usd",
            "hardware_faults",
            # Proven savings (docs/savings.md): appended, so every earlier column stays put.
            "realised_usd",
            "promised_usd",
        ]
    )
)
# Columns that describe a job, kept only when each row is one.
_JOB_COLUMNS = frozenset({"user", "team", "project", "hardware_faults"})


# OWASP's CSV injection guidance: a text cell starting with one of these is read as a formula
# by spreadsheets; a leading apostrophe makes it text. Numbers are written as they are.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# Header values are ASCII: everything else (and %) is percent-encoded UTF-8, as RFC 8187.
_HEADER_SAFE = "".join(c for c in string.printable[:95] if c != "%")


def csv_cell(value: Any) -> Any:
    """One CSV cell: None empty, a list as its items joined by "; ", text that could start a
    formula quoted."""
    if value is None:
        return ""
    if isinstance(value, list):
        value = "; ".join(str(v) for v in value)
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def fault_text(f: dict[str, Any]) -> str:
    """A hardware fault in one cell: ``node GPU index XID code at`` or ``... lost at``."""
    at = f["at"].isoformat() if hasattr(f["at"], "isoformat") else str(f["at"])
    what = f"XID {f['xid']}" if f["kind"] == "xid" else "lost"
    return f"{f['node']} GPU {f['gpu_index']} {what} at {at}"


def header_text(text: str) -> str:
    """``text`` as an HTTP header value: ASCII, with other characters percent-encoded UTF-8."""
    return quote(text, safe=_HEADER_SAFE)


def to_csv(data: dict[str, Any]) -> str:
    """The report as CSV: one line per group, then a ``__total__`` line; empty cell = null."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")  # RFC 4180: a bare CR in a cell is quoted too
    # Job metadata columns only make sense when each row is a job.
    columns = (
        CSV_COLUMNS
        if data["group_by"] == "job"
        else tuple(c for c in CSV_COLUMNS if c not in _JOB_COLUMNS)
    )
    w.writerow([data["group_by"], *columns[1:]])
    for row in [*data["rows"], data["totals"]]:
        flat = dict(row)
        for name, figures in (row.get("causes") or {}).items():
            flat[f"{name}_seconds"] = figures["seconds"]
            flat[f"{name}_usd"] = figures["usd"]
            flat[f"{name}_waste_usd"] = figures["waste_usd"]
        fixes = row.get("fixes") or []
        if fixes:
            flat["top_fix"] = fixes[0]["cause"] or fixes[0]["kind"]
            flat["top_fix_saving_usd"] = fixes[0]["saving_usd"]
        flat["hardware_faults"] = [fault_text(f) for f in row.get("faults") or []]
        w.writerow([csv_cell(flat.get(c)) for c in columns])
    return buf.getvalue()


@router.get("/cost", response_model=CostReportPublic, dependencies=[Expensive])
def cost_report(
    ctx: Ctx,
    conn: ReadConn,
    scope: Scope,
    start: str | None = Query(None, description=f"{query.TIME_HELP}; default end - 7d"),
    end: str | None = Query(None, description=f"{query.TIME_HELP}; default now"),
    since: str | None = Query(None, description=query.SINCE_HELP),
    group_by: str = Query(
        "job",
        description=f"one of {', '.join(GROUP_BYS)}, or label:<key> (any job label, e.g. "
        "label:app.kubernetes.io/name; jobs without it in __unlabelled__)",
    ),
    format: Literal["json", "csv", "focus"] = Query(
        "json",
        description="focus: FOCUS 1.0 CSV, one charge per job (or GPU) per UTC day, every row "
        "(cause, sort, limit and offset do not apply; docs/costs.md#focus-export)",
    ),
    user: str | None = None,
    team: str | None = None,
    cause: str | None = Query(None, description="only the groups whose top cause is this"),
    sort: str = Query("waste", description=f"largest first by one of {', '.join(SORT_BYS)}"),
    limit: int | None = Query(
        None, ge=0, description="at most this many rows (default all); totals cover every row"
    ),
    offset: int = Query(0, ge=0, description="rows to skip before the first one returned"),
) -> Any:
    """Cost and waste (idle + fixable) per group over [start, end), largest waste first; a
    person sees only their own and their teams' jobs."""
    now = ctx.clock()
    start_at, end_at = query.window(
        start=start, end=end, since=since, now=now, default_seconds=7 * 86400
    )
    if format == "focus":
        request = cost_usecase.ReportRequest(start_at, end_at, now, group_by, user, team, scope)
        return _focus(ctx, conn, request)
    data = query.query_errors(cost_usecase.cost_report)(
        conn,
        settings=ctx.settings,
        start=start_at,
        end=end_at,
        now=now,
        group_by=group_by,
        user=user,
        team=team,
        cause=cause,
        sort_by=sort,
        limit=limit,
        offset=offset,
        scope=scope,
    )
    savings_columns.add_savings(
        conn, data, start=start_at, end=end_at, user=user, team=team, scope=scope
    )
    if format == "csv":
        headers = {"Content-Disposition": f'attachment; filename="gpuwarden-cost-{group_by}.csv"'}
        if data["warnings"]:
            headers["X-GPUWarden-Warnings"] = header_text(" | ".join(data["warnings"]))
        return Response(to_csv(data), media_type="text/csv; charset=utf-8", headers=headers)
    return data


def to_focus_csv(rows: list[list[Any]]) -> str:
    """FOCUS rows as CSV under the FOCUS column names; empty cell = null."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(focus.COLUMNS)
    w.writerows([csv_cell(v) for v in row] for row in rows)
    return buf.getvalue()


def _focus(ctx: ServiceContext, conn: Connection, request: cost_usecase.ReportRequest) -> Response:
    """The cost report as a FOCUS CSV download."""
    days = query.query_errors(focus_report.report_days)(
        conn, settings=ctx.settings, request=request
    )
    group_by = request.group_by
    body = to_focus_csv(focus.focus_rows(days, group_by=group_by))
    headers = {"Content-Disposition": f'attachment; filename="gpuwarden-focus-{group_by}.csv"'}
    return Response(body, media_type="text/csv; charset=utf-8", headers=headers)
