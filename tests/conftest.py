"""Fixtures: a real SQLite file and a real PostgreSQL database, migrated, for every backend test.

PostgreSQL is required (127.0.0.1:5432, user postgres, trust auth, or GPUWARDEN_TEST_PG_URL);
if it is unreachable the PostgreSQL tests fail rather than skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import hypothesis
import psycopg
import pytest
from sqlalchemy import Engine, text

from service.api.app import create_app
from service.clock import utc_now
from service.db import tokens_repo
from service.db.engine import make_engine
from service.db.migrate import upgrade
from service.db.schema import metadata
from service.settings import Settings
from tests.hypothesis_support import DEV_EXAMPLES
from tests.receivers import Receiver
from tests.support import FakeClock, live_server

if TYPE_CHECKING:
    from tests.smtp_support import SmtpServer

# Hypothesis: in CI (CI set) its own "ci" profile runs every property's full example count;
# elsewhere the fast loop ("dev") runs a tenth of them, and HYPOTHESIS_PROFILE picks another
# ("full": Hypothesis's defaults, as CI counts them, on this machine).
hypothesis.settings.register_profile("dev", max_examples=DEV_EXAMPLES)
hypothesis.settings.register_profile("full", max_examples=100)
if "HYPOTHESIS_PROFILE" in os.environ:
    hypothesis.settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])
elif not os.environ.get("CI"):
    hypothesis.settings.load_profile("dev")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist (controller): hand each worker the COLUMNS this run was started with."""
    node.workerinput["columns"] = os.environ.get("COLUMNS")


def pytest_configure(config: pytest.Config) -> None:
    """A pytest-xdist worker starts with COLUMNS=80 in its environment: it gets the run's own
    (none when piped), so the CLI tables a test prints are as wide as in a serial run."""
    worker_input: dict[str, Any] | None = getattr(config, "workerinput", None)
    if worker_input is None or "columns" not in worker_input:
        return
    if worker_input["columns"] is None:
        os.environ.pop("COLUMNS", None)
    else:
        os.environ["COLUMNS"] = worker_input["columns"]


