"""Keeps the 1-minute and 1-hour rollups current by recomputing buckets that ingest marked dirty."""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import cache
from operator import itemgetter
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    Table,
    and_,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    text,
    update,
)

from service.costs.integrals import (
    INTEGRAL_FIELDS,
    SIGNAL_METRICS,
    ActivityPoint,
    Thresholds,
    integrate,
    stored_point,
)
from service.costs.tenants import SplitRule
from service.db import foreground, tenants_repo
from service.db.costing import cost_days_repo
from service.db.dialect import bulk_insert_ignore, copy_insert_ignore, keys_in
from service.db.schema import (
    CUMULATIVE_FIELDS,
    ROLLED_UP_DERIVED,
    gpus,
    rollup_1h,
    rollup_1m,
    rollup_dirty,
    samples,
)
from service.db.set_aside import SetAside, impossible
from service.db.types import UTCDateTime
from service.vocabulary import METRIC_BOUNDS, METRIC_NAMES

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
# The sample columns a minute is rolled up from: the metrics, then the stored decision.
_ROLLED = (*METRIC_NAMES, *ROLLED_UP_DERIVED)
_SAMPLE_COLUMNS = (*_ROLLED, "activity_rung", "cause")
_ACT, _RUNG, _CAUSE, _POWER = (
    _SAMPLE_COLUMNS.index(m) for m in ("activity", "activity_rung", "cause", "power_watts")
)
_SIGNALS = tuple((m, _SAMPLE_COLUMNS.index(m)) for m in SIGNAL_METRICS)


def _point(ts: float, v: Sequence[Any]) -> ActivityPoint:
    """The integrals' point of one sample row (values in ``_SAMPLE_COLUMNS`` order)."""
    return stored_point(ts, v[_ACT], v[_RUNG], v[_CAUSE], v[_POWER], {m: v[i] for m, i in _SIGNALS})


def minute_rollup(
    gpu_id: int,
    bucket: datetime,
    rows: Sequence[tuple[float, Sequence[Any]]],
    thresholds: Thresholds,
    points: Sequence[ActivityPoint] | None = None,
) -> dict[str, Any] | None:
    """The rollup row for one minute from (Unix ts, values) rows around it, or None; values are
    the columns of ``_SAMPLE_COLUMNS``; ``points``: the rows' points when already built."""
    start = bucket.timestamp()
    end = start + 60.0
    if points is None:
        points = [_point(ts, v) for ts, v in rows]
    integrals = integrate(points, start, end, thresholds)
    inside = [v for ts, v in rows if start <= ts < end]
    if not inside and integrals.covered_seconds == 0:
        return None
    out: dict[str, Any] = {"gpu_id": gpu_id, "bucket_start": bucket, "sample_count": len(inside)}
    out.update({f: getattr(integrals, f) for f in INTEGRAL_FIELDS})
    # Column by column (one transposition), not sample by sample per column.
    columns = list(zip(*inside, strict=True)) if inside else [()] * len(_ROLLED)
    for name, column in zip(_ROLLED, columns, strict=False):
        values = [x for x in column if x is not None]
        out[f"{name}_count"] = len(values)
        out[f"{name}_sum"] = float(sum(values)) if values else None
        out[f"{name}_min"] = float(min(values)) if values else None
        out[f"{name}_max"] = float(max(values)) if values else None
    return out


@cache
def _hour_from_minutes() -> Any:
    """INSERT one 1-hour rollup aggregated in the database from its 1-minute rows.

    Parameters: ``gpu_id``, ``hour`` and ``hour_end``. Built once: the statement has ~80 columns
    and constructing it per hour cost more than running it.
    """
    c = rollup_1m.c
    hour = bindparam("hour", type_=UTCDateTime)
    cols: list[Any] = [
        bindparam("gpu_id", type_=Integer).label("gpu_id"),
        hour.label("bucket_start"),
        func.sum(c.sample_count).label("sample_count"),
        *(func.sum(c[f]).label(f) for f in INTEGRAL_FIELDS),
    ]
    for m in _ROLLED:
        cols += [
            func.sum(c[f"{m}_sum"]).label(f"{m}_sum"),
            func.min(c[f"{m}_min"]).label(f"{m}_min"),
            func.max(c[f"{m}_max"]).label(f"{m}_max"),
            func.sum(c[f"{m}_count"]).label(f"{m}_count"),
        ]
    query = (
        select(*cols)
        .where(
            c.gpu_id == bindparam("gpu_id", type_=Integer),
            c.bucket_start >= hour,
            c.bucket_start < bindparam("hour_end", type_=UTCDateTime),
        )
        .having(func.count() > 0)
    )
    return insert(rollup_1h).from_select([col.name for col in cols], query)


