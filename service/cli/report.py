"""``gpuwarden report cost``: the cost report from the central API as a table, CSV or JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from rich.console import Console

from service.cli.http import api_get
from service.cli.tables import Column, fit_table
from service.clientsettings import ClientSettings
from service.clock import utc_now
from service.core.diagnosis import WASTE_CAUSES
from service.core.querytime import INSTANT_FORMS, time_range
from service.costs.job_groups import LABEL_PREFIX, label_key_problem
from service.costs.money import SORT_BYS
from service.costs.waste import GROUP_BYS
from service.errors import ValidationFailed
from service.local.run import resolve_service


def add_report_parser(sub: Any) -> None:
    """Add ``report cost`` to the ``gpuwarden`` sub-commands."""
    p = sub.add_parser("report", help="cost and waste reports from the central service")
    rsub = p.add_subparsers(dest="report_command", required=True, metavar="REPORT")
    c = rsub.add_parser(
        "cost",
        help="what GPUs cost and how much of it was waste (idle + fixable), worst first",
        description="Asks the central service (GET /api/v1/reports/cost) with a reader token.",
    )
    c.add_argument("--url", dest="central_url", help="central service URL (GPUWARDEN_CENTRAL_URL)")
    c.add_argument("--token", dest="api_token", help="reader token (GPUWARDEN_API_TOKEN)")
    c.add_argument("--since", default="7d", help="report the last DURATION (default 7d)")
    c.add_argument("--start", help=f"instead of --since: {INSTANT_FORMS}")
    c.add_argument("--end", help="the same forms as --start (default now)")
    c.add_argument(
        "--group-by",
        default="job",
        type=group_by_arg,
        metavar="GROUP",
        help=f"one of {', '.join(GROUP_BYS)} or label:KEY (e.g. label:app.kubernetes.io/name); "
        "default job",
    )
    c.add_argument(
        "--cause",
        choices=[cause.label for cause in WASTE_CAUSES],
        metavar="NAME",
        help="only the groups whose top cause is NAME (idle_empty, launch_bound, ...)",
    )
    c.add_argument(
        "--sort", default="waste", choices=SORT_BYS, help="largest first by these dollars"
    )
    c.add_argument("--user", dest="filter_user", help="only this user's jobs")
    c.add_argument("--team", dest="filter_team", help="only this team's jobs")
    c.add_argument("--limit", type=int, default=20, help="rows in the table (default 20)")
    fmt = c.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="print CSV (every row)")
    fmt.add_argument("--json", action="store_true", help="print the JSON report")
    fmt.add_argument(
        "--focus",
        action="store_true",
        help="print FOCUS 1.0 CSV (FinOps cost and usage rows per job or GPU per day)",
    )
    c.set_defaults(handler=cmd_report_cost)


def group_by_arg(text: str) -> str:
    """``--group-by``: a grouping of the report, or ``label:<key>``."""
    if text in GROUP_BYS:
        return text
    problem = label_key_problem(text) if text.startswith(LABEL_PREFIX) else "unknown"
    if problem is not None:
        raise argparse.ArgumentTypeError(
            f"{problem}: {text!r}; one of {', '.join(GROUP_BYS)} or label:KEY"
        )
    return text


def terminal_console() -> Console:
    """A console as wide as the terminal (or $COLUMNS), else 200 columns when output is piped."""
    # Piped output has no terminal width; do not squeeze job ids into ellipses there.
    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return Console()
    return Console(width=200)


def money(v: float | None) -> str:
    """Dollars as the tables show them ($1,234.56), n/a when unpriced."""
    return "n/a" if v is None else f"${v:,.2f}"


def gpu_hours(seconds: float) -> str:
    """GPU-hours with enough digits that a small figure does not read as nothing."""
    hours = seconds / 3600
    if hours == 0:
        return "0"
    if hours < 0.01:
        return "<0.01"
    return f"{hours:,.2f}" if hours < 10 else f"{hours:,.1f}"


def _pct(part: float, whole: float) -> str:
    return "" if whole <= 0 else f"{100 * part / whole:.0f}%"


def short_time(text: str) -> str:
    """An RFC 3339 time as 2026-12-03 07:22Z (minutes are enough in a title)."""
    return text[:16].replace("T", " ") + "Z" if len(text) >= 16 else text


def _table_columns(group_by: str, hours: bool = False) -> list[Column]:
    """The report table's columns, first to last; ``drop`` orders which go first when narrow
    (with ``hours``, a site without prices, the money columns are GPU-hours)."""
    columns = [
        Column(group_by, whole=True, fold_last=True),
        Column("GPU-h", "right", drop=4),
        Column("cost", "right", whole=True),
        Column("waste", "right", whole=True),
        Column("waste GPU-h", "right", drop=4),
        Column("idle", "right", whole=True, drop=3),
        Column("fixable", "right", whole=True, drop=2),
        Column("lost", "right", drop=7),
        Column("efficiency", "right", drop=5),
        Column("no data", "right", drop=1),
    ]
    columns.append(Column("top cause", wrap=True))
    columns.append(Column("top fix saves", wrap=True, drop=8))
    if group_by == "job":
        columns.append(Column("user", drop=6))
    return columns


def _table_cells(r: dict[str, Any], group_by: str, hours: bool = False) -> list[str]:
    """One report row's cells, in the order of ``_table_columns``: dollars, or GPU-hours with
    ``hours`` (a site without prices)."""
    eff = r["efficiency"]

    def amount(usd: str, gpu_h: float) -> str:
        return f"{gpu_hours(gpu_h * 3600)} GPU-h" if hours else money(r[usd])

    row = [
        str(r["key"]),
        gpu_hours(r["held_seconds"]),
        amount("cost_usd", r["held_seconds"] / 3600),
        amount("waste_usd", r.get("waste_gpu_hours", 0.0)),
        gpu_hours(r.get("waste_gpu_hours", 0.0) * 3600),
        amount("idle_usd", r.get("idle_gpu_hours", 0.0)),
        amount("fixable_usd", r.get("fixable_gpu_hours", 0.0)),
        amount("lost_usd", r.get("lost_seconds", 0.0) / 3600) if r.get("lost_seconds") else "",
        "" if eff is None else f"{eff:.0%}",
        _pct(r["nodata_seconds"], r["held_seconds"]),
        top_cause(r),
        top_fix(r),
    ]
    if group_by == "job":
        row.append(r.get("user") or "")
    return row


PRICE_SOURCE_WORDS = {
    "default": "DEFAULT prices",
    "opencost": "prices from OpenCost",
    "api": "your prices",
    "config": "your prices",
}


def _table_caption(data: dict[str, Any]) -> str:
    """What cost and waste mean, which prices priced them and how shared GPUs were split."""
    prices = PRICE_SOURCE_WORDS.get(str(data.get("price_source")), "your prices")
    if data.get("unit") == "gpu_hours":
        return (
            "no prices: figures are GPU-hours; cost = held time; waste = idle (nothing ran) + "
            "fixable (the causes' GPU-hours x their fixes' saving fraction, estimated)"
            + (f"; shared GPUs split by {rule}" if (rule := data.get("split_rule")) else "")
        )
    return (
        "cost = price x held time; waste = idle (nothing ran) + fixable (the causes' "
        f"dollars x their fixes' saving fraction, estimated); {prices}"
        + (f"; shared GPUs split by {rule}" if (rule := data.get("split_rule")) else "")
    )


def _fault_notes(rows: list[dict[str, Any]]) -> list[str]:
    """One line per hardware fault of any row, with the dollars held lost where a GPU was."""
    notes = []
    for row in rows:
        for f in row.get("faults") or []:
            what = f"hardware XID {f['xid']}" if f["kind"] == "xid" else "fell off the bus"
            notes.append(
                f"HARDWARE FAULT {row['key']}: {f['node']} GPU {f['gpu_index']} {what} at "
                f"{short_time(f['at'])}"
                + (f", held lost {money(f.get('lost_usd'))}" if f["kind"] == "lost" else "")
            )
    return notes


def _totals_notes(totals: dict[str, Any], hours: bool = False) -> list[str]:
    """The totals in words: time by cause, cost and waste, and the fixes that save most."""
    notes = []
    breakdown = cause_breakdown(totals)
    if breakdown:
        notes.append(f"time by cause: {breakdown}")
    notes.append(waste_line(totals, hours=hours))
    fixes = totals.get("fixes") or []
    if fixes:
        notes.append(
            "top fixes: "
            + "; ".join(f"{f['cause']} {money(f['saving_usd'])} ({f['action']})" for f in fixes)
        )
    # Proven savings only where some were booked: a report without any reads as before.
    if totals.get("realised_usd") or totals.get("promised_usd"):
        notes.append(
            f"proven savings: fixes applied saved {money(totals['realised_usd'])}, measured "
            f"against the runs before them ({money(totals['promised_usd'])} promised; --csv "
            "has them per row)"
        )
    return notes


def render_table(data: dict[str, Any], *, limit: int, console: Console) -> None:
    """Print the report as a table in the service's order (largest waste first, or --sort),
    with the totals last."""
    group_by = data["group_by"]
    rows = data["rows"]
    hours = data.get("unit") == "gpu_hours"
    shown = [*rows[:limit], {**data["totals"], "key": "TOTAL"}]
    table, dropped = fit_table(
        _table_columns(group_by, hours),
        [_table_cells(r, group_by, hours) for r in shown],
        width=console.width,
        title=f"GPU cost by {group_by}, {short_time(data['start'])} to {short_time(data['end'])}",
        caption=_table_caption(data),
        section_before_last=True,
    )
    console.print(table)
    if not rows:
        console.print("no GPU time in this window; the warnings below say why")
    if dropped:
        console.print(
            f"left out to fit {console.width} columns: {', '.join(dropped)} (--csv has all)"
        )
    count = int(data.get("row_count", len(rows)))
    if count > limit:
        console.print(f"{count - limit} more rows; use --limit, --csv or --json for all")
    for note in _fault_notes(rows) + _totals_notes(data["totals"], hours):
        console.print(note)


def waste_line(row: dict[str, Any], *, hours: bool = False) -> str:
    """The row's cost and waste in words: "cost $4.00 (1.00 GPU-h; no data $0.67, lost $0.00);
    waste $3.19 (0.80 GPU-h) = idle $2.00 + fixable $1.19 (estimated)", or in GPU-hours alone
    with ``hours`` (a site without prices)."""
    held = gpu_hours(row["held_seconds"])
    wasted = gpu_hours(row.get("waste_gpu_hours", 0.0) * 3600)
    if hours:
        return (
            f"held {held} GPU-h (no data {gpu_hours(row['nodata_seconds'])}, lost "
            f"{gpu_hours(row.get('lost_seconds', 0.0))}); waste {wasted} GPU-h = idle "
            f"{gpu_hours(row.get('idle_gpu_hours', 0.0) * 3600)} + fixable "
            f"{gpu_hours(row.get('fixable_gpu_hours', 0.0) * 3600)} (estimated)"
        )
    return (
        f"cost {money(row['cost_usd'])} ({held} GPU-h; no data {money(row['nodata_usd'])}, lost "
        f"{money(row['lost_usd'])}); waste {money(row['waste_usd'])} ({wasted} GPU-h) = idle "
        f"{money(row['idle_usd'])} + fixable {money(row['fixable_usd'])} (estimated)"
    )


def top_cause(row: dict[str, Any]) -> str:
    """The row's top cause with its share of the time and the waste in it."""
    name = row.get("top_cause")
    figures = (row.get("causes") or {}).get(name) if name else None
    if not name or not figures:
        return ""
    share = _pct(figures["seconds"], row["allocated_seconds"])
    return f"{name} {share} {money(figures['waste_usd'])}"


