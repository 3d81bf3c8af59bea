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
from service.db.schema import (
    CUMULATIVE_FIELDS,
    gpus,
    job_gpus,
    jobs,
    nodes,
    rollup_1h,
    rollup_1m,
    samples,
)
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


def _sum_by_buckets(
    conn: Connection,
    *,
    spans: Sequence[tuple[int, int, datetime, datetime, float]],
    out: list[Usage],
    thresholds: Thresholds,
    raw_cutoff: datetime,
) -> None:
    """Add to ``out`` each span's usage summed bucket by bucket (for spans past 1m retention).

    Whole hours come from 1h buckets, whole minutes at the edges from 1m buckets and the
    seconds at the edges from raw samples; seconds before ``raw_cutoff`` (raw retention) are
    taken pro rata from their 1m bucket.
    """
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


_N = len(CUMULATIVE_FIELDS)
_ZERO = (0.0,) * _N
_OWN = ", ".join(f"COALESCE(r.{f}, 0)" for f in CUMULATIVE_FIELDS)
_CUM = ", ".join(f"r.cum_{f}" for f in CUMULATIVE_FIELDS)
_SQLITE_TS = "strftime('%Y-%m-%d %H:%M:%S', {}, 'unixepoch') || '.000000'"


def _lookup_sql(pg: bool, before: bool) -> str:
    """For each cut (k, gpu_id, t): the GPU's last 1m bucket before t (or, with ``before``
    false, its first at or after t), whether that is the minute just before t, its own
    values and its running totals. Each cut is one probe of the primary key, backwards or
    forwards: PostgreSQL through LATERAL, SQLite through a correlated subquery."""
    op, order = ("<", "DESC") if before else (">=", "ASC")
    if pg:
        return (
            f"SELECT c.k, r.bucket_start = to_timestamp(c.t - 60), {_OWN}, {_CUM} "
            "FROM unnest(%(k)s::int[], %(g)s::int[], %(t)s::float8[]) AS c(k, gpu_id, t) "
            "JOIN LATERAL (SELECT * FROM rollup_1m x WHERE x.gpu_id = c.gpu_id "
            f"  AND x.bucket_start {op} to_timestamp(c.t) "
            f"  ORDER BY x.bucket_start {order} LIMIT 1) r ON true"
        )
    return (
        f"SELECT c.k, r.bucket_start = {_SQLITE_TS.format('c.t - 60')}, {_OWN}, {_CUM} "
        "FROM gw_cost_cuts c JOIN rollup_1m r ON r.gpu_id = c.gpu_id AND r.bucket_start = "
        "  (SELECT x.bucket_start FROM rollup_1m x WHERE x.gpu_id = c.gpu_id "
        f"   AND x.bucket_start {op} {_SQLITE_TS.format('c.t')} "
        f"   ORDER BY x.bucket_start {order} LIMIT 1)"
    )


Found = dict[int, tuple[bool, tuple[float, ...], tuple[float, ...]]]


def _lookup_cuts(
    conn: Connection, cuts: Sequence[tuple[int, int, float]], *, before: bool = True
) -> Found:
    """Per cut (k, gpu_id, minute t as Unix seconds) the bucket ``_lookup_sql`` finds, as
    k -> (it is the minute before t, own values, running totals); cuts it finds none for
    are left out."""
    if not cuts:
        return {}
    pg = conn.dialect.name == "postgresql"
    if pg:
        params = {"k": [k for k, _, _ in cuts], "g": [g for _, g, _ in cuts],
                  "t": [t for _, _, t in cuts]}  # fmt: skip
        raw: Any = conn.connection.dbapi_connection
        with raw.cursor() as cur:
            rows = cur.execute(_lookup_sql(pg, before), params).fetchall()
    else:
        conn.exec_driver_sql(
            "CREATE TEMPORARY TABLE IF NOT EXISTS gw_cost_cuts (k integer, gpu_id integer, t real)"
        )
        conn.exec_driver_sql("DELETE FROM gw_cost_cuts")
        conn.exec_driver_sql("INSERT INTO gw_cost_cuts VALUES (?, ?, ?)", list(cuts))
        rows = conn.exec_driver_sql(_lookup_sql(pg, before)).fetchall()
    return {r[0]: (bool(r[1]), tuple(r[2 : 2 + _N]), tuple(r[2 + _N :])) for r in rows}