def _delete_keys(conn: Connection, table: Table, keys: list[tuple[int, datetime]]) -> None:
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        conn.execute(delete(table).where(keys_in(conn, table, chunk)))


def _replace(
    conn: Connection, table: Table, keys: list[tuple[int, datetime]], rows: list[dict[str, Any]]
) -> None:
    _delete_keys(conn, table, keys)
    bulk_insert_ignore(conn, table, ["gpu_id", "bucket_start"], rows)


_CUM_COLUMNS = tuple(f"cum_{f}" for f in CUMULATIVE_FIELDS)


def _add_running_totals(
    conn: Connection, rows: list[dict[str, Any]], *, firsts: dict[int, datetime]
) -> set[int]:
    """Set the running totals (``cum_*``) of new minute ``rows`` where that can be done now;
    returns the GPUs where it cannot.

    It can for every GPU whose remaining buckets all lie before its first recomputed minute
    (``firsts``; the usual, in-order case): its totals continue from its last bucket. Rows of
    other GPUs (late data, with buckets after it) keep NULL totals for ``fill_cumulative``. So
    a row is written once, not inserted and then updated.
    """
    last: dict[int, tuple[datetime, tuple[Any, ...]]] = {}
    g, r, x = gpus.c, rollup_1m.c, rollup_1m.alias("x").c
    newest = select(func.max(x.bucket_start)).where(x.gpu_id == g.id).scalar_subquery()
    ids = sorted(firsts)
    for i in range(0, len(ids), 500):
        # Driven from gpus: one backward probe of the key per GPU, never a scan of its rows.
        q = (
            select(g.id, r.bucket_start, *(r[c] for c in _CUM_COLUMNS))
            .select_from(gpus.join(rollup_1m, and_(r.gpu_id == g.id, r.bucket_start == newest)))
            .where(g.id.in_(ids[i : i + 500]))
        )
        for gpu_id, bucket, *cum in conn.execute(q).all():
            last[gpu_id] = (bucket, tuple(cum))
    running: dict[int, list[float] | None] = {}
    for gpu_id, first in firsts.items():
        newest_bucket, totals = last.get(gpu_id, (None, (0.0,) * len(_CUM_COLUMNS)))
        in_order = (newest_bucket is None or newest_bucket < first) and None not in totals
        running[gpu_id] = [float(t) for t in totals] if in_order else None
    for row in sorted(rows, key=lambda row: row["bucket_start"]):
        acc = running[row["gpu_id"]]
        for i, (f, c) in enumerate(zip(CUMULATIVE_FIELDS, _CUM_COLUMNS, strict=True)):
            if acc is None:
                row[c] = None
            else:
                acc[i] += row[f] or 0.0
                row[c] = acc[i]
    return {gpu_id for gpu_id, acc in running.items() if acc is None}


def dirty_keys(
    conn: Connection, *, limit: int, shard: tuple[int, int] | None = None
) -> list[tuple[int, datetime]]:
    """The first ``limit`` (GPU id, minute) buckets waiting to be recomputed, each once however
    often it was marked; with ``shard`` (index, count), only those of GPUs whose id modulo
    count is index."""
    c = rollup_dirty.c
    cond = [] if shard is None or shard[1] == 1 else [c.gpu_id % shard[1] == shard[0]]
    dirty = conn.execute(
        select(c.gpu_id, c.bucket_start)
        .distinct()
        .where(*cond)
        .order_by(c.gpu_id, c.bucket_start)
        .limit(limit)
    ).all()
    return [(g, b) for g, b in dirty]


