"""Engine construction: one place that knows the SQLite and PostgreSQL connection settings."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event

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
