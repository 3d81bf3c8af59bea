"""Reads for cost reports: GPUs, job allocations and the waste integrals of many spans at once."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Float,
    Integer,
    MetaData,
    Table,
    and_,
    func,
    or_,
    select,
)

from service.costs.integrals import ActivityPoint, Thresholds, integrate
from service.costs.waste import USAGE_FIELDS, Allocation, Usage, plan_reads
from service.db.schema import gpus, job_gpus, jobs, nodes, rollup_1h, rollup_1m, samples
from service.db.types import UTCDateTime

CHUNK = 1500  # spans per statement: 4 bound values each stays under SQLite's 32766 limit
_INTEGRALS = USAGE_FIELDS[:6]


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """What a report needs of a GPU: its id, uuid, model and node."""

    id: int
    uuid: str
    model: str
    node: str


def load_gpus(conn: Connection, *, gpu_ids: Sequence[int] | None = None) -> dict[int, GpuInfo]:
    """The GPUs (all, or ``gpu_ids``) by internal id."""
    q = select(gpus.c.id, gpus.c.uuid, gpus.c.model, nodes.c.hostname).join(
        nodes, nodes.c.id == gpus.c.node_id
    )
    if gpu_ids is not None:
        q = q.where(gpus.c.id.in_(list(gpu_ids)))
    return {r.id: GpuInfo(r.id, r.uuid, r.model, r.hostname) for r in conn.execute(q)}


def load_allocations(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    gpu_ids: Sequence[int] | None = None,
) -> list[Allocation]:
    """Every (job, GPU) interval overlapping [start, end); open ones end at the job's end or now."""
    q = (
        select(
            job_gpus.c.job_id,
            job_gpus.c.gpu_id,
            job_gpus.c.started_at,
            job_gpus.c.ended_at,
            jobs.c.ended_at.label("job_ended_at"),
        )
        .join(jobs, jobs.c.id == job_gpus.c.job_id)
        .where(
            job_gpus.c.started_at < end,
            or_(job_gpus.c.ended_at.is_(None), job_gpus.c.ended_at > start),
        )
    )
    if gpu_ids is not None:
        q = q.where(job_gpus.c.gpu_id.in_(list(gpu_ids)))
    out = []
    for r in conn.execute(q):
        stop = r.ended_at or r.job_ended_at or now
        out.append(Allocation(r.job_id, r.gpu_id, r.started_at, min(stop, now)))
    return out


