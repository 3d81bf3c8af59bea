"""Engine construction: one place that knows the SQLite and PostgreSQL connection settings."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import URL, Engine, create_engine, event
from sqlalchemy.exc import DBAPIError

from service.errors import DatabaseUnavailable

if TYPE_CHECKING:
    from service.settings import Settings


def make_engine(
    database_url: str, *, statement_timeout_seconds: float | None = None, **kwargs: Any
) -> Engine:
    """Create an engine for ``database_url`` with settings tuned for each backend.

    ``statement_timeout_seconds`` (PostgreSQL) cancels any statement of this engine's sessions
    that runs longer; ``kwargs`` go to SQLAlchemy (pool_size, max_overflow, pool_timeout).
    """
    if database_url.startswith("sqlite"):
        engine = create_engine(
            database_url,
            connect_args={"check_same_thread": False, "timeout": 30},
            **kwargs,
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            # WAL lets readers run beside the single writer; NORMAL is durable in WAL mode
            # except for the last transactions on power loss, which the agent spool re-sends.
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 10)
    kwargs.setdefault("pool_pre_ping", True)
    engine = create_engine(database_url, **kwargs)

    @event.listens_for(engine, "connect")
    def _utc_session(dbapi_conn: Any, _record: Any) -> None:
        # Sessions in UTC: psycopg then returns timestamps already in datetime.UTC. A SET, not
        # a startup "options" parameter, which PgBouncer refuses by default.
        dbapi_conn.execute("SET TIME ZONE 'UTC'")
        if statement_timeout_seconds is not None:
            dbapi_conn.execute(f"SET statement_timeout = {int(statement_timeout_seconds * 1000)}")
        dbapi_conn.commit()

    return engine


def service_engine(settings: Settings) -> Engine:
    """The central service's engine for reads, writes and background jobs, with the pool sized
    by settings (``db_pool_size``, ``db_max_overflow``, ``db_pool_timeout_seconds``)."""
    return make_engine(
        settings.database_url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        pool_timeout=settings.db_pool_timeout_seconds,
    )


def ingest_engine(settings: Settings, url: str) -> Engine:
    """A separate small pool for agents' batches and token lookups, which reads cannot exhaust."""
    return make_engine(
        url,
        statement_timeout_seconds=settings.ingest_statement_timeout_seconds,
        pool_size=settings.ingest_max_concurrent + settings.auth_max_concurrent_lookups,
        max_overflow=0,
        pool_timeout=settings.db_pool_timeout_seconds,
    )


def read_engine(settings: Settings, url: str) -> Engine:
    """The read replica's pool (``database_read_url``), as large as the service's, with a short
    connect timeout so a replica that is away sends its reads to the primary quickly."""
    return make_engine(
        url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        pool_timeout=settings.db_pool_timeout_seconds,
        connect_args={"connect_timeout": settings.database_read_connect_timeout_seconds},
    )


# The databases every PostgreSQL server has for its own use.
MAINTENANCE_DATABASES = frozenset({"postgres", "template0", "template1"})


def _where(url: URL) -> str:
    return f"{url.host or 'localhost'}:{url.port or 5432}"


def _createdb(url: URL, name: str) -> str:
    user = f" -U {url.username}" if url.username else ""
    return f"createdb -h {url.host or 'localhost'} -p {url.port or 5432}{user} {name}"


def describe_connect_error(url: URL, message: str) -> str:
    """One line naming what is wrong with opening ``url`` and the fix, from the driver's message."""
    first = message.strip().splitlines()[0] if message.strip() else message
    if url.get_backend_name() == "sqlite":
        return f"cannot open the SQLite database {url.database}: {first}"
    where, name = _where(url), url.database or ""
    if re.search(r'database ".*" does not exist', message):
        return (
            f"PostgreSQL database {name!r} does not exist on {where}: create it with "
            f"`{_createdb(url, name)}`"
        )
    if "Connection refused" in message:
        return (
            f"nothing accepts connections on {where} (connection refused): start PostgreSQL "
            "there, or fix the host and port in GPUWARDEN_DATABASE_URL"
        )
    if "password authentication failed" in message or re.search(
        r'role ".*" does not exist', message
    ):
        return f"PostgreSQL on {where} refused user {url.username!r}: {_fatal(message)}"
    return f"cannot connect to PostgreSQL database {name!r} on {where}: {_fatal(message)}"


def _fatal(message: str) -> str:
    found = re.search(r"FATAL:\s*(.+)", message)
    line = found.group(1) if found else message.strip().splitlines()[0]
    return line.strip()


# The oldest PostgreSQL GPU Warden runs on: the cost reports' raw reads SET enable_memoize,
# a setting PostgreSQL 14 introduced (13 would refuse the statement).
MIN_POSTGRESQL_VERSION = (14,)


def describe_old_server(url: URL, version: tuple[int, ...] | None) -> str | None:
    """One line naming the fix when the PostgreSQL server at ``url`` (its ``version``) is older
    than GPU Warden needs; None when it is new enough or its version is unknown."""
    if version is None or version >= MIN_POSTGRESQL_VERSION:
        return None
    shown = ".".join(str(part) for part in version)
    needed = ".".join(str(part) for part in MIN_POSTGRESQL_VERSION)
    return (
        f"PostgreSQL on {_where(url)} is version {shown}; GPU Warden needs {needed} or newer: "
        "upgrade the server or point GPUWARDEN_DATABASE_URL at a newer one"
    )


def check_database(engine: Engine, *, allow_maintenance: bool = False) -> None:
    """Open one connection to ``engine``'s database; DatabaseUnavailable, one line naming the
    fix, when it cannot be opened, is a SQLite file in a missing folder, is one of
    PostgreSQL's own databases (unless ``allow_maintenance``) or is on a PostgreSQL too old."""
    url = engine.url
    if url.get_backend_name() == "sqlite":
        path = url.database or ""
        if path and path != ":memory:" and not path.startswith("file:"):
            folder = Path(path).parent
            if not folder.is_dir():
                raise DatabaseUnavailable(
                    f"the folder of the SQLite database {path} does not exist: "
                    f"`mkdir -p {folder}`, or give another GPUWARDEN_DATABASE_URL"
                )
    elif url.database in MAINTENANCE_DATABASES and not allow_maintenance:
        raise DatabaseUnavailable(
            f"{url.database!r} on {_where(url)} is PostgreSQL's own maintenance database; "
            f"create one for GPU Warden with `{_createdb(url, 'gpuwarden')}` and name it in "
            "GPUWARDEN_DATABASE_URL (or set GPUWARDEN_DATABASE_ALLOW_MAINTENANCE=true to use "
            f"{url.database!r} anyway)"
        )
    try:
        with engine.connect() as conn:
            # SQLAlchemy's version tuple may end in text ("devel", "beta1"): the numbers count.
            info = conn.dialect.server_version_info
            version = None if info is None else tuple(p for p in info if isinstance(p, int))
    except DBAPIError as exc:
        raise DatabaseUnavailable(describe_connect_error(url, str(exc.orig))) from None
    old = describe_old_server(url, version) if url.get_backend_name() == "postgresql" else None
    if old is not None:
        raise DatabaseUnavailable(old)
