"""Benchmark: layouts for seconds per cause in a minute rollup, on PostgreSQL.

- wide: one float column per cause on the minute row (what rollup_1m, rollup_1h, the tenant
  tables and the day sums do today: a new cause is a migration adding its columns);
- long: one row per (GPU, minute, cause) with time in it (a new cause needs no migration);
- array: one ``float8[]`` column indexed by cause (no migration; positions fixed by order);
- dense: the long layout with a row for every cause every minute, as per-cause running totals
  (rollup_1m's ``cum_`` columns, which let a report read a range as two rows) would need;
- base: the minute row's key alone, so a layout's own bytes are its figure less this one.

Each layout holds the same data: GPUs x minutes, six 10 s samples a minute whose causes follow
runs as a real GPU's do (a cause lasts minutes, so most minutes have one cause, some two). It
prints bytes per GPU-minute (table plus indexes) and the time of the read a report makes: seconds
per cause per GPU over the whole range, best of 5.

Run:  .venv/bin/python bench/cause_columns.py [--gpus 200] [--minutes 1440]
"""

from __future__ import annotations

import argparse
import io
import random
import sys
import time
from pathlib import Path

import psycopg

# Appended, not first: PYTHONPATH (another copy of the code, timed against this one) wins.
sys.path.append(str(Path(__file__).resolve().parents[1]))

from bench.common import PG_ADMIN, fresh_database, machine
from service.core.diagnosis import CAUSE_NAMES

CAUSES = len(CAUSE_NAMES)
WIDE_COLS = ", ".join(f"{c}_seconds float8 NOT NULL DEFAULT 0" for c in CAUSE_NAMES)
SCHEMA = f"""
CREATE TABLE wide (gpu_id int4, bucket timestamptz, {WIDE_COLS}, PRIMARY KEY (gpu_id, bucket));
CREATE TABLE long (gpu_id int4, bucket timestamptz, cause int2, seconds float8 NOT NULL,
                   PRIMARY KEY (gpu_id, bucket, cause));
CREATE TABLE arr (gpu_id int4, bucket timestamptz, cause_seconds float8[] NOT NULL,
                  PRIMARY KEY (gpu_id, bucket));
CREATE TABLE dense (LIKE long INCLUDING ALL);
CREATE TABLE base (gpu_id int4, bucket timestamptz, PRIMARY KEY (gpu_id, bucket));
"""
READS = {
    "wide": "SELECT gpu_id, "
    + ", ".join(f"sum({c}_seconds)" for c in CAUSE_NAMES)
    + " FROM wide GROUP BY gpu_id",
    "long": "SELECT gpu_id, cause, sum(seconds) FROM long GROUP BY gpu_id, cause",
    "arr": "SELECT gpu_id, "
    + ", ".join(f"sum(cause_seconds[{i + 1}])" for i in range(CAUSES))
    + " FROM arr GROUP BY gpu_id",
    "dense": "SELECT gpu_id, cause, sum(seconds) FROM dense GROUP BY gpu_id, cause",
    "base": "SELECT gpu_id, count(*) FROM base GROUP BY gpu_id",
}


def minutes_of(rng: random.Random, minutes: int) -> list[list[float]]:
    """Seconds per cause for each minute of one GPU: runs of one cause, 10 s samples."""
    out: list[list[float]] = []
    cause, left = rng.randrange(CAUSES), 0
    for _ in range(minutes):
        row = [0.0] * CAUSES
        for _ in range(6):
            if left <= 0:
                cause, left = rng.randrange(CAUSES), rng.randint(6, 600)
            row[cause] += 10.0
            left -= 1
        out.append(row)
    return out


