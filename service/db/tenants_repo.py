"""Each job's integrals per minute of a shared GPU (``tenant_1m``), per hour (``tenant_1h``,
with the shared minutes of each hour in ``shared_1h``) and per day (``tenant_1d``): written by
the rollup job, read by the cost report."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    and_,
    bindparam,
    delete,
    func,
    insert,
    literal_column,
    or_,
    select,
    text,
)

from service.core.buckets import DAY, HOUR, MINUTE, ceil_to, floor_to
from service.costs.integrals import (
    INTEGRAL_FIELDS,
    SIGNAL_METRICS,
    ActivityPoint,
    Thresholds,
    stored_point,
)
from service.costs.tenants import SplitRule, TenantProcess, TenantShare, split_stretch
from service.db.cost_scratch import fill, scratch_table
from service.db.dialect import bulk_insert_ignore, keys_in
from service.db.schema import (
    gpu_processes,
    job_gpus,
    samples,
    shared_1h,
    tenant_1d,
    tenant_1h,
    tenant_1m,
)
from service.db.types import UTCDateTime


def _intervals(
    conn: Connection, gpu_id: int, lo: datetime, hi: datetime
) -> list[tuple[int, str, float, float]]:
    """(interval id, job, start, end in Unix seconds) of the intervals on ``gpu_id`` that
    overlap [lo, hi); an open interval ends at infinity."""
    c = job_gpus.c
    rows = conn.execute(
        select(c.id, c.job_id, c.started_at, c.ended_at).where(
            c.gpu_id == gpu_id,
            c.started_at < hi,
            or_(c.ended_at.is_(None), c.ended_at > lo),
        )
    ).all()
    return [
        (int(i), str(j), s.timestamp(), e.timestamp() if e is not None else float("inf"))
        for i, j, s, e in rows
    ]


def intervals_of(
    conn: Connection, ranges: dict[int, tuple[datetime, datetime]]
) -> dict[int, list[tuple[int, str, float, float]]]:
    """``_intervals`` of many GPUs (GPU id -> [lo, hi)), read by one statement per 500 GPUs."""
    out: dict[int, list[tuple[int, str, float, float]]] = {g: [] for g in ranges}
    ids = sorted(ranges)
    c = job_gpus.c
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        lo = min(ranges[g][0] for g in chunk)
        hi = max(ranges[g][1] for g in chunk)
        for g, iv, job, s, e in conn.execute(
            select(c.gpu_id, c.id, c.job_id, c.started_at, c.ended_at).where(
                c.gpu_id.in_(chunk), c.started_at < hi, or_(c.ended_at.is_(None), c.ended_at > lo)
            )
        ):
            g_lo, g_hi = ranges[g]
            if s < g_hi and (e is None or e > g_lo):
                end = e.timestamp() if e is not None else float("inf")
                out[g].append((int(iv), str(job), s.timestamp(), end))
    return out


def _shared(intervals: Sequence[tuple[int, str, float, float]], lo: float, hi: float) -> bool:
    """Whether two different jobs hold the GPU at one moment of [lo, hi)."""
    spans = [(max(s, lo), min(e, hi), j) for _, j, s, e in intervals if s < hi and e > lo]
    for a in spans:
        for b in spans:
            if a[2] != b[2] and a[0] < b[1] and b[0] < a[1]:
                return True
    return False


def delete_minutes(conn: Connection, keys: Sequence[tuple[int, datetime]]) -> None:
    """Drop the tenant rows of these (GPU, minute) keys."""
    for i in range(0, len(keys), 500):
        chunk = list(keys[i : i + 500])
        conn.execute(delete(tenant_1m).where(keys_in(conn, tenant_1m, chunk)))


def rollup_tenants(
    conn: Connection,
    *,
    gpu_id: int,
    buckets: Sequence[datetime],
    points: Sequence[ActivityPoint],
    thresholds: Thresholds,
    rule: SplitRule,
    intervals: Sequence[tuple[int, str, float, float]] | None = None,
) -> list[datetime]:
    """Write the tenant rows of the minutes of ``buckets`` in which jobs shared ``gpu_id``,
    from the GPU's ``points`` (sorted, from max_gap before the first bucket); returns those
    minutes. Rows of these minutes must be deleted first. ``intervals``: the GPU's job
    intervals over the buckets when the caller read them already (``intervals_of``)."""
    if not buckets:
        return []
    lo, hi = min(buckets), max(buckets) + MINUTE
    if intervals is None:
        intervals = _intervals(conn, gpu_id, lo, hi)
    if len({j for _, j, _, _ in intervals}) < 2:
        return []
    shared = [b for b in buckets if _shared(intervals, b.timestamp(), b.timestamp() + 60.0)]
    if not shared:
        return []
    procs, holding, first_interval = _tenancy(conn, gpu_id, intervals, shared, thresholds)
    rows: list[dict[str, Any]] = []
    for bucket in shared:
        b = bucket.timestamp()
        shares = split_stretch(points, procs, holding, b, b + 60.0, thresholds, rule)
        rows += _rows(gpu_id, bucket, shares, first_interval, rule)
    bulk_insert_ignore(conn, tenant_1m, ["gpu_id", "bucket_start", "tenant"], rows)
    return shared


def _tenancy(
    conn: Connection,
    gpu_id: int,
    intervals: Sequence[tuple[int, str, float, float]],
    buckets: Sequence[datetime],
    thresholds: Thresholds,
) -> tuple[dict[float, list[TenantProcess]], dict[str, list[tuple[float, float]]], dict[str, int]]:
    """The processes listed per sample ts around ``buckets``, each job's held spans (Unix
    seconds) and its first interval id."""
    procs: dict[float, list[TenantProcess]] = defaultdict(list)
    p = gpu_processes.c
    gap = timedelta(seconds=thresholds.max_gap_seconds)
    for ts, pid, job, fb, sm in conn.execute(
        select(p.ts, p.pid, p.job_id, p.fb_used_bytes, p.sm_util).where(
            and_(p.gpu_id == gpu_id, p.ts >= min(buckets) - gap, p.ts < max(buckets) + MINUTE)
        )
    ):
        # pid 0 and below: a job's holder row (ingest numbers several on one GPU 0, -1, ...).
        procs[ts.timestamp()].append(
            TenantProcess(
                job, None if fb is None else float(fb), None if sm is None else sm, pid > 0
            )
        )
    holding: dict[str, list[tuple[float, float]]] = defaultdict(list)
    first_interval: dict[str, int] = {}
    for iv, job, s, e in sorted(intervals):
        holding[job].append((s, e))
        first_interval.setdefault(job, iv)
    return procs, holding, first_interval


def _rows(
    gpu_id: int,
    bucket: datetime,
    shares: dict[str, TenantShare],
    first_interval: dict[str, int],
    rule: SplitRule,
) -> list[dict[str, Any]]:
    """Tenant rows (the columns of ``tenant_1m``) of one minute's shares."""
    rows = []
    for tenant, sh in shares.items():
        row: dict[str, Any] = {
            "gpu_id": gpu_id,
            "bucket_start": bucket,
            "tenant": tenant,
            "interval_id": first_interval.get(tenant),
            "split_rule": rule.value,
            "held_seconds": sh.held_seconds,
        }
        row.update({f: getattr(sh.integrals, f) for f in INTEGRAL_FIELDS})
        rows.append(row)
    return rows