def top_fix(row: dict[str, Any]) -> str:
    """The row's fix that saves the most: its cause and the USD it saves."""
    fixes = row.get("fixes") or []
    if not fixes:
        return ""
    f = fixes[0]
    return f"{money(f['saving_usd'])} ({f['cause'] or f['kind']})"


def cause_breakdown(row: dict[str, Any]) -> str:
    """Every cause with time, largest first: share of the time and its cost."""
    causes = row.get("causes") or {}
    parts = sorted(
        ((f["seconds"], name, f["usd"]) for name, f in causes.items() if f["seconds"] > 0),
        reverse=True,
    )
    return ", ".join(
        f"{name} {_pct(sec, row['allocated_seconds'])} ({money(usd)})" for sec, name, usd in parts
    )


def cmd_report_cost(args: argparse.Namespace, settings: ClientSettings) -> int:
    """Fetch the cost report over HTTP and print it as a table, CSV or JSON."""
    settings = resolve_service(settings)
    since = None if args.start else args.since
    try:
        # Checked here for a quick, flag-named error; the service reads the same texts.
        time_range(
            start=args.start, end=args.end, since=since, now=utc_now(), default_seconds=7 * 86400
        )
    except ValidationFailed as exc:
        print(f"gpuwarden: --{exc.field}: {exc.message}", file=sys.stderr)
        return 2
    params: dict[str, str] = {
        "group_by": args.group_by,
        "sort": args.sort,
        "format": "focus" if args.focus else "csv" if args.csv else "json",
    }
    for key, value in (
        ("start", args.start),
        ("end", args.end),
        ("since", since),
        ("cause", args.cause),
        ("user", args.filter_user),
        ("team", args.filter_team),
        # The table shows the first rows only: the service builds no more than those.
        ("limit", None if args.csv or args.json or args.focus else str(args.limit)),
    ):
        if value:
            params[key] = value
    r = api_get(settings, "/reports/cost", params)
    if args.csv or args.focus:
        sys.stdout.write(r.text)
        return 0
    data = r.json()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    render_table(data, limit=args.limit, console=terminal_console())
    for w in data.get("warnings", []):
        print(f"warning: {w}", file=sys.stderr)
    return 0
