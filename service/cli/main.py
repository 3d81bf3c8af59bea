"""The ``gpuwarden`` command line: serve, migrate, token and the other sub-commands."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from service.cli.actions import add_actions_parser
from service.cli.fleet import add_fleet_parsers
from service.cli.report import add_report_parser
from service.clientsettings import DEFAULT_DATABASE_URL, ClientSettings, DatabaseClientSettings
from service.collectors.scenarios import SCENARIOS
from service.errors import ConfigError, WardenError
from service.roles import Role

# Only what building the parser and the HTTP commands need is imported above: the database,
# pydantic and the web framework cost a second of CPU, so commands import them when they run.
if TYPE_CHECKING:
    from sqlalchemy import Engine

    from service.settings import Settings

Handler = Callable[[argparse.Namespace, Any], int]
# Commands that make HTTP calls only: they get ClientSettings, not the full Settings; so does
# `policies check`, which builds the full Settings only for --check-urls. The token commands
# get the database's few settings (DatabaseClientSettings): pydantic-settings costs them a
# tenth of a second of CPU (bench/cli_startup.py).
HTTP_COMMANDS = frozenset({"gpus", "job", "report", "actions"})
CLIENT_SETTINGS_COMMANDS = HTTP_COMMANDS | {"policies"}
DATABASE_CLIENT_COMMANDS = frozenset({"token"})


def _settings(args: argparse.Namespace) -> Settings:
    from service.settings import Settings

    overrides = {
        k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None
    }
    return Settings(**overrides)


def _client_settings(args: argparse.Namespace) -> ClientSettings:
    return ClientSettings.load(vars(args), os.environ)


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    """Upgrade the database schema to the newest migration."""
    from service.db.engine import check_database, make_engine
    from service.db.migrate import upgrade

    engine = make_engine(settings.database_url)
    check_database(engine, allow_maintenance=settings.database_allow_maintenance)
    upgrade(engine)
    print(f"database at head: {settings.database_url.split('@')[-1]}")
    return 0


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    """Run the central service with uvicorn."""
    import uvicorn

    from service.api.app import create_app, freeze_start_up_objects
    from service.db.engine import check_database, service_engine
    from service.db.migrate import check_at_head, upgrade
    from service.local.launcher import check_port_free

    # A busy port (a demo running here) fails now, before a database file is created.
    check_port_free(settings.host, settings.port)
    if settings.config is not None:
        from service.usecases.config_check import check_config_file
        from service.usecases.evaluation import check_file_channels

        # One line naming the file and field, before uvicorn would turn it into a traceback;
        # channel URLs at refused addresses stop the start here too.
        checked = check_config_file(settings.config)
        check_file_channels(
            checked.channels, settings.webhook_allow_nets, source=f"config file {settings.config}"
        )
    from service.actions.registry import check_action_webhook_url

    check_action_webhook_url(settings)  # one line naming the setting, before uvicorn starts
    engine = service_engine(settings)
    check_database(engine, allow_maintenance=settings.database_allow_maintenance)
    if args.migrate:
        upgrade(engine)
    check_at_head(engine)  # fail here, with the fix in the message, not inside uvicorn
    app = create_app(settings, engine=engine)
    freeze_start_up_objects()
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        access_log=args.access_log,
        # Client addresses (for the failed-login throttle) follow GPUWARDEN_TRUSTED_PROXIES,
        # not uvicorn's own trust of X-Forwarded-For from loopback.
        proxy_headers=False,
    )
    return 0


def _token_engine(settings: DatabaseClientSettings) -> Engine:
    """The engine of the database token commands mean, said on stderr: a running up's or demo's
    when nothing else is given (see service.local.run)."""
    from service.db.engine import check_database, make_engine
    from service.db.schema_version import check_at_head
    from service.local.run import resolve_database_url

    url, which = resolve_database_url(settings.database_url, settings, default=DEFAULT_DATABASE_URL)
    print(f"gpuwarden: {which}", file=sys.stderr)
    engine = make_engine(url)
    check_database(engine, allow_maintenance=settings.database_allow_maintenance)
    check_at_head(engine)
    return engine


def cmd_token_create(args: argparse.Namespace, settings: DatabaseClientSettings) -> int:
    """Create an API token: ``id=N`` on the first line, the secret alone on the last."""
    from service.clock import utc_now
    from service.db import tokens_repo

    engine = _token_engine(settings)
    with engine.begin() as conn:
        secret, info = tokens_repo.create_token(
            conn, role=Role(args.role), node=args.node, name=args.name, now=utc_now()
        )
    print(
        f"created {info.role.value} token id={info.id}"
        + (f" for node {info.node}" if info.node else "")
        + "; it is shown only once:",
        file=sys.stderr,
    )
    # One write: `| head -n1` (for the id) must not see the process write again after it left.
    sys.stdout.write(f"id={info.id}\n{secret}\n")  # revoke by ID=$(... | head -n1 | cut -d= -f2)
    sys.stdout.flush()
    return 0


def cmd_token_list(args: argparse.Namespace, settings: DatabaseClientSettings) -> int:
    """List tokens (never their secrets)."""
    from rich.table import Table

    from service.cli.report import terminal_console
    from service.db import tokens_repo

    engine = _token_engine(settings)
    with engine.connect() as conn:
        tokens = tokens_repo.list_tokens(conn)
    table = Table("id", "role", "node", "name", "prefix", "created", "revoked")
    for t in tokens:
        table.add_row(
            str(t.id),
            t.role.value,
            t.node or "",
            t.name or "",
            t.prefix + "…",
            f"{t.created_at:%Y-%m-%d %H:%M}",
            f"{t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "",
        )
    terminal_console().print(table)
    return 0


def cmd_token_revoke(args: argparse.Namespace, settings: DatabaseClientSettings) -> int:
    """Revoke a token by id."""
    from service.clock import utc_now
    from service.db import tokens_repo

    engine = _token_engine(settings)
    with engine.begin() as conn:
        info = tokens_repo.revoke_token(conn, token_id=args.id, now=utc_now())
    print(f"revoked token id={info.id} ({info.role.value})")
    return 0


def cmd_policies_check(args: argparse.Namespace, client: ClientSettings) -> int:
    """Validate a YAML config file (policies, channels, prices); exit 1 naming the bad field."""
    from pathlib import Path

    from service.configfile import UNSET_URL
    from service.usecases.config_check import check_config_file, ladder_timelines

    unset: list[str] = []
    checked = check_config_file(Path(args.file), unset=unset)
    for field in unset:
        # The file is right; this shell lacks a secret it reads. serve refuses to start so.
        print(
            f"gpuwarden: note: {field} is not set here; the rest of the item is checked, and "
            "serve needs the variable set",
            file=sys.stderr,
        )
    if args.check_urls:
        from service.notify.urlsafety import parse_allow_nets, resolve_checked

        try:
            allow_nets = _settings(args).webhook_allow_nets
        except ValueError as exc:  # pydantic's message names the setting
            raise ConfigError(f"bad setting: {exc}") from exc
        nets = parse_allow_nets(allow_nets)
        for i, c in enumerate(checked.channels):
            if c.is_http and c.url != UNSET_URL:  # a variable not set here: nothing to resolve
                resolve_checked(c.url, nets, field=f"channels.{i}.url")
    print(
        f"{args.file}: {len(checked.policies)} policies, {len(checked.channels)} channels "
        f"and {len(checked.prices)} prices are valid"
    )
    firing: list[dict[str, Any]] = []
    actions: list[dict[str, Any]] = []
    if args.live and any(p.ladder for p in checked.policies):
        from service.cli.http import api_get
        from service.local.run import resolve_service

        client = resolve_service(client)
        firing = api_get(client, "/alerts", {"state": "firing"}).json()
        # The steps already taken, read per policy with a firing job alert (the newest first).
        for name in sorted({a["policy"] for a in firing if (a.get("labels") or {}).get("job_id")}):
            actions += api_get(client, "/actions", {"policy": name, "limit": "1000"}).json()
    for line in ladder_timelines(checked.policies, firing, actions):
        print(line)
    return 0


def cmd_agent(args: argparse.Namespace, settings: Settings) -> int:
    """Run the node agent in the foreground."""
    from service.collectors.runner import run_agent

    return run_agent(settings)


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    """Run the central service and a local agent (NVML, else simulated) in one process."""
    from service.local.launcher import run_up

    return run_up(settings)


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    """Run the central service with a simulated multi-node fleet showing every scenario."""
    from service.local.launcher import run_demo

    if args.interval_seconds is None:
        settings = settings.model_copy(update={"interval_seconds": 5.0})
    return run_demo(
        settings,
        nodes=args.nodes,
        gpus=args.gpus,
        history_minutes=args.history_minutes,
        seed=args.seed,
    )


def _central_flags(p: argparse.ArgumentParser) -> None:
    """Where an agent ships and with which token (``up`` and ``demo`` make their own)."""
    p.add_argument("--central-url", dest="central_url", help="GPUWARDEN_CENTRAL_URL")
    p.add_argument("--agent-token", dest="agent_token", help="GPUWARDEN_AGENT_TOKEN")


def _agent_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--interval-seconds", dest="interval_seconds", type=float, help="GPUWARDEN_INTERVAL_SECONDS"
    )
    p.add_argument(
        "--backend",
        choices=["auto", "nvml", "dcgm-exporter", "simulated"],
        help="GPUWARDEN_BACKEND (auto: NVML when a GPU is present; `agent` fails without one, "
        "`up` falls back to simulated)",
    )
    p.add_argument(
        "--state-dir",
        dest="state_dir",
        help="GPUWARDEN_STATE_DIR: spool and dead letters (else $STATE_DIRECTORY, "
        "$XDG_STATE_HOME/gpuwarden, ./gpuwarden-data)",
    )
    p.add_argument("--spool-path", dest="spool_path", help="GPUWARDEN_SPOOL_PATH")
    p.add_argument(
        "--spool-max-bytes", dest="spool_max_bytes", type=int, help="GPUWARDEN_SPOOL_MAX_BYTES"
    )
    p.add_argument("--dead-letter-path", dest="dead_letter_path", help="GPUWARDEN_DEAD_LETTER_PATH")
    p.add_argument(
        "--batch-seconds",
        dest="agent_batch_seconds",
        type=float,
        help="GPUWARDEN_AGENT_BATCH_SECONDS (30): polls shipped together in one request",
    )
    p.add_argument(
        "--dcgm-exporter-url", dest="dcgm_exporter_url", help="GPUWARDEN_DCGM_EXPORTER_URL"
    )
    p.add_argument(
        "--node-name", dest="node_name", help="GPUWARDEN_NODE_NAME or NODE_NAME (the hostname)"
    )
    p.add_argument(
        "--node-labels", dest="node_labels", help="GPUWARDEN_NODE_LABELS, e.g. rack=r1,zone=a"
    )
    p.add_argument(
        "--metrics-port",
        dest="agent_metrics_port",
        type=int,
        help="GPUWARDEN_AGENT_METRICS_PORT: serve the agent's own /metrics here",
    )
    p.add_argument("--metrics-host", dest="agent_metrics_host", help="GPUWARDEN_AGENT_METRICS_HOST")
    p.add_argument("--proc-root", dest="proc_root", help="GPUWARDEN_PROC_ROOT (/proc)")
    p.add_argument("--job-map-dir", dest="job_map_dir", help="GPUWARDEN_JOB_MAP_DIR")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command."""
    parser = argparse.ArgumentParser(
        prog="gpuwarden", description="GPU telemetry, idle-GPU alerts and wasted-spend reports."
    )
    parser.add_argument("--database-url", dest="database_url", help="GPUWARDEN_DATABASE_URL")
    parser.add_argument("--log-level", dest="log_level", help="GPUWARDEN_LOG_LEVEL (INFO)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # The same flags after the sub-command (`gpuwarden token list --database-url ...`);
    # SUPPRESS keeps a value given before it when they are not repeated.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--database-url", dest="database_url", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    common.add_argument(
        "--log-level", dest="log_level", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    common.add_argument(
        "--allow-maintenance-database",
        dest="database_allow_maintenance",
        action="store_const",
        const=True,
        default=argparse.SUPPRESS,
        help="use PostgreSQL's own `postgres` database if the URL names it "
        "(GPUWARDEN_DATABASE_ALLOW_MAINTENANCE)",
    )

    # Where serve, up and demo listen.
    listen = argparse.ArgumentParser(add_help=False)
    listen.add_argument("--host", help="GPUWARDEN_HOST (127.0.0.1)")
    listen.add_argument("--port", type=int, help="GPUWARDEN_PORT (8000)")

    p = sub.add_parser("migrate", help="upgrade the database schema", parents=[common])
    p.set_defaults(handler=cmd_migrate)

    p = sub.add_parser("serve", help="run the central service", parents=[common, listen])
    p.add_argument("--config", help="GPUWARDEN_CONFIG: YAML with policies, channels, prices")
    p.add_argument("--migrate", action="store_true", help="upgrade the schema first")
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.set_defaults(handler=cmd_serve)

    p = sub.add_parser("token", help="create, list and revoke API tokens")
    tsub = p.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    c = tsub.add_parser(
        "create",
        help="create a token: id=N, then the secret alone on the last line",
        parents=[common],
    )
    c.add_argument("--role", required=True, choices=[r.value for r in Role])
    c.add_argument("--node", help="the node an agent token writes for")
    c.add_argument("--name", help="a note to recognise the token by")
    c.set_defaults(handler=cmd_token_create)
    c = tsub.add_parser("list", help="list tokens", parents=[common])
    c.set_defaults(handler=cmd_token_list)
    c = tsub.add_parser("revoke", help="revoke a token by id", parents=[common])
    c.add_argument("id", type=int)
    c.set_defaults(handler=cmd_token_revoke)

    p = sub.add_parser("policies", help="alerting policies")
    psub = p.add_subparsers(dest="policies_command", required=True, metavar="ACTION")
    c = psub.add_parser("check", help="validate the policies and channels of a YAML file")
    c.add_argument("file", help="the YAML config file (as GPUWARDEN_CONFIG)")
    c.add_argument(
        "--check-urls",
        action="store_true",
        help="also resolve channel URLs and refuse private ones (GPUWARDEN_WEBHOOK_ALLOW_NETS)",
    )
    c.add_argument(
        "--live",
        action="store_true",
        help="also explain each ladder on the jobs it runs on now (GET /api/v1/alerts, UTC)",
    )
    c.add_argument("--url", dest="central_url", help="central service URL (GPUWARDEN_CENTRAL_URL)")
    c.add_argument("--token", dest="api_token", help="reader token (GPUWARDEN_API_TOKEN)")
    c.set_defaults(handler=cmd_policies_check)
    add_report_parser(sub)
    add_fleet_parsers(sub)
    add_actions_parser(sub)

    p = sub.add_parser("agent", help="run the node agent (collect, attribute, ship)")
    _central_flags(p)
    _agent_flags(p)
    p.set_defaults(handler=cmd_agent)

    p = sub.add_parser(
        "up", help="run the central service on SQLite plus a local agent", parents=[common, listen]
    )
    _agent_flags(p)
    p.set_defaults(handler=cmd_up)

    p = sub.add_parser(
        "demo", help="run the central service with a simulated fleet", parents=[common, listen]
    )
    p.add_argument("--nodes", type=int, default=3, help="simulated nodes (3)")
    p.add_argument(
        "--gpus",
        type=int,
        default=5,
        help=f"GPUs per node (5); the {len(SCENARIOS)} scenarios ({', '.join(SCENARIOS)}) "
        "continue from node to node, so 3 x 5 GPUs show each",
    )
    p.add_argument("--history-minutes", type=float, default=60.0, help="history to backfill (60)")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulated fleet")
    p.add_argument(
        "--interval-seconds", dest="interval_seconds", type=float, help="sampling interval (5)"
    )
    p.set_defaults(handler=cmd_demo)
    return parser


TIME_FLAGS = ("--start", "--end", "--since")


def join_relative_times(argv: Sequence[str]) -> list[str]:
    """``--start -1h`` as ``--start=-1h``: argparse would take ``-1h`` for an option."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in TIME_FLAGS and i + 1 < len(argv) and re.match(r"-\d", argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpuwarden`` command."""
    args = build_parser().parse_args(join_relative_times(sys.argv[1:] if argv is None else argv))
    try:
        settings: ClientSettings | DatabaseClientSettings | Settings
        if args.command in CLIENT_SETTINGS_COMMANDS:
            settings = _client_settings(args)
        elif args.command in DATABASE_CLIENT_COMMANDS:
            settings = DatabaseClientSettings.load(vars(args), os.environ)
        else:
            settings = _settings(args)
    except Exception as exc:  # pydantic's message names the setting
        print(f"gpuwarden: bad setting: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("alembic", "apscheduler"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # httpx logs every request URL at INFO; a Slack webhook URL is a secret.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    handler: Handler = args.handler
    try:
        return handler(args, settings)
    except WardenError as exc:
        print(f"gpuwarden: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `gpuwarden report cost --json | head`: the reader left; say nothing more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