def split_part(
    conn: Connection,
    *,
    gpu_id: int,
    start: datetime,
    end: datetime,
    thresholds: Thresholds,
    rule: SplitRule,
) -> list[dict[str, Any]]:
    """Tenant rows for the part [start, end) of one shared minute of ``gpu_id``, split from its
    raw samples as the rollup splits whole minutes (for a report window that cuts a minute)."""
    bucket = start.replace(second=0, microsecond=0)
    intervals = _intervals(conn, gpu_id, start, end)
    procs, holding, first_interval = _tenancy(conn, gpu_id, intervals, [bucket], thresholds)
    gap = timedelta(seconds=thresholds.max_gap_seconds)
    s = samples.c
    points = [
        stored_point(
            ts.timestamp(), act, rung, cause, power, dict(zip(SIGNAL_METRICS, v, strict=True))
        )
        for ts, act, rung, cause, power, *v in conn.execute(
            select(
                s.ts, s.activity, s.activity_rung, s.cause, s.power_watts,
                *(s[m] for m in SIGNAL_METRICS),
            )
            .where(s.gpu_id == gpu_id, s.ts >= start - gap, s.ts < end)
            .order_by(s.ts)
        )
    ]  # fmt: skip
    shares = split_stretch(
        points, procs, holding, start.timestamp(), end.timestamp(), thresholds, rule
    )
    return _rows(gpu_id, bucket, shares, first_interval, rule)