def discard_dirty(conn: Connection, keys: list[tuple[int, datetime]]) -> None:
    """Forget that buckets ``keys`` wait to be recomputed (every mark of each that this
    statement sees; one committed after it stays, for the next round)."""
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        conn.execute(delete(rollup_dirty).where(keys_in(conn, rollup_dirty, chunk)))


# GPUs read by one statement, and the slack (seconds) a group's shared time range may add to
# the ranges its GPUs need: in the usual round every GPU needs the same last few minutes.
READ_GROUP_GPUS = 500
READ_GROUP_SLACK_SECONDS = 600.0


def read_groups(
    ranges: dict[int, tuple[datetime, datetime]],
) -> list[tuple[list[int], datetime, datetime]]:
    """``ranges`` (GPU id -> [lo, hi)) as groups of GPUs read by one statement each over one
    shared [lo, hi): GPUs of one group need nearby times, so a GPU far behind (late data) is
    read alone rather than widening every other GPU's read."""
    groups: list[tuple[list[int], datetime, datetime]] = []
    need = 0.0  # seconds the current group's GPUs need, one by one
    for gpu_id, (lo, hi) in sorted(ranges.items(), key=lambda kv: (kv[1][0], kv[0])):
        if groups:
            ids, g_lo, g_hi = groups[-1]
            width = (max(g_hi, hi) - g_lo).total_seconds()
            own = (hi - lo).total_seconds()
            if len(ids) < READ_GROUP_GPUS and width <= max(need, own) + READ_GROUP_SLACK_SECONDS:
                ids.append(gpu_id)
                groups[-1] = (ids, g_lo, max(g_hi, hi))
                need = max(need, own)
                continue
        groups.append(([gpu_id], lo, hi))
        need = (hi - lo).total_seconds()
    return groups


@cache
def _out_of_bounds() -> Any:
    """SQL: whether a sample holds a value past its bounds (NULL when none is known), so only
    those rows are checked value by value; NaN sorts above every number in PostgreSQL and is
    NULL in SQLite."""
    c = samples.c
    return or_(
        *(or_(c[m] < lo, c[m] > hi) for m in _ROLLED for lo, hi in (METRIC_BOUNDS[m],))
    ).label("out_of_bounds")


def _usable_samples(
    conn: Connection,
    *,
    ranges: dict[int, tuple[datetime, datetime]],
    buckets: dict[int, set[datetime]],
    set_aside: list[SetAside] | None,
) -> dict[int, list[tuple[float, Any]]]:
    """Per GPU of ``ranges``, (Unix ts, values) of its samples in its [lo, hi), read many GPUs
    per statement; a sample holding a value past what hardware can report is left out (and
    listed once, by the minute it lies in)."""
    out: dict[int, list[tuple[float, Any]]] = {gpu_id: [] for gpu_id in ranges}
    for ids, g_lo, g_hi in read_groups(ranges):
        query = (
            select(
                samples.c.gpu_id,
                samples.c.ts,
                _out_of_bounds(),
                *(samples.c[m] for m in _SAMPLE_COLUMNS),
            )
            .where(samples.c.gpu_id.in_(ids), samples.c.ts >= g_lo, samples.c.ts < g_hi)
            .order_by(samples.c.gpu_id, samples.c.ts)
        )
        for r in foreground.every_rows(conn.execute(query).all()):
            gpu_id, ts = r[0], r[1]
            lo, hi = ranges[gpu_id]
            if not lo <= ts < hi:
                continue
            bad = impossible(_ROLLED, r[3 : 3 + len(_ROLLED)]) if r[2] else []
            if not bad:
                out[gpu_id].append((ts.timestamp(), r[3:]))
            elif set_aside is not None and ts.replace(second=0, microsecond=0) in buckets[gpu_id]:
                what = f"sample of GPU {gpu_id} at {ts.isoformat()}"
                set_aside.append(SetAside("rollup", what, f"impossible {', '.join(bad)}"))
    return out