def load_jobs(conn: Connection, *, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The jobs rows of ``job_ids`` as dicts, by id."""
    out: dict[str, dict[str, Any]] = {}
    ids = list(job_ids)
    for i in range(0, len(ids), CHUNK):
        for r in conn.execute(select(jobs).where(jobs.c.id.in_(ids[i : i + CHUNK]))):
            out[r.id] = dict(r._mapping)
    return out


# Per-connection scratch tables: the database sums thousands of ranges in one statement by
# joining them to the rollups (a VALUES list of that size is slow to build and plan).
_HOUR_SLOTS = (("ha0", "ha1"), ("hb0", "hb1"), ("hc0", "hc1"))
_MINUTE_SLOTS = (("ma0", "ma1", "ma_sign"), ("mb0", "mb1", "mb_sign"))
_SEGMENT_COLS = ("grp", "gpu_id", "factor", "ha0", "ha1", "hb0", "hb1", "hc0", "hc1",
                 "ma0", "ma1", "ma_sign", "mb0", "mb1", "mb_sign", "pl", "pl_frac",
                 "pr", "pr_frac")  # fmt: skip
_TS_COLS = {"ha0", "ha1", "hb0", "hb1", "hc0", "hc1", "ma0", "ma1", "mb0", "mb1", "pl", "pr",
            "lo", "hi"}  # fmt: skip
_INT_COLS = {"grp", "gpu_id", "ma_sign", "mb_sign"}


def _scratch(name: str, cols: Sequence[str]) -> Table:
    def col(c: str) -> Column[Any]:
        if c in _TS_COLS:
            return Column(c, UTCDateTime())
        return Column(c, Integer if c in _INT_COLS else Float)

    return Table(name, MetaData(), *(col(c) for c in cols), prefixes=["TEMPORARY"])


_SEGMENTS = _scratch("gw_cost_segments", _SEGMENT_COLS)
_RAW = _scratch("gw_cost_raw", ("grp", "gpu_id", "lo", "hi"))


def _sqlite_ts(ts: datetime | None) -> str | None:
    # The text form UTCDateTime stores on SQLite, so comparisons with bucket_start hold.
    return None if ts is None else ts.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _sql_type(col: str, pg: bool) -> str:
    if col in _TS_COLS:
        return "timestamptz" if pg else "DATETIME"
    if col in _INT_COLS:
        return "integer"
    return "double precision" if pg else "REAL"


def _fill(conn: Connection, table: Table, rows: Sequence[tuple[Any, ...]]) -> None:
    """Create (if needed), empty and fill scratch ``table`` with ``rows``, then analyze it."""
    pg = conn.dialect.name == "postgresql"
    cols = [c.name for c in table.columns]
    ddl = ", ".join(f"{c} {_sql_type(c, pg)}" for c in cols)
    conn.exec_driver_sql(f"CREATE TEMPORARY TABLE IF NOT EXISTS {table.name} ({ddl})")
    # TRUNCATE on PostgreSQL: a DELETE would leave dead rows every later query must skip.
    conn.exec_driver_sql(f"{'TRUNCATE' if pg else 'DELETE FROM'} {table.name}")
    if pg:
        raw: Any = conn.connection.dbapi_connection  # psycopg 3: COPY is its fastest load
        with (
            raw.cursor() as cur,
            cur.copy(f"COPY {table.name} ({', '.join(cols)}) FROM STDIN") as cp,
        ):
            for r in rows:
                cp.write_row(r)
    else:
        ts_idx = [i for i, c in enumerate(cols) if c in _TS_COLS]
        fixed = []
        for r in rows:
            row = list(r)
            for i in ts_idx:
                row[i] = _sqlite_ts(row[i])
            fixed.append(tuple(row))
        marks = ", ".join("?" for _ in cols)
        conn.exec_driver_sql(f"INSERT INTO {table.name} VALUES ({marks})", fixed)
    # Without statistics the planners take the scratch table for a big one and scan the
    # rollups instead of probing them by (gpu_id, bucket_start) once per row.
    conn.exec_driver_sql(f"ANALYZE {table.name}")


_PG_PROBE_SETTINGS = ("enable_hashjoin", "enable_mergejoin", "jit")


def _prefer_index_probes(conn: Connection, on: bool) -> None:
    """On PostgreSQL, make the span joins probe the rollups' primary key once per span.

    The planner cannot estimate range joins and would hash-join a full scan of rollup_1m
    (tens of millions of rows) instead; JIT only adds compile time to these short queries.
    """
    if conn.dialect.name != "postgresql":
        return
    for name in _PG_PROBE_SETTINGS:
        conn.exec_driver_sql(f"SET LOCAL {name} = {'off' if on else 'DEFAULT'}")


def _bucket_sums(
    conn: Connection, table: Table, lo: str, hi: str | None, weight: Any, out: list[Usage]
) -> None:
    """Add, per group, the rollup sums of [lo, hi) (or the bucket at lo) times ``weight``."""
    t, s = table.c, _SEGMENTS.c
    cols = [func.sum(t[f] * weight) for f in _INTEGRALS] + [
        func.sum(t[c] * weight)
        for c in (
            "tensor_active_sum",
            "tensor_active_count",
            "dram_active_sum",
            "dram_active_count",
        )
    ]
    on: Any
    where: Any
    if hi is None:
        on = and_(t.gpu_id == s.gpu_id, t.bucket_start == s[lo])
        where = s[lo].is_not(None)
    else:
        on = and_(t.gpu_id == s.gpu_id, t.bucket_start >= s[lo], t.bucket_start < s[hi])
        where = s[lo] < s[hi]
    q = select(s.grp, *cols).select_from(_SEGMENTS.join(table, on)).where(where).group_by(s.grp)
    for row in conn.execute(q):
        u = out[row[0]]
        for f, value in zip(USAGE_FIELDS, row[1:], strict=True):
            if value is not None:
                setattr(u, f, getattr(u, f) + float(value))


def _raw(
    conn: Connection,
    reads: list[tuple[int, int, datetime, datetime, float]],
    out: list[Usage],
    thresholds: Thresholds,
) -> None:
    """Integrate raw samples over each read (grp, gpu_id, lo, hi, factor) into ``out[grp]``."""
    gap = timedelta(seconds=thresholds.max_gap_seconds)
    s = samples.c
    _fill(conn, _RAW, [(j, g, lo - gap, hi) for j, (_, g, lo, hi, _f) in enumerate(reads)])
    v = _RAW.c
    q = (
        select(v.grp, s.ts, s.sm_active, s.gpu_util, s.fb_used_bytes, s.power_watts,
               s.tensor_active, s.dram_active)
        .select_from(_RAW.join(samples, and_(s.gpu_id == v.gpu_id, s.ts >= v.lo, s.ts < v.hi)))
        .order_by(v.grp, s.ts)
    )  # fmt: skip
    grouped: dict[int, list[Any]] = defaultdict(list)
    for row in conn.execute(q):
        grouped[row.grp].append(row)
    for j, rows in grouped.items():
        grp, _, lo, hi, factor = reads[j]
        points = [
            ActivityPoint(r.ts.timestamp(), r.sm_active, r.gpu_util, r.fb_used_bytes, r.power_watts)
            for r in rows
        ]
        integ = integrate(points, lo.timestamp(), hi.timestamp(), thresholds)
        part = Usage(**{f: getattr(integ, f) for f in _INTEGRALS})
        for r in rows:
            if lo <= r.ts < hi:
                if r.tensor_active is not None:
                    part.tensor_active_sum += r.tensor_active
                    part.tensor_active_count += 1
                if r.dram_active is not None:
                    part.dram_active_sum += r.dram_active
                    part.dram_active_count += 1
        out[grp].add(part, factor)


def sum_usage(
    conn: Connection,
    *,
    spans: Sequence[tuple[int, int, datetime, datetime, float]],
    n_groups: int,
    thresholds: Thresholds,
    raw_cutoff: datetime,
) -> list[Usage]:
    """Per group, the sum of factor x Usage over its spans (group, gpu_id, start, end, factor).

    Whole hours come from 1h buckets, whole minutes at the edges from 1m buckets and the
    seconds at the edges from raw samples; seconds before ``raw_cutoff`` (raw retention) are
    taken pro rata from their 1m bucket.
    """
    out = [Usage() for _ in range(n_groups)]
    rows: list[tuple[Any, ...]] = []
    raw: list[tuple[int, int, datetime, datetime, float]] = []
    for grp, gpu_id, start, end, factor in spans:
        row: dict[str, Any] = dict.fromkeys(_SEGMENT_COLS)
        row.update(grp=grp, gpu_id=gpu_id, factor=factor)
        hour_slots, minute_slots = iter(_HOUR_SLOTS), iter(_MINUTE_SLOTS)
        for r in plan_reads(start, end):
            if r.kind == "1h":
                a, b = next(hour_slots)
                row[a], row[b] = r.start, r.end
            elif r.kind == "1m":
                a, b, sign = next(minute_slots)
                row[a], row[b], row[sign] = r.start, r.end, r.sign
            elif r.start >= raw_cutoff:
                raw.append((grp, gpu_id, r.start, r.end, factor))
            else:
                bucket = r.start - timedelta(seconds=r.start.timestamp() % 60)
                slot = "pl" if row["pl"] is None else "pr"
                row[slot] = bucket
                row[f"{slot}_frac"] = (r.end - r.start).total_seconds() / 60.0
        rows.append(tuple(row[c] for c in _SEGMENT_COLS))
    if rows:
        _fill(conn, _SEGMENTS, rows)
        s = _SEGMENTS.c
        _prefer_index_probes(conn, True)
        for a, b in _HOUR_SLOTS:
            _bucket_sums(conn, rollup_1h, a, b, s.factor, out)
        for a, b, sign in _MINUTE_SLOTS:
            _bucket_sums(conn, rollup_1m, a, b, s.factor * s[sign], out)
        _bucket_sums(conn, rollup_1m, "pl", None, s.factor * s.pl_frac, out)
        _bucket_sums(conn, rollup_1m, "pr", None, s.factor * s.pr_frac, out)
        _prefer_index_probes(conn, False)
    if raw:
        _raw(conn, raw, out, thresholds)
    return out


def fetch_usage(
    conn: Connection,
    *,
    spans: Sequence[tuple[int, datetime, datetime]],
    thresholds: Thresholds,
    raw_cutoff: datetime,
) -> list[Usage]:
    """The Usage of each (gpu_id, start, end), read as ``sum_usage`` reads it."""
    return sum_usage(
        conn,
        spans=[(k, g, s, e, 1.0) for k, (g, s, e) in enumerate(spans)],
        n_groups=len(spans),
        thresholds=thresholds,
        raw_cutoff=raw_cutoff,
    )