# --- hours: tenant_1h and shared_1h, kept by the rollup job, read by reports ---------------

FULL_HOUR = (1 << 60) - 1  # a shared_1h mask with every minute of the hour shared


@cache
def _level_sums(day: bool) -> Any:
    """INSERT ... SELECT of one GPU-hour's tenant_1h rows from its tenant_1m rows (``day``:
    one GPU-day's tenant_1d rows from its tenant_1h rows)."""
    source, target = (tenant_1h, tenant_1d) if day else (tenant_1m, tenant_1h)
    t = source.c
    start = bindparam("start", type_=UTCDateTime)
    fields = ["held_seconds", *INTEGRAL_FIELDS]
    query = (
        select(t.gpu_id, start, t.tenant, t.split_rule, *(func.sum(t[f]) for f in fields))
        .where(
            t.gpu_id == bindparam("gpu_id", type_=Integer),
            t.bucket_start >= start,
            t.bucket_start < bindparam("end", type_=UTCDateTime),
        )
        .group_by(t.gpu_id, t.tenant, t.split_rule)
    )
    return insert(target).from_select(
        ["gpu_id", "bucket_start", "tenant", "split_rule", *fields], query
    )


@cache
def _hour_mask(pg: bool) -> Any:
    """INSERT ... SELECT of one GPU-hour's shared_1h row: the minutes it has tenant rows of,
    one bit each (the minutes are distinct, so their sum is the bitwise or)."""
    if pg:
        bit = "CAST(1 AS BIGINT) << CAST(EXTRACT(MINUTE FROM bucket_start) AS INTEGER)"
    else:
        bit = "1 << CAST(strftime('%M', bucket_start) AS INTEGER)"
    return text(
        "INSERT INTO shared_1h (gpu_id, bucket_start, minute_mask) "
        f"SELECT :gpu_id, :start, CAST(SUM({bit}) AS BIGINT) FROM (SELECT DISTINCT bucket_start "
        "  FROM tenant_1m WHERE gpu_id = :gpu_id AND bucket_start >= :start "
        "  AND bucket_start < :end) m HAVING COUNT(*) > 0"
    ).bindparams(
        bindparam("gpu_id", type_=Integer),
        bindparam("start", type_=UTCDateTime),
        bindparam("end", type_=UTCDateTime),
    )