def process_dirty(
    conn: Connection,
    *,
    thresholds: Thresholds,
    limit: int = 20_000,
    split_rule: SplitRule = SplitRule.EQUAL,
    keys: list[tuple[int, datetime]] | None = None,
    set_aside: list[SetAside] | None = None,
    shard: tuple[int, int] | None = None,
) -> int:
    """Recompute up to ``limit`` dirty minute buckets (or just ``keys``; of ``shard``'s GPUs
    only where given, as ``dirty_keys`` says), their hours and, where jobs shared the GPU,
    each job's part of the minute (split by ``split_rule``); returns how many buckets. Samples
    it cannot use are left out and appended to ``set_aside``."""
    if keys is None:
        keys = dirty_keys(conn, limit=limit, shard=shard)
    if not keys:
        return 0
    # Delete first: an ingest that commits after this re-marks its buckets for the next round.
    discard_dirty(conn, keys)
    cost_days_repo.mark_minutes(conn, keys)  # the summed days these minutes are in go stale

    tenants_repo.delete_minutes(conn, keys)
    by_gpu: dict[int, list[datetime]] = defaultdict(list)
    for gpu_id, bucket in keys:
        by_gpu[gpu_id].append(bucket)
    minute_rows, hours, shared = _roll_minutes(conn, by_gpu, thresholds, split_rule, set_aside)
    _write_minutes(conn, keys, minute_rows, firsts={g: min(b) for g, b in by_gpu.items()})
    hour_keys = sorted(hours)
    _replace(conn, rollup_1h, hour_keys, [])
    if hour_keys:
        conn.execute(
            _hour_from_minutes(),
            [{"gpu_id": g, "hour": h, "hour_end": h + HOUR} for g, h in hour_keys],
        )
    tenants_repo.rollup_hours(conn, hour_keys, shared)
    return len(keys)


def _roll_minutes(
    conn: Connection,
    by_gpu: dict[int, list[datetime]],
    thresholds: Thresholds,
    split_rule: SplitRule,
    set_aside: list[SetAside] | None,
) -> tuple[list[dict[str, Any]], set[tuple[int, datetime]], list[tuple[int, datetime]]]:
    """The rollup_1m rows of the minute buckets ``by_gpu`` (GPU id -> buckets), the (GPU, hour)
    keys they fall in, and the (GPU, minute) keys jobs shared, whose tenant rows it writes."""
    gap = timedelta(seconds=thresholds.max_gap_seconds)
    gap_s = thresholds.max_gap_seconds
    minute_rows: list[dict[str, Any]] = []
    hours: set[tuple[int, datetime]] = set()
    shared: list[tuple[int, datetime]] = []  # (GPU, minute) keys given tenant rows
    ranges = {g: (min(b) - gap, max(b) + MINUTE) for g, b in by_gpu.items()}
    read = _usable_samples(
        conn, ranges=ranges, buckets={g: set(b) for g, b in by_gpu.items()}, set_aside=set_aside
    )
    intervals = tenants_repo.intervals_of(
        conn, {g: (min(b), max(b) + MINUTE) for g, b in by_gpu.items()}
    )
    for gpu_id, buckets in by_gpu.items():
        foreground.give_way()  # a GPU's minutes at a time: an API read waits for no more
        rows = read[gpu_id]
        stamps = [ts for ts, _ in rows]
        points = [_point(ts, v) for ts, v in rows]  # once per GPU; each minute takes its slice
        shared_minutes = tenants_repo.rollup_tenants(
            conn,
            gpu_id=gpu_id,
            buckets=buckets,
            points=points,
            thresholds=thresholds,
            rule=split_rule,
            intervals=intervals[gpu_id],
        )
        shared += [(gpu_id, bucket) for bucket in shared_minutes]
        for bucket in buckets:
            b = bucket.timestamp()
            i, j = bisect_left(stamps, b - gap_s), bisect_left(stamps, b + 60.0)
            row = minute_rollup(gpu_id, bucket, rows[i:j], thresholds, points[i:j])
            if row is not None:
                minute_rows.append(row)
            hours.add((gpu_id, bucket.replace(minute=0)))
    return minute_rows, hours, shared


