"""What the test suite pays per test for its two commonest fixtures, before and after CI's cut.

The per-test database reset (tests/conftest.py's ``truncate_all``) on PostgreSQL: the old
TRUNCATE of every table with RESTART IDENTITY CASCADE against the new DELETE of the tables that
hold rows (plus the moved sequences restarted), each after a test-sized write (a node, a GPU, a
job on it, three tokens). And the live test server (tests/support.py's ``live_server``): uvicorn's
own server against the quick-stopping one, start to stop around one request. Medians of
``--runs`` rounds, in ms; the reference is the old way beside the new.

    flock /tmp/bench.lock .venv/bin/python -m bench.test_fixtures
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable

import httpx
import uvicorn
from sqlalchemy import Engine, text

from bench.common import fresh_database, machine
from service.api.app import create_app
from service.db.engine import make_engine
from service.db.migrate import upgrade
from service.db.schema import metadata
from service.settings import Settings
from tests.conftest import make_token, truncate_all
from tests.support import FakeClock, free_port, live_server, store_a_job_on_a_gpu


def write_like_a_test(engine: Engine) -> None:
    """A node, a GPU, a job on it and three tokens: what a typical API test stores."""
    store_a_job_on_a_gpu(engine)
    for role in ("admin", "reader"):
        make_token(engine, role)
    make_token(engine, "agent", "n1")


def truncate_every_table(engine: Engine) -> None:
    """The reset before: TRUNCATE of every table, identities restarted."""
    names = ", ".join(f'"{t.name}"' for t in reversed(metadata.sorted_tables))
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))


def reset_ms(engine: Engine, reset: Callable[[Engine], None], runs: int) -> float:
    """Median ms of ``reset`` after a test-sized write."""
    times = []
    for _ in range(runs):
        write_like_a_test(engine)
        began = time.perf_counter()
        reset(engine)
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def uvicorn_stock_cycle_ms(settings: Settings, engine: Engine) -> float:
    """Start, one request, stop: uvicorn's own server, as live_server ran it before."""
    config = uvicorn.Config(
        create_app(settings, engine=engine, clock=FakeClock()),
        host="127.0.0.1",
        port=free_port(),
        log_level="warning",
    )
    server = uvicorn.Server(config)
    began = time.perf_counter()
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    httpx.get(f"http://127.0.0.1:{config.port}/healthz")
    server.should_exit = True
    thread.join(10)
    return (time.perf_counter() - began) * 1000


def quick_cycle_ms(settings: Settings, engine: Engine) -> float:
    """Start, one request, stop: the test suite's live_server now."""
    began = time.perf_counter()
    with live_server(create_app(settings, engine=engine, clock=FakeClock())) as url:
        httpx.get(f"{url}/healthz")
    return (time.perf_counter() - began) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    print(machine())
    with fresh_database("postgresql") as url:
        engine = make_engine(url)
        upgrade(engine)
        before = reset_ms(engine, truncate_every_table, args.runs)
        after = reset_ms(engine, truncate_all, args.runs)
        print(f"PostgreSQL reset per test: TRUNCATE every table {before:.1f} ms (before), "
              f"DELETE of the tables holding rows {after:.1f} ms (now)")  # fmt: skip
        settings = Settings(database_url=url, run_scheduler=False)
        stock = statistics.median(
            uvicorn_stock_cycle_ms(settings, engine) for _ in range(args.runs)
        )
        quick = statistics.median(quick_cycle_ms(settings, engine) for _ in range(args.runs))
        print(f"Live server start + request + stop: uvicorn's {stock:.0f} ms (before), "
              f"quick stop {quick:.0f} ms (now)")  # fmt: skip
        engine.dispose()


if __name__ == "__main__":
    main()