def rollup_hours(
    conn: Connection,
    hours: Sequence[tuple[int, datetime]],
    shared: Sequence[tuple[int, datetime]],
) -> int:
    """Rewrite the tenant_1h, shared_1h and tenant_1d rows of the (GPU, hour) keys ``hours``
    whose minutes the rollup job just rewrote, ``shared`` the (GPU, minute) keys it wrote
    tenant rows for; returns how many hours were rewritten."""
    if not hours:
        return 0
    keys = sorted(set(hours))
    # Only hours that had tenant rows, or got some now, change; a fleet without shared GPUs
    # pays one lookup per 500 hours.
    todo = {(g, b.replace(minute=0)) for g, b in shared}
    s = shared_1h.c
    for i in range(0, len(keys), 500):
        had = [
            (g, h)
            for g, h in conn.execute(
                select(s.gpu_id, s.bucket_start).where(keys_in(conn, shared_1h, keys[i : i + 500]))
            )
        ]
        if had:
            for table in (tenant_1h, shared_1h):
                conn.execute(delete(table).where(keys_in(conn, table, had)))
            todo |= set(had)
    if not todo:
        return 0
    params = [{"gpu_id": g, "start": h, "end": h + HOUR} for g, h in sorted(todo)]
    conn.execute(_level_sums(False), params)
    conn.execute(_hour_mask(conn.dialect.name == "postgresql"), params)
    days = sorted({(g, h.replace(hour=0)) for g, h in todo})
    for i in range(0, len(days), 500):
        conn.execute(delete(tenant_1d).where(keys_in(conn, tenant_1d, days[i : i + 500])))
    conn.execute(_level_sums(True), [{"gpu_id": g, "start": d, "end": d + DAY} for g, d in days])
    return len(todo)


def _hour_number(pg: bool) -> Any:
    """Hours since the epoch of shared_1h.bucket_start, as an SQL integer."""
    if pg:
        return literal_column("CAST(EXTRACT(EPOCH FROM shared_1h.bucket_start) AS BIGINT) / 3600")
    return literal_column("CAST(strftime('%s', shared_1h.bucket_start) AS INTEGER) / 3600")