PG_ADMIN_URL = os.environ.get(
    "GPUWARDEN_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def _pg_url(dbname: str) -> str:
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    return base.replace("postgresql://", "postgresql+psycopg://", 1) + "/" + dbname


@contextmanager
def new_pg_database(prefix: str) -> Iterator[str]:
    """The URL of a new, empty PostgreSQL database named ``prefix_<random>``; dropped after."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _pg_url(name)
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session; dropped at the end."""
    with new_pg_database("gpuwarden_test") as url:
        yield url


@contextmanager
def empty_engine(backend: str, tmp_path: Path) -> Iterator[Engine]:
    """An engine on a new, unmigrated database of ``backend`` (sqlite or postgresql); dropped after."""
    with ExitStack() as stack:
        if backend == "sqlite":
            url = f"sqlite:///{tmp_path / 'old.db'}"
        else:
            url = stack.enter_context(new_pg_database("gpuwarden_mig"))
        engine = make_engine(url)
        try:
            yield engine
        finally:
            engine.dispose()


@pytest.fixture(scope="session")
def sqlite_database(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh SQLite file for this test session."""
    path: Path = tmp_path_factory.mktemp("sqlite") / "gpuwarden.db"
    return f"sqlite:///{path}"


_ENGINES: dict[str, Engine] = {}


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def migrated_engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """A migrated engine for each backend, shared by the session."""
    url = request.getfixturevalue(
        f"{request.param}_database" if request.param == "sqlite" else "pg_database"
    )
    engine = make_engine(url)
    upgrade(engine)
    yield engine
    engine.dispose()


# PostgreSQL: the tables that hold rows, and the moved id sequences those tables own.
_PG_NONEMPTY = " UNION ALL ".join(
    f"SELECT '{t.name}' WHERE EXISTS (SELECT 1 FROM \"{t.name}\")" for t in metadata.sorted_tables
)
_PG_USED_SEQUENCES = text(
    "SELECT s.oid::regclass::text, ps.start_value FROM pg_sequences ps "
    "JOIN pg_class s ON s.oid = CAST(quote_ident(ps.schemaname) || '.' "
    "|| quote_ident(ps.sequencename) AS regclass) "
    "JOIN pg_depend d ON d.objid = s.oid AND d.classid = 'pg_class'::regclass "
    "AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i') "
    "JOIN pg_class t ON t.oid = d.refobjid "
    "WHERE ps.last_value IS NOT NULL AND ps.schemaname = current_schema() "
    "AND t.relname = ANY(:tables)"
).bindparams(tables=[t.name for t in metadata.sorted_tables])


def truncate_all(engine: Engine) -> None:
    """Empty every table (the schema stays) and restart the id sequences, as TRUNCATE ...
    RESTART IDENTITY CASCADE would.

    On PostgreSQL only the tables that hold rows are emptied, by DELETE with triggers and
    foreign keys off for the transaction (a superuser's session_replication_role): TRUNCATE
    makes new files for every table and index and costs 0.1-0.9 s a test on a loaded 2-core
    machine, these DELETEs a few milliseconds. Without superuser rights it falls back to TRUNCATE.
    """
    names = [t.name for t in reversed(metadata.sorted_tables)]
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            if conn.execute(text("SELECT current_setting('is_superuser')")).scalar() != "on":
                quoted = ", ".join(f'"{n}"' for n in names)
                conn.execute(text(f"TRUNCATE {quoted} RESTART IDENTITY CASCADE"))
                return
            held = {row[0] for row in conn.execute(text(_PG_NONEMPTY))}
            if held:
                conn.execute(text("SET LOCAL session_replication_role = replica"))
                for n in names:
                    if n in held:
                        conn.execute(text(f'DELETE FROM "{n}"'))
            for sequence, start in conn.execute(_PG_USED_SEQUENCES).all():
                conn.execute(
                    text("SELECT setval(CAST(:s AS regclass), :v, false)"),
                    {"s": sequence, "v": start},
                )
        else:
            for n in names:
                conn.execute(text(f'DELETE FROM "{n}"'))


@pytest.fixture
def engine(migrated_engine: Engine) -> Iterator[Engine]:
    """A migrated, empty database of each backend (the test runs once per backend)."""
    truncate_all(migrated_engine)
    yield migrated_engine


@pytest.fixture
def clock() -> FakeClock:
    """A scripted clock starting at 2026-12-02T08:00Z."""
    return FakeClock()


@pytest.fixture
def settings(engine: Engine) -> Settings:
    """Settings pointing at the test database, background jobs off (tests drive them)."""
    return Settings(
        database_url=str(engine.url.render_as_string(hide_password=False)), run_scheduler=False
    )


@pytest.fixture
def app(settings: Settings, engine: Engine, clock: FakeClock):
    """The central service app on the test database and scripted clock; its own ingest pool
    closed after the test (a test that calls use cases without serving the app never runs the
    shutdown that would, and a pooled connection left to the collector warns)."""
    made = create_app(settings, engine=engine, clock=clock)
    yield made
    if made.state.ctx.ingest_engine is not None:
        made.state.ctx.ingest_engine.dispose()


@pytest.fixture
def server(app) -> Iterator[str]:
    """The app served by a real uvicorn on loopback; yields its base URL."""
    with live_server(app) as url:
        yield url


def make_token(engine: Engine, role: str, node: str | None = None) -> str:
    """A fresh token of ``role`` (and ``node`` for agents)."""
    with engine.begin() as conn:
        secret, _ = tokens_repo.create_token(
            conn, role=tokens_repo.Role(role), node=node, name=None, now=utc_now()
        )
    return secret


@pytest.fixture
def tokens(engine: Engine) -> dict[str, str]:
    """One token per role; the agent token writes for node ``node-a``."""
    return {
        "agent": make_token(engine, "agent", "node-a"),
        "reader": make_token(engine, "reader"),
        "admin": make_token(engine, "admin"),
    }


@pytest.fixture
def http(server: str) -> Iterator[httpx.Client]:
    """An HTTP client for the live server."""
    with httpx.Client(base_url=server, timeout=30) as client:
        yield client


@pytest.fixture
def central(settings: Settings, engine: Engine) -> Iterator[str]:
    """The central service on the wall clock (Prometheus scrapes in real time); its base URL."""
    with live_server(create_app(settings, engine=engine)) as url:
        yield url


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A real HTTP receiver on loopback (webhooks, Slack, Alertmanager), closed after the test."""
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def smtp() -> Iterator[SmtpServer]:
    """A real SMTP server on loopback (plain SMTP), stopped after the test."""
    from tests.smtp_support import SmtpServer  # aiosmtpd only where mail is sent

    server = SmtpServer()
    yield server
    server.close()
