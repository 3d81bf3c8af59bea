"""INSERT that skips rows already present (by COPY on PostgreSQL where no row is), and a match
on many (GPU, bucket) keys, on PostgreSQL and SQLite.

Other statements that differ by dialect (partitions, advisory locks, planner settings) keep
their branch beside the query they serve.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from psycopg.errors import UniqueViolation
from sqlalchemy import (
    ColumnElement,
    Connection,
    DateTime,
    Insert,
    Integer,
    Table,
    and_,
    bindparam,
    func,
    or_,
    select,
    tuple_,
)
from sqlalchemy.dialects import postgresql, sqlite

from service.db import foreground


def keys_in(
    conn: Connection, table: Table, keys: Sequence[tuple[int, datetime]]
) -> ColumnElement[bool]:
    """Whether a row's (gpu_id, bucket_start) is one of ``keys`` (at most 500), written so each
    planner probes the index on those columns: SQLite scans the whole table for a row-value
    IN, so there it is an OR of equalities. PostgreSQL gets the keys as two arrays: two
    parameters, where a list of pairs is two per key and costs more to compile and send than
    to run."""
    c = table.c
    if conn.dialect.name == "postgresql":
        ids = bindparam(None, [g for g, _ in keys], type_=postgresql.ARRAY(Integer))
        starts = bindparam(None, [b for _, b in keys], type_=postgresql.ARRAY(DateTime(True)))
        pairs = func.unnest(ids, starts).table_valued("gpu_id", "bucket_start").render_derived()
        return tuple_(c.gpu_id, c.bucket_start).in_(select(pairs.c.gpu_id, pairs.c.bucket_start))
    return or_(*(and_(c.gpu_id == g, c.bucket_start == b) for g, b in keys))


def insert_ignore(conn: Connection, table: Table, index_elements: Sequence[str]) -> Insert:
    """``INSERT ... ON CONFLICT (index_elements) DO NOTHING`` for the connection's dialect."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing(index_elements=list(index_elements))
    return sqlite.insert(table).on_conflict_do_nothing(index_elements=list(index_elements))


def bulk_insert_ignore(
    conn: Connection, table: Table, index_elements: Sequence[str], rows: Sequence[dict[str, Any]]
) -> int:
    """Insert ``rows`` in one statement, skipping keys already present; returns rows inserted."""
    return _bulk_insert(conn, table, tuple(index_elements), rows)


def bulk_insert(conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> int:
    """Insert ``rows`` in one statement into a table without a unique key; returns rows inserted."""
    return _bulk_insert(conn, table, (), rows)


def _bulk_insert(
    conn: Connection, table: Table, keys: tuple[str, ...], rows: Sequence[dict[str, Any]]
) -> int:
    """Insert ``rows``, skipping those whose ``keys`` are present (none skipped without keys)."""
    if not rows:
        return 0
    if conn.dialect.name != "postgresql":
        # sqlite3's executemany loops in C: already the fastest path there.
        stmt = insert_ignore(conn, table, keys) if keys else table.insert()
        return int(conn.execute(stmt, list(rows)).rowcount or 0)
    # One statement whose rows arrive as a single JSON parameter that PostgreSQL expands in C:
    # one round trip and one constant query text, instead of a bind parameter per value.
    sql = _json_insert_sql(table.name, tuple(rows[0]), keys)
    payload = json.dumps(list(rows), default=_json_default, separators=(",", ":"))
    return int(conn.exec_driver_sql(sql, (payload,)).rowcount or 0)


def _json_default(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot store {type(value).__name__} in a bulk insert")


@lru_cache(maxsize=64)
def _json_insert_sql(table: str, cols: tuple[str, ...], keys: tuple[str, ...]) -> str:
    quoted = ", ".join(f'"{c}"' for c in cols)
    conflict = ", ".join(f'"{c}"' for c in keys)
    return (
        f'INSERT INTO "{table}" ({quoted}) SELECT {quoted} '
        f'FROM json_populate_recordset(NULL::"{table}", %s::json)'
        + (f" ON CONFLICT ({conflict}) DO NOTHING" if keys else "")
    )


def copy_insert_ignore(
    conn: Connection,
    table: Table,
    index_elements: Sequence[str],
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
) -> int:
    """Insert ``rows`` (tuples in ``columns`` order), skipping keys already present; returns rows
    inserted. On PostgreSQL by COPY: in a savepoint, so a batch holding a stored key (a batch
    sent again) is rolled back to it and inserted skipping those keys instead."""
    if not rows:
        return 0
    if conn.dialect.name != "postgresql":
        return bulk_insert_ignore(conn, table, index_elements, _as_dicts(columns, rows))
    raw = conn.connection.driver_connection
    assert raw is not None  # a connection in use has its driver's
    sql = _copy_sql(table.name, tuple(columns))
    types = _column_types(conn, table.name, tuple(columns))
    foreground.wrote(conn)  # the COPY goes past SQLAlchemy's statement events
    try:
        with conn.begin_nested(), raw.cursor() as cur, cur.copy(sql) as copy:
            copy.set_types(types)
            for row in rows:
                copy.write_row(row)
        return len(rows)
    except UniqueViolation:
        pass
    return bulk_insert_ignore(conn, table, index_elements, _as_dicts(columns, rows))


def _as_dicts(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(columns, r, strict=True)) for r in rows]


# The type OIDs of (table, columns), read once per process: binary COPY sends each value in
# its column's type, and the schema does not change under a running process.
_TYPES: dict[tuple[str, tuple[str, ...]], list[int]] = {}


def _column_types(conn: Connection, table: str, columns: tuple[str, ...]) -> list[int]:
    key = (table, columns)
    if key not in _TYPES:
        found: dict[str, int] = dict(
            conn.exec_driver_sql(
                "SELECT attname, atttypid::int FROM pg_attribute "
                "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
                (table,),
            ).all()
        )
        _TYPES[key] = [int(found[c]) for c in columns]
    return _TYPES[key]


@lru_cache(maxsize=64)
def _copy_sql(table: str, cols: tuple[str, ...]) -> str:
    quoted = ", ".join(f'"{c}"' for c in cols)
    return f'COPY "{table}" ({quoted}) FROM STDIN (FORMAT BINARY)'