def shared_stretches(
    conn: Connection, *, start: datetime, end: datetime, gpu_ids: Sequence[int] | None = None
) -> dict[int, list[tuple[datetime, datetime]]]:
    """Per GPU, the stretches [a, b) of consecutive minutes with tenant rows among the minutes
    starting in (start - 1 min, end), sorted; read from shared_1h (runs of fully shared hours
    come back as one row each)."""
    s = shared_1h.c
    pg = conn.dialect.name == "postgresql"
    in_window = [s.bucket_start > start - MINUTE - HOUR, s.bucket_start < end]
    if gpu_ids is not None:
        in_window.append(s.gpu_id.in_(list(gpu_ids)))
    island = (
        _hour_number(pg) - func.row_number().over(partition_by=s.gpu_id, order_by=s.bucket_start)
    ).label("island")
    full = (
        select(s.gpu_id, s.bucket_start, island)
        .where(s.minute_mask == FULL_HOUR, *in_window)
        .subquery()
    )
    f = full.c
    runs: dict[int, list[tuple[int, int]]] = defaultdict(list)  # Unix minutes [a, b)
    for gpu_id, first, n_hours in conn.execute(
        select(f.gpu_id, func.min(f.bucket_start), func.count()).group_by(f.gpu_id, f.island)
    ):
        a = int(first.timestamp()) // 60
        runs[gpu_id].append((a, a + 60 * int(n_hours)))
    for gpu_id, hour, mask in conn.execute(
        select(s.gpu_id, s.bucket_start, s.minute_mask).where(
            s.minute_mask != FULL_HOUR, *in_window
        )
    ):
        h = int(hour.timestamp()) // 60
        m = 0
        mask = int(mask)
        while mask:
            if mask & 1:
                run_start = m
                while mask & 1:
                    mask >>= 1
                    m += 1
                runs[gpu_id].append((h + run_start, h + m))
            else:
                mask >>= 1
                m += 1
    lo = int(start.timestamp() // 60)  # the first minute that ends after start
    end_s = end.timestamp()
    hi = int(-(-end_s // 60))  # minutes starting before end
    out: dict[int, list[tuple[datetime, datetime]]] = {}
    for gpu_id, spans in runs.items():
        merged: list[list[int]] = []
        for a, b in sorted(spans):
            a, b = max(a, lo), min(b, hi)
            if a >= b:
                continue
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        if merged:
            out[gpu_id] = [(_minute(a), _minute(b)) for a, b in merged]
    return out


def _minute(unix_minute: int) -> datetime:
    return datetime.fromtimestamp(unix_minute * 60, UTC)


def minutes_at(conn: Connection, keys: Sequence[tuple[int, datetime]]) -> list[dict[str, Any]]:
    """The tenant_1m rows of these (GPU, minute) keys."""
    t = tenant_1m.c
    out: list[dict[str, Any]] = []
    ordered = sorted(set(keys))
    for i in range(0, len(ordered), 500):
        chunk = ordered[i : i + 500]
        q = select(tenant_1m).where(keys_in(conn, tenant_1m, chunk))
        out += [dict(r._mapping) for r in conn.execute(q.order_by(t.gpu_id, t.bucket_start))]
    return out


_RANGES = scratch_table(
    "gw_tenant_ranges",
    ("k", "gpu_id", "lo", "hi", "level"),
    timestamps={"lo", "hi"},
    integers={"k", "gpu_id", "level"},
)
SUM_FIELDS = ("held_seconds", *INTEGRAL_FIELDS)  # what sum_ranges returns per tenant
_LEVELS = (tenant_1m, tenant_1h, tenant_1d)


def _levels(lo: datetime, hi: datetime) -> list[tuple[datetime, datetime, int]]:
    """[lo, hi) (whole minutes) as parts read from tenant_1m (0), tenant_1h (1) and
    tenant_1d (2): minutes up to the first whole hour, hours up to the first whole day, days,
    then back down."""
    lo, hi = lo.astimezone(UTC), hi.astimezone(UTC)  # hours and days are UTC's
    h_lo, h_hi = ceil_to(lo, HOUR), floor_to(hi, HOUR)
    if h_lo >= h_hi:
        return [(lo, hi, 0)]
    d_lo, d_hi = ceil_to(h_lo, DAY), floor_to(h_hi, DAY)
    if d_lo >= d_hi:
        middle = [(h_lo, h_hi, 1)]
    else:
        middle = [(h_lo, d_lo, 1), (d_lo, d_hi, 2), (d_hi, h_hi, 1)]
    parts = [(lo, h_lo, 0), *middle, (h_hi, hi, 0)]
    return [(a, b, level) for a, b, level in parts if a < b]


def sum_ranges(
    conn: Connection, ranges: Sequence[tuple[int, datetime, datetime]]
) -> list[tuple[int, str, str, tuple[float, ...]]]:
    """For each range k = (gpu_id, lo, hi) of whole minutes, the tenant rows in it summed per
    tenant and split rule: (k, tenant, rule, sums in SUM_FIELDS order). Whole days are read
    from tenant_1d, whole hours around them from tenant_1h, the minutes around those from
    tenant_1m."""
    rows = [
        (k, gpu_id, a, b, level)
        for k, (gpu_id, lo, hi) in enumerate(ranges)
        for a, b, level in _levels(lo, hi)
    ]
    if not rows:
        return []
    fill(conn, _RANGES, rows)
    r = _RANGES.c
    out: list[tuple[int, str, str, tuple[float, ...]]] = []
    for level, table in enumerate(_LEVELS):
        if not any(row[4] == level for row in rows):
            continue
        t = table.c
        query = (
            select(r.k, t.tenant, t.split_rule, *(func.sum(t[f]) for f in SUM_FIELDS))
            .select_from(
                _RANGES.join(
                    table,
                    and_(t.gpu_id == r.gpu_id, t.bucket_start >= r.lo, t.bucket_start < r.hi),
                )
            )
            .where(r.level == level)
            .group_by(r.k, t.tenant, t.split_rule)
        )
        out += [
            (int(k), str(tenant), str(rule), tuple(float(v or 0.0) for v in sums))
            for k, tenant, rule, *sums in conn.execute(query)
        ]
    return out
