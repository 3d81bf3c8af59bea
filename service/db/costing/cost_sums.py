"""The waste integrals of many spans at once: from 1m running totals, or bucket by bucket."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from sqlalchemy import Connection, Table, and_, func, select

from service.costs.integrals import (
    CAUSE_ENERGY_FIELDS,
    CAUSE_FIELDS,
    SIGNAL_FIELDS,
    Thresholds,
)
from service.costs.waste import Span, Usage, plan_reads
from service.db.cost_scratch import fill, scratch_table
from service.db.costing.raw_sums import pg_local, sum_raw
from service.db.schema import CUMULATIVE_FIELDS, rollup_1h, rollup_1m

# The seconds (and signals) per cause beside the waste integrals (idle_held_seconds is both).
_CAUSE_ONLY = (frozenset(CAUSE_FIELDS) - {"idle_held_seconds"}) | frozenset(SIGNAL_FIELDS)


def summed_fields(*, causes: bool, cause_energy: bool = False) -> tuple[str, ...]:
    """The Usage fields a report sums: all of them but the energy per cause (with
    ``cause_energy``: those too), and (``causes`` False) without the seconds per cause; what
    is not summed reads 0."""
    left_out = (set() if causes else _CAUSE_ONLY) | (
        set() if cause_energy else set(CAUSE_ENERGY_FIELDS)
    )
    return tuple(name for name in CUMULATIVE_FIELDS if name not in left_out)


def _usage_of(fields: Sequence[str], values: Sequence[Any]) -> Usage:
    usage = Usage()
    for name, value in zip(fields, values, strict=True):
        if value is not None:
            setattr(usage, name, float(value))
    return usage


def _add_row(usage: Usage, fields: Sequence[str], values: Sequence[Any]) -> None:
    """Add a row's sums of ``fields`` (None: nothing) into ``usage``: as ``usage.add`` of
    ``_usage_of`` would, without the Usage between (a report adds thousands of rows)."""
    for name, value in zip(fields, values, strict=True):
        if value is not None:
            setattr(usage, name, getattr(usage, name) + float(value))


# Per-connection scratch tables the spans are loaded into, one row a span.
_HOUR_SLOTS = (("ha0", "ha1"), ("hb0", "hb1"), ("hc0", "hc1"))
_MINUTE_SLOTS = (("ma0", "ma1", "ma_sign"), ("mb0", "mb1", "mb_sign"))
_SEGMENT_COLS = ("grp", "gpu_id", "factor", "ha0", "ha1", "hb0", "hb1", "hc0", "hc1",
                 "ma0", "ma1", "ma_sign", "mb0", "mb1", "mb_sign", "pl", "pl_frac",
                 "pr", "pr_frac")  # fmt: skip
_SEGMENTS = scratch_table(
    "gw_cost_segments",
    _SEGMENT_COLS,
    timestamps={"ha0", "ha1", "hb0", "hb1", "hc0", "hc1", "ma0", "ma1", "mb0", "mb1", "pl", "pr"},
    integers={"grp", "gpu_id", "ma_sign", "mb_sign"},
)


def _bucket_sums(
    conn: Connection, table: Table, lo: str, hi: str | None, weight: Any, out: list[Usage],
    fields: Sequence[str],
) -> None:  # fmt: skip
    """Add, per group, the rollup sums of ``fields`` over [lo, hi) (or the bucket at lo) times
    ``weight``."""
    bucket, seg = table.c, _SEGMENTS.c
    sums = [func.sum(bucket[name] * weight) for name in fields]
    on: Any
    where: Any
    if hi is None:
        on = and_(bucket.gpu_id == seg.gpu_id, bucket.bucket_start == seg[lo])
        where = seg[lo].is_not(None)
    else:
        on = and_(
            bucket.gpu_id == seg.gpu_id,
            bucket.bucket_start >= seg[lo],
            bucket.bucket_start < seg[hi],
        )
        where = seg[lo] < seg[hi]
    query = (
        select(seg.grp, *sums).select_from(_SEGMENTS.join(table, on)).where(where).group_by(seg.grp)
    )
    for row in conn.execute(query):
        out[row[0]].add(_usage_of(fields, row[1:]))


def _sum_by_buckets(
    conn: Connection,
    *,
    spans: Sequence[Span],
    out: list[Usage],
    thresholds: Thresholds,
    raw_cutoff: datetime,
    fields: Sequence[str],
) -> None:
    """Add to ``out`` each span's usage summed bucket by bucket (for spans past 1m retention).

    Whole hours come from 1h buckets, whole minutes at the edges from 1m buckets and the
    seconds at the edges from raw samples; seconds before ``raw_cutoff`` (raw retention) are
    taken pro rata from their 1m bucket.
    """
    rows: list[tuple[Any, ...]] = []
    raw: list[Span] = []
    for grp, gpu_id, start, end, factor in spans:
        row: dict[str, Any] = dict.fromkeys(_SEGMENT_COLS)
        row.update(grp=grp, gpu_id=gpu_id, factor=factor)
        hour_slots, minute_slots = iter(_HOUR_SLOTS), iter(_MINUTE_SLOTS)
        for read in plan_reads(start, end):
            if read.kind == "1h":
                lo, hi = next(hour_slots)
                row[lo], row[hi] = read.start, read.end
            elif read.kind == "1m":
                lo, hi, sign = next(minute_slots)
                row[lo], row[hi], row[sign] = read.start, read.end, read.sign
            elif read.start >= raw_cutoff:
                raw.append(Span(grp, gpu_id, read.start, read.end, factor))
            else:
                bucket = read.start - timedelta(seconds=read.start.timestamp() % 60)
                slot = "pl" if row["pl"] is None else "pr"
                row[slot] = bucket
                row[f"{slot}_frac"] = (read.end - read.start).total_seconds() / 60.0
        rows.append(tuple(row[col] for col in _SEGMENT_COLS))
    if rows:
        fill(conn, _SEGMENTS, rows)
        seg = _SEGMENTS.c
        # The planner cannot estimate these range joins and would hash-join a full scan of
        # rollup_1m instead of probing its key once per span; JIT only adds compile time.
        with pg_local(conn, enable_hashjoin="off", enable_mergejoin="off", jit="off"):
            for lo, hi in _HOUR_SLOTS:
                _bucket_sums(conn, rollup_1h, lo, hi, seg.factor, out, fields)
            for lo, hi, sign in _MINUTE_SLOTS:
                _bucket_sums(conn, rollup_1m, lo, hi, seg.factor * seg[sign], out, fields)
            _bucket_sums(conn, rollup_1m, "pl", None, seg.factor * seg.pl_frac, out, fields)
            _bucket_sums(conn, rollup_1m, "pr", None, seg.factor * seg.pr_frac, out, fields)
    if raw:
        sum_raw(conn, raw, out, thresholds, fields)


_SQLITE_TS = "strftime('%Y-%m-%d %H:%M:%S', {}, 'unixepoch') || '.000000'"


@cache
def _totals_sql(pg: bool, fields: tuple[str, ...]) -> str:
    """Per group, the sum over its terms of f x (T(k) - w x O(k)).

    Cuts are (k, gpu_id, ts, prev_ts): ts a minute and prev_ts the minute before, in their
    stored form. T(k) is the GPU's running total before ts: the totals of its last bucket
    before ts (one probe of the primary key, backwards), or where it has none, those of its
    first bucket after ts less that bucket's own values. O(k) is the bucket at prev_ts if it
    exists, else 0.
    Terms are (grp, k, w, f): a span adds +f at the cut after its end and -f at the cut
    after its start, each with the weight w of that minute's own bucket to take off (the
    sum adds up a group's terms, so repeated ones need no merging).
    """
    n = len(fields)
    own = ", ".join(f"COALESCE(b.{name}, 0) AS o{i}" for i, name in enumerate(fields))
    totals = ", ".join(
        f"COALESCE(b.cum_{name}, a.cum_{name} - COALESCE(a.{name}, 0), 0) AS t{i}"
        for i, name in enumerate(fields)
    )
    masked = ", ".join(f"CASE WHEN q.prev THEN q.o{i} ELSE 0 END AS o{i}" for i in range(n))
    sums = ", ".join(f"SUM(tm.f * (lk.t{i} - tm.w * lk.o{i}))" for i in range(n))
    if pg:
        # Integers travel as one comma-joined string each and floats as binary arrays:
        # the cheapest forms to build in Python for 45 k spans (psycopg dumps list
        # elements one by one in Python; str.join runs in C).
        cuts = (
            "(SELECT k - 1 AS k, gpu_id, to_timestamp(m * 60) AS ts, "
            "  to_timestamp(m * 60 - 60) AS prev_ts FROM unnest("
            "  string_to_array(%(gpu)s, ',')::int4[], string_to_array(%(c)s, ',')::int4[]) "
            "  WITH ORDINALITY AS cuts(gpu_id, m, k) "
            "  ORDER BY gpu_id, m) cuts "  # in key order, so consecutive probes share pages
        )
        terms = (
            "unnest(string_to_array(%(grp)s, ',')::int4[], string_to_array(%(k)s, ',')::int4[], "
            "  %(w)b::float8[], %(f)b::float8[]) AS tm(grp, k, w, f)"
        )
        probes = (
            "LEFT JOIN LATERAL (SELECT * FROM rollup_1m x WHERE x.gpu_id = cuts.gpu_id "
            "  AND x.bucket_start < cuts.ts "
            "  ORDER BY x.bucket_start DESC LIMIT 1) b ON true "
            "LEFT JOIN LATERAL (SELECT * FROM rollup_1m x WHERE b.gpu_id IS NULL "
            "  AND x.gpu_id = cuts.gpu_id AND x.bucket_start >= cuts.ts "
            "  ORDER BY x.bucket_start LIMIT 1) a ON true "
        )
    else:
        cuts, terms = "gw_cost_cuts cuts", "gw_cost_terms tm"
        # Rows are found by rowid (the subquery reads it from the primary-key index, so the
        # join needs no second descent), and the fallback probe runs only where the first
        # found nothing (CASE short-circuits; a bare AND would still evaluate the subquery).
        probes = (
            "LEFT JOIN rollup_1m b ON b.rowid = "
            "  (SELECT x.rowid FROM rollup_1m x WHERE x.gpu_id = cuts.gpu_id "
            "   AND x.bucket_start < cuts.ts ORDER BY x.bucket_start DESC LIMIT 1) "
            "LEFT JOIN rollup_1m a ON a.rowid = CASE WHEN b.rowid IS NULL THEN "
            "  (SELECT x.rowid FROM rollup_1m x WHERE x.gpu_id = cuts.gpu_id "
            "   AND x.bucket_start >= cuts.ts ORDER BY x.bucket_start LIMIT 1) END "
        )
    return (
        f"WITH lk AS MATERIALIZED (SELECT q.k, {masked}, {', '.join(f'q.t{i}' for i in range(n))} "
        f"  FROM (SELECT cuts.k, b.bucket_start = cuts.prev_ts AS prev, {own}, {totals} "
        f"    FROM {cuts} {probes}) q) "
        f"SELECT tm.grp, {sums} FROM {terms} JOIN lk ON lk.k = tm.k GROUP BY tm.grp"
    )


class _Terms:
    """Cuts and terms for ``_totals_sql``, built span by span with plain ints and floats only
    (a 30-day fleet report has 45 k spans; tuples would keep the cyclic GC busy)."""

    __slots__ = ("cut", "cut_keys", "factor", "grp", "weight")

    def __init__(self) -> None:
        self.cut_keys: dict[int, int] = {}  # gpu_id x 2^32 + Unix minute -> k
        self.grp: list[int] = []
        self.cut: list[int] = []
        self.weight: list[float] = []
        self.factor: list[float] = []

    def add(
        self, grp: int, gpu_id: int, start_min: float, w_start: float, end_min: float,
        w_end: float, factor: float,
    ) -> None:  # fmt: skip
        """Add a span: +factor x (value at its end) - factor x (value at its start)."""
        keys = self.cut_keys
        key = (gpu_id << 32) + int(start_min)
        start_cut = keys.get(key)
        if start_cut is None:
            start_cut = keys[key] = len(keys)
        key = (gpu_id << 32) + int(end_min)
        end_cut = keys.get(key)
        if end_cut is None:
            end_cut = keys[key] = len(keys)
        self.grp += (grp, grp)
        self.cut += (start_cut, end_cut)
        self.weight += (w_start, w_end)
        self.factor += (-factor, factor)

    def cuts(self) -> list[tuple[int, int]]:
        """(gpu_id, minute as Unix seconds) by k."""
        return [(key >> 32, (key & 0xFFFFFFFF) * 60) for key in self.cut_keys]


# Cuts from which a PostgreSQL report splits its GPUs in two halves summed on two connections
# at once; below it a second connection costs more than it saves. Not for SQLite: two
# connections to one file measured slower than one.
_PARALLEL_FROM = 2000


def _run_parts(conn: Connection, parts: list[_Terms], fields: tuple[str, ...]) -> list[Any]:
    """The rows of ``_totals_sql`` over every part; when they are big, the parts after the
    first run at the same time on connections of their own, so the database probes with
    several cores (a report is otherwise one query, and its probes are most of its time)."""
    parts = [part for part in parts if part.grp]
    if not parts:
        return []

    def run(on: Connection, part: _Terms) -> list[Any]:
        return _run_totals(on, part.cuts(), (part.grp, part.cut, part.weight, part.factor), fields)

    def run_alone(part: _Terms) -> list[Any]:
        with conn.engine.connect() as other:
            return run(other, part)

    if sum(len(part.cut_keys) for part in parts) < _PARALLEL_FROM:
        return [row for part in parts for row in run(conn, part)]
    with ThreadPoolExecutor(max_workers=len(parts) - 1 or 1) as pool:
        later = [pool.submit(run_alone, part) for part in parts[1:]]
        rows = run(conn, parts[0])
        for future in later:
            rows += future.result()
    return rows


def _sum_by_totals(
    conn: Connection,
    *,
    spans: Sequence[Span],
    out: list[Usage],
    thresholds: Thresholds,
    raw_cutoff: datetime,
    fields: tuple[str, ...],
) -> None:
    """Add to ``out`` each span's usage as the difference of 1m running totals at its edges.

    The whole minutes of [start, end) are totals(ceil(end)) - totals(ceil(start)), less the
    parts of the edge minutes outside the span; those parts are read from raw samples where
    raw retention still holds them (after ``raw_cutoff``), else taken pro rata from the bucket.
    """
    # On PostgreSQL two halves by GPU id, summed on two connections at once (_run_parts).
    parts = [_Terms(), _Terms()] if conn.dialect.name == "postgresql" else [_Terms()]
    part_mask = len(parts) - 1
    raw_reads: list[Span] = []
    raw_from = raw_cutoff.timestamp()
    for span in spans:
        grp, gpu_id, start, end, factor = span
        start_s = start.timestamp()
        end_s = end.timestamp()
        start_min, end_min = -(-start_s // 60), -(-end_s // 60)  # the minutes after each edge
        w_start = start_min - start_s / 60.0  # the parts of those minutes outside, pro rata
        w_end = end_min - end_s / 60.0
        end_floor_s = end_s - end_s % 60
        if start_s >= raw_from or end_floor_s >= raw_from:  # edges raw retention still holds
            if start_s >= raw_from:
                if start_min * 60 > end_floor_s:  # inside one minute: all of it from raw samples
                    raw_reads.append(span)
                    continue
                if w_start:  # the seconds before the first whole minute from raw samples
                    raw_reads.append(Span(grp, gpu_id, start, _utc(start_min * 60), factor))
                w_start = 0.0
            if end_floor_s < end_s:
                w_end = 1.0  # the whole end minute off, and its seconds from raw samples
                raw_reads.append(Span(grp, gpu_id, _utc(end_floor_s), end, factor))
        parts[gpu_id & part_mask].add(grp, gpu_id, start_min, w_start, end_min, w_end, factor)
    for grp, *values in _run_parts(conn, parts, fields):
        _add_row(out[grp], fields, values)
    if raw_reads:
        sum_raw(conn, raw_reads, out, thresholds, fields)


def _run_totals(
    conn: Connection,
    cuts: list[tuple[int, int]],
    terms: tuple[list[int], list[int], list[float], list[float]],
    fields: tuple[str, ...],
) -> list[Any]:
    """Run ``_totals_sql`` over cuts k = index of (gpu_id, minute as Unix seconds) and the
    terms' columns (grp, k, w, f); rows (grp, sums...)."""
    pg = conn.dialect.name == "postgresql"
    grp, cut, weight, factor = terms
    if pg:

        def joined(values: Any) -> str:
            return ",".join(map(str, values))

        params: dict[str, Any] = {
            "gpu": joined(gpu_id for gpu_id, _ in cuts),
            "c": joined(minute_s // 60 for _, minute_s in cuts),  # minutes since the epoch
            "grp": joined(grp),
            "k": joined(cut),
            "w": weight,
            "f": factor,
        }
        raw: Any = conn.connection.dbapi_connection
        # JIT would compile for longer than the query runs (its cost estimate for the probes
        # is far too high); work_mem keeps the joins of 45 k spans in memory.
        with pg_local(conn, jit="off", work_mem="'64MB'"), raw.cursor() as cur:
            result: list[Any] = cur.execute(_totals_sql(pg, fields), params).fetchall()
        return result
    for ddl in (
        "gw_cost_cuts (k integer PRIMARY KEY, gpu_id integer, ts text, prev_ts text)",
        "gw_cost_terms (grp integer, k integer, w real, f real)",
    ):
        conn.exec_driver_sql(f"CREATE TEMPORARY TABLE IF NOT EXISTS {ddl}")
        conn.exec_driver_sql(f"DELETE FROM {ddl.split()[0]}")
    # The minutes in SQLite's stored text form, formatted once per cut (not once per use).
    conn.exec_driver_sql(
        f"INSERT INTO gw_cost_cuts VALUES (?, ?, {_SQLITE_TS.format('?')}, "
        f"{_SQLITE_TS.format('? - 60')})",
        [(k, gpu_id, minute_s, minute_s) for k, (gpu_id, minute_s) in enumerate(cuts)],
    )
    conn.exec_driver_sql(
        "INSERT INTO gw_cost_terms VALUES (?, ?, ?, ?)",
        list(zip(grp, cut, weight, factor, strict=True)),
    )
    return list(conn.exec_driver_sql(_totals_sql(pg, fields)).all())


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def _split_unrolled(
    spans: Sequence[Span], rolled_until: Mapping[int, datetime | None], raw_cutoff: datetime
) -> tuple[list[Span], list[Span]]:
    """Spans cut where their GPU's rollups stop being complete: the parts before (for the
    rollups) and after (for raw samples; never before raw retention, which holds nothing)."""
    rolled: list[Span] = []
    raw: list[Span] = []
    for span in spans:
        until = rolled_until.get(span.gpu_id, span.end)
        cut = max(until or span.start, raw_cutoff, span.start)
        if cut >= span.end:
            rolled.append(span)
            continue
        if span.start < cut:
            rolled.append(span._replace(end=cut))
        raw.append(span._replace(start=cut))
    return rolled, raw


def sum_usage(
    conn: Connection,
    *,
    spans: Sequence[Span],
    n_groups: int,
    thresholds: Thresholds,
    raw_cutoff: datetime,
    minute_cutoff: datetime,
    causes: bool = True,
    cause_energy: bool = False,
    rolled_until: Mapping[int, datetime | None] | None = None,
    raw_kept_from: datetime | None = None,
) -> list[Usage]:
    """Per group, the sum of factor x Usage over its spans.

    Spans inside 1m retention (from ``minute_cutoff``) are read from the 1m running totals,
    older ones bucket by bucket from the 1h and 1m rollups. Without ``causes`` the seconds
    per cause are not summed (the benchmark compares the two); the energy per cause only with
    ``cause_energy`` (job summaries: a fleet report does not show it). With ``rolled_until``
    (per GPU, up to when its rollups are complete) the rest of each span is read from raw
    samples kept since ``raw_kept_from``, so data stored seconds ago, or replayed late, counts
    at once.
    """
    fields = summed_fields(causes=causes, cause_energy=cause_energy)
    out = [Usage() for _ in range(n_groups)]
    if rolled_until is not None:
        spans, unrolled = _split_unrolled(spans, rolled_until, raw_kept_from or raw_cutoff)
        if unrolled:
            sum_raw(conn, unrolled, out, thresholds, fields)
    recent = [span for span in spans if span.start >= minute_cutoff]
    old = [span for span in spans if span.start < minute_cutoff]
    if recent:
        _sum_by_totals(
            conn, spans=recent, out=out, thresholds=thresholds, raw_cutoff=raw_cutoff,
            fields=fields,
        )  # fmt: skip
    if old:
        _sum_by_buckets(
            conn, spans=old, out=out, thresholds=thresholds, raw_cutoff=raw_cutoff,
            fields=fields,
        )  # fmt: skip
    return out
