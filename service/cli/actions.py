"""``gpuwarden actions``: the ladders' audit log (GET /api/v1/actions) as a table, CSV or JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from service.cli.http import api_get
from service.cli.report import money, short_time, terminal_console
from service.cli.tables import Column, fit_table
from service.clientsettings import ClientSettings
from service.core.querytime import INSTANT_FORMS
from service.local.run import resolve_service
from service.vocabulary import ACTION_OUTCOMES

# Query parameters of the route, as the flags' destinations name them.
FILTERS = {"job": "job", "user": "filter_user", "team": "filter_team", "policy": "policy"}


def add_actions_parser(sub: Any) -> None:
    """Add ``actions`` to the ``gpuwarden`` sub-commands."""
    p = sub.add_parser(
        "actions",
        help="the ladders' audit log: warnings, reclaims, dry runs, skips and failures, newest "
        "first",
        description="Asks the central service (GET /api/v1/actions) with a reader token. Next "
        "to a running `gpuwarden up` or `demo` the service and token are found by themselves.",
    )
    p.add_argument("--url", dest="central_url", help="central service URL (GPUWARDEN_CENTRAL_URL)")
    p.add_argument("--token", dest="api_token", help="reader token (GPUWARDEN_API_TOKEN)")
    p.add_argument("--job", help="only this job's steps, e.g. slurm:4242")
    p.add_argument("--user", dest="filter_user", help="only this user's jobs")
    p.add_argument("--team", dest="filter_team", help="only this team's jobs")
    p.add_argument("--policy", help="only this policy's ladder")
    p.add_argument(
        "--outcome",
        metavar="OUTCOME",
        choices=ACTION_OUTCOMES,
        help=f"only steps with this outcome: {', '.join(ACTION_OUTCOMES)}",
    )
    p.add_argument("--since", help="only the last DURATION (24h, 7d); default: every step")
    p.add_argument("--start", help=f"instead of --since: {INSTANT_FORMS}")
    p.add_argument("--end", help="the same forms as --start (default now)")
    p.add_argument("--limit", type=int, default=50, help="steps to show (default 50, at most 1000)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="print CSV")
    fmt.add_argument("--json", action="store_true", help="print the JSON list")
    p.set_defaults(handler=cmd_actions)


ACTION_COLUMNS = [
    Column("when", whole=True),
    Column("policy", drop=4),
    Column("job", whole=True, fold_last=True),
    Column("user", drop=3),
    Column("step", whole=True),
    Column("outcome", whole=True),
    Column("dry run", whole=True),
    Column("driver", drop=1),
    Column("$ waste", "right", drop=2),
    Column("why", wrap=True),
]


def step_text(action: dict[str, Any]) -> str:
    """``2. notify owner``: the step's place in the ladder (from 1) and its action."""
    what = str(action["action"]).replace("_", " ")
    return what if action.get("step") is None else f"{action['step'] + 1}. {what}"


def why_text(action: dict[str, Any]) -> str:
    """Why the step came out as it did: the reason (skips, failures), else what was done."""
    return str(action.get("reason") or action.get("detail") or "")


def action_rows(actions: list[dict[str, Any]]) -> list[list[str]]:
    """One row per step, in the order given (newest first)."""
    return [
        [
            short_time(a["at"]),
            a["policy"],
            a["job_id"],
            a.get("user") or "",
            step_text(a),
            a["outcome"],
            "yes" if a["dry_run"] else "",
            a.get("driver") or "",
            money(a.get("waste_usd")) if a.get("waste_usd") is not None else "",
            why_text(a),
        ]
        for a in actions
    ]


def _params(args: argparse.Namespace) -> dict[str, str]:
    params = {name: v for name, dest in FILTERS.items() if (v := getattr(args, dest, None))}
    for name in ("outcome", "since", "start", "end"):
        if (value := getattr(args, name, None)) is not None:
            params[name] = value
    params["limit"] = str(args.limit)
    if args.csv:
        params["format"] = "csv"
    return params


def cmd_actions(args: argparse.Namespace, settings: ClientSettings) -> int:
    """Print the audit log's steps newest first, filtered as the flags say."""
    settings = resolve_service(settings)
    answer = api_get(settings, "/actions", _params(args))
    if args.csv:
        sys.stdout.write(answer.text)
        return 0
    actions: list[dict[str, Any]] = answer.json()
    if args.json:
        print(json.dumps(actions, indent=2))
        return 0
    console = terminal_console()
    if not actions:
        console.print("no ladder steps match")
        return 0
    title = f"{len(actions)} ladder step{'' if len(actions) == 1 else 's'}, newest first"
    table, dropped = fit_table(
        ACTION_COLUMNS, action_rows(actions), width=console.width, title=title
    )
    if dropped:
        table.caption = f"left out to fit {console.width} columns: {', '.join(dropped)}"
    console.print(table)
    if len(actions) == args.limit:
        console.print(f"the newest {args.limit}; use --limit, --since or a filter for more")
    return 0
