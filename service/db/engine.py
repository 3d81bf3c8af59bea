"""Engine construction: one place that knows the SQLite and PostgreSQL connection settings."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event


def make_engine(database_url: str, **kwargs: Any) -> Engine:
    """Create an engine for ``database_url`` with settings tuned for each backend."""
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
        dbapi_conn.commit()

    return engine