def load(url: str, gpus: int, minutes: int) -> None:
    """Write the same minutes into each layout's staging table with COPY."""
    rng = random.Random(7)
    with psycopg.connect(url) as conn:
        for gpu in range(gpus):
            wide, long, arr, dense = io.StringIO(), io.StringIO(), io.StringIO(), io.StringIO()
            for m, row in enumerate(minutes_of(rng, minutes)):
                ts = f"{1793577600 + 60 * m}"  # epoch seconds: 2026-11-01 plus m minutes
                wide.write(f"{gpu}\t{ts}\t" + "\t".join(map(str, row)) + "\n")
                arr.write(f"{gpu}\t{ts}\t{{{','.join(map(str, row))}}}\n")
                for c, s in enumerate(row):
                    dense.write(f"{gpu}\t{ts}\t{c}\t{s}\n")
                    if s:
                        long.write(f"{gpu}\t{ts}\t{c}\t{s}\n")
            for table, buf in (("wide", wide), ("long", long), ("arr", arr), ("dense", dense)):
                with conn.cursor().copy(f"COPY {table}_in FROM STDIN") as cp:
                    cp.write(buf.getvalue())
        conn.commit()


def stage_tables(url: str) -> None:
    """The layouts' tables, and staging tables that COPY fills with epoch seconds."""
    with psycopg.connect(url) as conn:
        conn.execute(SCHEMA)
        conn.execute(
            f"CREATE UNLOGGED TABLE wide_in (gpu_id int4, ts int8, "
            f"{', '.join(f'c{i} float8' for i in range(CAUSES))});"
            "CREATE UNLOGGED TABLE long_in (gpu_id int4, ts int8, cause int2, seconds float8);"
            "CREATE UNLOGGED TABLE arr_in (gpu_id int4, ts int8, cause_seconds float8[]);"
            "CREATE UNLOGGED TABLE dense_in (LIKE long_in);"
        )


def finish(url: str) -> None:
    """Move staged rows into the layouts' tables and analyze them."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO wide SELECT gpu_id, to_timestamp(ts), "
            + ", ".join(f"c{i}" for i in range(CAUSES))
            + " FROM wide_in"
        )
        conn.execute(
            "INSERT INTO long SELECT gpu_id, to_timestamp(ts), cause, seconds FROM long_in"
        )
        conn.execute("INSERT INTO arr SELECT gpu_id, to_timestamp(ts), cause_seconds FROM arr_in")
        conn.execute(
            "INSERT INTO dense SELECT gpu_id, to_timestamp(ts), cause, seconds FROM dense_in"
        )
        conn.execute("INSERT INTO base SELECT gpu_id, to_timestamp(ts) FROM arr_in")
        for t in ("wide", "long", "arr", "dense"):
            conn.execute(f"DROP TABLE {t}_in")
        for t in READS:
            conn.execute(f"VACUUM ANALYZE {t}")


def measure(url: str, gpu_minutes: int) -> None:
    """Print bytes per GPU-minute and the best read time of each layout."""
    with psycopg.connect(url) as conn:
        print(f"{'layout':<6} {'rows':>10} {'bytes/GPU-min':>14} {'read, best of 5':>16}")
        for t, sql in READS.items():
            rows = conn.execute(f"SELECT count(*) FROM {t}").fetchone()
            size = conn.execute(f"SELECT pg_total_relation_size('{t}')").fetchone()
            assert rows is not None and size is not None
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                conn.execute(sql).fetchall()
                best = min(best, time.perf_counter() - t0)
            print(f"{t:<6} {rows[0]:>10,} {size[0] / gpu_minutes:>14.1f} {best * 1000:>13.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=200)
    ap.add_argument("--minutes", type=int, default=1440)
    args = ap.parse_args()
    print(f"machine: {machine()}; {args.gpus} GPUs x {args.minutes} minutes, {CAUSES} causes")
    with fresh_database("postgresql", PG_ADMIN) as sa_url:
        url = sa_url.replace("postgresql+psycopg://", "postgresql://")
        stage_tables(url)
        load(url, args.gpus, args.minutes)
        finish(url)
        measure(url, args.gpus * args.minutes)


if __name__ == "__main__":
    main()