def _sum_by_totals(
    conn: Connection,
    *,
    spans: Sequence[tuple[int, int, datetime, datetime, float]],
    out: list[Usage],
    thresholds: Thresholds,
    raw_cutoff: datetime,
) -> None:
    """Add to ``out`` each span's usage as the difference of 1m running totals at its edges.

    The whole minutes of [start, end) are totals(ceil(end)) - totals(ceil(start)), less the
    parts of the edge minutes outside the span; those parts are read from raw samples where
    raw retention still holds them (after ``raw_cutoff``), else taken pro rata from the bucket.
    """
    cut_index: dict[tuple[int, int], int] = {}
    plans = []
    raw_reads: list[tuple[int, int, datetime, datetime, float]] = []
    raw_from = raw_cutoff.timestamp()
    for grp, gpu_id, start, end, factor in spans:
        s, e = start.timestamp(), end.timestamp()
        s_ceil, e_ceil = -(-s // 60) * 60, -(-e // 60) * 60
        e_floor = e - e % 60
        left_raw, right_raw = s >= raw_from, e_floor >= raw_from
        if left_raw and s_ceil > e_floor:  # inside one minute: all of it from raw samples
            raw_reads.append((grp, gpu_id, start, end, factor))
            continue
        ks = cut_index.setdefault((gpu_id, int(s_ceil)), len(cut_index))
        ke = cut_index.setdefault((gpu_id, int(e_ceil)), len(cut_index))
        # Weights of the edge minutes' own buckets: totals(ceil) counts all of each edge
        # minute; the part outside the span is dropped pro rata, or all of it where raw
        # samples give the seconds inside the span instead.
        if left_raw:
            w_start = 0.0
            if s < s_ceil:
                raw_reads.append((grp, gpu_id, start, _utc(s_ceil), factor))
        else:
            w_start = (s_ceil - s) / 60.0
        if right_raw and e_floor < e:
            w_end = 1.0
            raw_reads.append((grp, gpu_id, _utc(e_floor), end, factor))
        else:
            w_end = (e_ceil - e) / 60.0
        plans.append((grp, factor, ks, w_start, ke, w_end))
    cuts = [(k, g, float(t)) for k, (g, t) in enumerate(cut_index)]
    found = _lookup_cuts(conn, cuts)
    # A cut before a GPU's first kept bucket: the totals there are that bucket's minus its own.
    after = _lookup_cuts(conn, [c for c in cuts if c[0] not in found], before=False)
    totals: list[tuple[float, ...]] = []
    owns: list[tuple[float, ...] | None] = []
    for k in range(len(cuts)):
        hit = found.get(k)
        if hit is not None:
            totals.append(hit[2])
            owns.append(hit[1] if hit[0] else None)
        elif k in after:
            _, own, cum = after[k]
            totals.append(tuple(c - o for c, o in zip(cum, own, strict=True)))
            owns.append(None)
        else:  # no bucket at all for this GPU
            totals.append(_ZERO)
            owns.append(None)
    acc = [[0.0] * _N for _ in range(len(out))]
    for grp, factor, ks, w_start, ke, w_end in plans:
        # (totals at end - own x w_end) - (totals at start - own x w_start)
        diff = [y - x for x, y in zip(totals[ks], totals[ke], strict=True)]
        own_start, own_end = owns[ks], owns[ke]
        if own_start is not None and w_start:
            diff = [d + w_start * o for d, o in zip(diff, own_start, strict=True)]
        if own_end is not None and w_end:
            diff = [d - w_end * o for d, o in zip(diff, own_end, strict=True)]
        row = acc[grp]
        for i in range(_N):
            row[i] += factor * diff[i]
    for grp, row in enumerate(acc):
        if any(row):
            out[grp].add(Usage(*row))
    if raw_reads:
        _raw(conn, raw_reads, out, thresholds)


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def sum_usage(
    conn: Connection,
    *,
    spans: Sequence[tuple[int, int, datetime, datetime, float]],
    n_groups: int,
    thresholds: Thresholds,
    raw_cutoff: datetime,
    minute_cutoff: datetime,
) -> list[Usage]:
    """Per group, the sum of factor x Usage over its spans (group, gpu_id, start, end, factor).

    Spans inside 1m retention (from ``minute_cutoff``) are read from the 1m running totals,
    older ones bucket by bucket from the 1h and 1m rollups.
    """
    out = [Usage() for _ in range(n_groups)]
    recent = [sp for sp in spans if sp[2] >= minute_cutoff]
    old = [sp for sp in spans if sp[2] < minute_cutoff]
    if recent:
        _sum_by_totals(conn, spans=recent, out=out, thresholds=thresholds, raw_cutoff=raw_cutoff)
    if old:
        _sum_by_buckets(conn, spans=old, out=out, thresholds=thresholds, raw_cutoff=raw_cutoff)
    return out
