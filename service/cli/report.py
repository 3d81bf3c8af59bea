"""``gpuwarden report cost``: the cost report from the central API as a table, CSV or JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from service.cli.http import api_get
from service.clock import utc_now
from service.costs.waste import GROUP_BYS, TAGS
from service.errors import ValidationFailed
from service.querytime import INSTANT_FORMS, time_range
from service.settings import Settings


def add_report_parser(sub: Any) -> None:
    """Add ``report cost`` to the ``gpuwarden`` sub-commands."""
    p = sub.add_parser("report", help="wasted-spend reports from the central service")
    rsub = p.add_subparsers(dest="report_command", required=True, metavar="REPORT")
    c = rsub.add_parser(
        "cost",
        help="what GPUs cost and how much was idle or unused, worst first",
        description="Asks the central service (GET /api/v1/reports/cost) with a reader token.",
    )
    c.add_argument("--url", dest="central_url", help="central service URL (GPUWARDEN_CENTRAL_URL)")
    c.add_argument("--token", dest="api_token", help="reader token (GPUWARDEN_API_TOKEN)")
    c.add_argument("--since", default="7d", help="report the last DURATION (default 7d)")
    c.add_argument("--start", help=f"instead of --since: {INSTANT_FORMS}")
    c.add_argument("--end", help="the same forms as --start (default now)")
    c.add_argument("--group-by", default="job", choices=GROUP_BYS, help="default job")
    c.add_argument("--tag", choices=TAGS, help="only jobs with this tag")
    c.add_argument("--user", dest="filter_user", help="only this user's jobs")
    c.add_argument("--team", dest="filter_team", help="only this team's jobs")
    c.add_argument("--limit", type=int, default=20, help="rows in the table (default 20)")
    fmt = c.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="print CSV (every row)")
    fmt.add_argument("--json", action="store_true", help="print the JSON report")
    c.set_defaults(handler=cmd_report_cost)


def terminal_console() -> Console:
    """A console as wide as the terminal, or 200 columns when output is piped."""
    # Piped output has no terminal width; do not squeeze job ids into ellipses there.
    return Console() if sys.stdout.isatty() else Console(width=200)


def _money(v: float | None) -> str:
    return "n/a" if v is None else f"${v:,.2f}"


def _pct(part: float, whole: float) -> str:
    return "" if whole <= 0 else f"{100 * part / whole:.0f}%"


def render_table(data: dict[str, Any], *, limit: int, console: Console) -> None:
    """Print the report as a table, worst wasted spend first, with the totals last."""
    group_by = data["group_by"]
    table = Table(
        title=f"GPU cost by {group_by}, {data['start']} to {data['end']}",
        caption="wasted = unused cost = price x (1 - sm_active) x time; idle: sm_active < 5%",
    )
    table.add_column(group_by, no_wrap=True)
    for name in ("GPU-h", "cost", "idle cost", "wasted", "efficiency", "idle", "no data"):
        table.add_column(name, justify="right")
    if group_by == "job":
        table.add_column("user")
        table.add_column("tags")
    rows = data["rows"]
    shown = [*rows[:limit], {**data["totals"], "key": "TOTAL"}]
    for r in shown:
        eff = r["efficiency"]
        cells = [
            str(r["key"]),
            f"{r['allocated_seconds'] / 3600:,.1f}",
            _money(r["cost_usd"]),
            _money(r["idle_cost_usd"]),
            _money(r["unused_cost_usd"]),
            "" if eff is None else f"{eff:.0%}",
            _pct(r["idle_seconds"], r["allocated_seconds"]),
            _pct(r["nodata_seconds"], r["held_seconds"]),
        ]
        if group_by == "job":
            cells += [r.get("user") or "", ", ".join(r.get("tags") or [])]
        table.add_row(*cells, end_section=r is shown[-2])
    console.print(table)
    if len(rows) > limit:
        console.print(f"{len(rows) - limit} more rows; use --limit, --csv or --json for all")


def cmd_report_cost(
    args: argparse.Namespace, settings: Settings, transport: httpx.BaseTransport | None = None
) -> int:
    """Fetch the cost report over HTTP and print it as a table, CSV or JSON."""
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
        "format": "csv" if args.csv else "json",
    }
    for key, value in (
        ("start", args.start),
        ("end", args.end),
        ("since", since),
        ("tag", args.tag),
        ("user", args.filter_user),
        ("team", args.filter_team),
    ):
        if value:
            params[key] = value
    r = api_get(settings, "/reports/cost", params, transport=transport)
    if args.csv:
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