def _write_minutes(
    conn: Connection,
    keys: list[tuple[int, datetime]],
    minute_rows: list[dict[str, Any]],
    *,
    firsts: dict[int, datetime],
) -> None:
    """Replace the rollup_1m rows of ``keys`` by ``minute_rows`` with their running totals, and
    bring the totals of later buckets up to date (``firsts``: each GPU's first bucket of keys)."""
    _delete_keys(conn, rollup_1m, keys)
    late = _add_running_totals(conn, minute_rows, firsts=firsts)
    if minute_rows:
        columns = tuple(minute_rows[0])
        values = itemgetter(*columns)
        copy_insert_ignore(
            conn,
            rollup_1m,
            ["gpu_id", "bucket_start"],
            columns,
            [values(row) for row in minute_rows],
        )
    # Late data: buckets after the recomputed ones still hold totals that counted the old
    # values (or a minute that lost its row). Mark them for fill_cumulative.
    for gpu_id in late:
        conn.execute(
            update(rollup_1m)
            .where(rollup_1m.c.gpu_id == gpu_id, rollup_1m.c.bucket_start >= firsts[gpu_id])
            .values(cum_covered_seconds=None)
        )
    fill_cumulative(conn)


@cache
def _fill_cumulative_sql() -> Any:
    """The statement that computes the pending running totals of rollup_1m (see fill_cumulative)."""
    base = ", ".join(f"COALESCE(b.cum_{f}, 0) AS b_{f}" for f in CUMULATIVE_FIELDS)
    running = ", ".join(
        f"p.b_{f} + SUM(COALESCE(r.{f}, 0)) OVER w AS c_{f}" for f in CUMULATIVE_FIELDS
    )
    sets = ", ".join(f"cum_{f} = run.c_{f}" for f in CUMULATIVE_FIELDS)
    return text(
        # Per GPU, the first bucket without totals and the totals of the bucket before it ...
        "WITH first AS (SELECT gpu_id, MIN(bucket_start) AS b FROM rollup_1m "
        "  WHERE cum_covered_seconds IS NULL GROUP BY gpu_id), "
        f"prev AS (SELECT first.gpu_id, first.b, {base} FROM first "
        "  LEFT JOIN rollup_1m b ON b.gpu_id = first.gpu_id AND b.bucket_start = "
        "    (SELECT MAX(x.bucket_start) FROM rollup_1m x "
        "     WHERE x.gpu_id = first.gpu_id AND x.bucket_start < first.b)), "
        # ... then every bucket from there on gets that base plus its running sum.
        f"run AS (SELECT r.gpu_id AS g, r.bucket_start AS s, {running} FROM rollup_1m r "
        "  JOIN prev p ON r.gpu_id = p.gpu_id AND r.bucket_start >= p.b "
        "  WINDOW w AS (PARTITION BY r.gpu_id ORDER BY r.bucket_start "
        "    ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)) "
        f"UPDATE rollup_1m SET {sets} FROM run "
        "WHERE rollup_1m.gpu_id = run.g AND rollup_1m.bucket_start = run.s"
    )


def fill_cumulative(conn: Connection) -> int:
    """Compute the running totals (``cum_*``) of every rollup_1m bucket that lacks them.

    For each GPU this restarts at its first bucket without totals, so a late bucket inserted
    before others shifts the totals of all the buckets after it. Returns the rows updated.
    """
    if conn.dialect.name != "sqlite":
        return int(conn.execute(_fill_cumulative_sql()).rowcount or 0)
    # sqlite3 reports no rowcount for a WITH ... UPDATE, and changes() still holds the last
    # INSERT's count when the UPDATE touched nothing: count by the difference of totals.
    before = int(conn.exec_driver_sql("SELECT total_changes()").scalar_one())
    conn.execute(_fill_cumulative_sql())
    return int(conn.exec_driver_sql("SELECT total_changes()").scalar_one()) - before


def delete_rollups_before(conn: Connection, *, table: Table, cutoff: datetime) -> int:
    """Delete rollup rows of ``table`` older than ``cutoff``; returns how many."""
    result = conn.execute(delete(table).where(table.c.bucket_start < cutoff))
    return int(result.rowcount or 0)
