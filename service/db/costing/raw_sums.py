"""The waste integrals of spans' edges from raw samples, summed inside the database: each
sample covers up to the next one (at most the largest gap), as ``integrate`` has it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from sqlalchemy import Connection

from service.core.diagnosis import CAUSES, IDLE_CAUSES, Rung
from service.costs.integrals import (
    CAUSE_ENERGY_FIELDS,
    CAUSE_FIELDS,
    CAUSE_SIGNALS,
    Thresholds,
)
from service.costs.waste import Span, Usage
from service.db.cost_scratch import fill, scratch_table
from service.db.schema import samples
from service.db.set_aside import possible_text

# Per-connection scratch table the reads are loaded into, one row a scan of a GPU's samples:
# one distinct stretch k, or two that meet (k2 from mid on, as a job's start splits a minute).
_READS = scratch_table(
    "gw_cost_reads",
    ("k", "k2", "gpu_id", "since", "lo_at", "mid_at", "hi_at", "lo", "mid", "hi"),
    timestamps={"since", "lo_at", "mid_at", "hi_at"},
    integers={"k", "k2", "gpu_id"},
)


@contextmanager
def pg_local(conn: Connection, **settings: str) -> Iterator[None]:
    """On PostgreSQL, SET LOCAL each setting for the statements inside, then back to default."""
    pg = conn.dialect.name == "postgresql"
    # One round trip each way for all the settings, not one per setting.
    if pg:
        conn.exec_driver_sql("; ".join(f"SET LOCAL {k} = {v}" for k, v in settings.items()))
    try:
        yield
    finally:
        if pg:
            conn.exec_driver_sql("; ".join(f"SET LOCAL {k} = DEFAULT" for k in settings))


# What one (group, cause, rung) row of ``_raw_sql`` adds to: its cause's seconds and energy,
# the idle seconds (idle_empty + idle_held, as ``integrate`` adds them) and the fallback seconds.
_CAUSE_SECONDS = {int(c): CAUSE_FIELDS[c.column] for c in CAUSES}
_CAUSE_JOULES = {int(c): CAUSE_ENERGY_FIELDS[c.column] for c in CAUSES}
_IDLE_CAUSES = frozenset(int(c) for c in IDLE_CAUSES)
_GPU_UTIL = int(Rung.GPU_UTIL)
# The metrics whose sum and count over the samples inside a read the integrals carry.
_RAW_METRICS = ("tensor_active", "dram_active")
# Every stored column the raw read takes a value of.
_BOUNDED = (*_RAW_METRICS, "activity", "power_watts", "gr_engine_active", "gpu_util",
            "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second")  # fmt: skip
_SIGNAL_OF = {int(sig.cause): sig for sig in CAUSE_SIGNALS}


@cache
def _raw_sql(pg: bool, max_gap_seconds: float) -> str:
    """Per read, cause and rung: the seconds, activity x seconds and joules the read's raw
    samples cover, and per metric of ``_RAW_METRICS`` the sum and count of the samples inside.

    Integrated as ``integrate`` does: each sample covers [ts, min(next ts, ts + max_gap))
    clipped to its read's [lo, hi); nodata (activity or cause NULL) covers nothing but ends the
    cover of the sample before it. Scans are rows of ``_READS`` (k, k2, gpu_id, since, lo_at,
    mid_at, hi_at, lo, mid, hi): read k is [lo, mid) and read k2 (where not NULL) [mid, hi),
    in stored form (``*_at``) and in Unix seconds; the last sample in [since, lo_at), since =
    lo - max_gap, covers lo's first seconds, and k2's from mid on come from the scan's samples
    before mid as they would from its own (a sample before the last one before mid covers
    nothing past mid).
    """
    # A stored value past what hardware can report reads as absent (set aside), so one such
    # sample cannot overflow a sum (PostgreSQL refuses the whole report then).
    v = {m: possible_text(f"s.{m}", m) for m in _BOUNDED}
    metrics = ", ".join(f"{v[m]} AS {m}" for m in _RAW_METRICS)
    greatest = "GREATEST" if pg else "MAX"
    tx, rx = v["pcie_tx_bytes_per_second"], v["pcie_rx_bytes_per_second"]
    # The signals of CAUSE_SIGNALS, as ``stored_point`` reads them.
    signals = (
        f"CASE WHEN s.activity_rung = {int(Rung.SM_ACTIVE)} AND {v['gr_engine_active']} IS NOT "
        f"NULL THEN {v['gr_engine_active']} WHEN s.activity_rung <> {_GPU_UTIL} THEN "
        f"{v['gpu_util']} END AS duty, {v['dram_active']} AS dram, CASE WHEN {tx} IS NOT NULL "
        f"OR {rx} IS NOT NULL THEN {greatest}(COALESCE({tx}, 0), COALESCE({rx}, 0)) END AS pcie"
    )
    cols = (
        f"r.k, r.k2, r.lo, r.mid, r.hi, {{ts}} AS t, CASE WHEN s.ts >= r.mid_at THEN 1 ELSE 0 "
        f"END AS upper, {v['activity']} AS activity, s.activity_rung AS rung, s.cause, "
        f"{v['power_watts']} AS power, {metrics}, {signals}"
    )
    if pg:
        cols = cols.format(ts="EXTRACT(EPOCH FROM s.ts)::float8")
        least = "LEAST"
        # The samples inside each scan, and the one before it, found once per scan.
        x = (
            f"SELECT {cols}, 1 AS inside FROM {_READS.name} r JOIN {samples.name} s "
            "  ON s.gpu_id = r.gpu_id AND s.ts >= r.lo_at AND s.ts < r.hi_at "
            f"UNION ALL SELECT {cols}, 0 FROM {_READS.name} r CROSS JOIN LATERAL "
            f"  (SELECT * FROM {samples.name} p WHERE p.gpu_id = r.gpu_id AND p.ts >= r.since "
            "   AND p.ts < r.lo_at ORDER BY p.ts DESC LIMIT 1) s"
        )
    else:
        # Stored text 'YYYY-MM-DD HH:MM:SS.ffffff': whole seconds plus the fraction (julianday
        # would round to the millisecond).
        seconds = "CAST(strftime('%s', substr(s.ts, 1, 19)) AS REAL)"
        cols = cols.format(ts=f"({seconds} + CAST(substr(s.ts, 20) AS REAL))")
        least = "MIN"
        # One range per scan, from the sample before it on (one scan: SQLite sorts each arm
        # of a UNION on its own).
        x = (
            f"SELECT {cols}, CASE WHEN s.ts >= r.lo_at THEN 1 ELSE 0 END AS inside "
            f"FROM {_READS.name} r JOIN {samples.name} s ON s.gpu_id = r.gpu_id AND s.ts >= "
            f"  COALESCE((SELECT MAX(p.ts) FROM {samples.name} p WHERE p.gpu_id = r.gpu_id "
            "   AND p.ts >= r.since AND p.ts < r.lo_at), r.lo_at) AND s.ts < r.hi_at"
        )
    gap = repr(float(max_gap_seconds))
    metric_sums = ", ".join(
        f"SUM(inside * {m}), SUM(CASE WHEN {m} IS NOT NULL THEN inside END)" for m in _RAW_METRICS
    )
    carried = f"cause, rung, activity, power, {', '.join(_RAW_METRICS)}, duty, dram, pcie, nt, t"
    # Each scan's rows once per read: k over [lo, mid), k2 over [mid, hi); a row counts as
    # inside a read where its sample is.
    parts = (
        f"SELECT k, lo, mid AS hi, inside * (1 - upper) AS inside, {carried} FROM y "
        f"UNION ALL SELECT k2, mid, hi, inside * upper, {carried} FROM y WHERE k2 IS NOT NULL"
    )
    return (
        f"WITH x AS ({x}), "
        "y AS (SELECT x.*, LEAD(t) OVER (PARTITION BY k ORDER BY t) AS nt FROM x), "
        f"p AS ({parts}), "
        f"z AS (SELECT k, cause, rung, activity, power, inside, {', '.join(_RAW_METRICS)}, "
        "  duty, dram, pcie, "
        "  CASE WHEN activity IS NOT NULL AND cause IS NOT NULL THEN "
        f"  {greatest}({least}(COALESCE(nt, t + {gap}), t + {gap}, hi) - {greatest}(t, lo), 0) "
        "  END AS dt FROM p) "
        "SELECT k, cause, rung, SUM(dt), SUM(dt * activity), SUM(dt * power), "
        f"{metric_sums}, SUM(dt * duty), SUM(dt * dram), SUM(dt * pcie) "
        "FROM z GROUP BY k, cause, rung"
    )


# The index, in a row's sums extended by one, of seconds less activity x seconds (unused).
_SIGNALS = ("duty", "dram", "pcie")
_UNUSED = 3 + 2 * len(_RAW_METRICS) + len(_SIGNALS)
_Plan = tuple[tuple[str, int], ...]


@cache
def _part_plan(cause: int | None, rung: int | None, wanted: frozenset[str]) -> tuple[_Plan, _Plan]:
    """The ``wanted`` Usage fields a (cause, rung) row of ``_raw_sql`` adds to, each with the
    index of what it adds in the row's sums (``_UNUSED`` appended): without seconds, with."""
    part: dict[str, int] = {}
    for i, metric in enumerate(_RAW_METRICS):
        part[f"{metric}_sum"], part[f"{metric}_count"] = 3 + 2 * i, 4 + 2 * i
    bare = dict(part)
    if cause is not None:
        part |= {
            "covered_seconds": 0,
            "unused_seconds": _UNUSED,
            "energy_used_joules": 2,
            _CAUSE_SECONDS[cause]: 0,
            _CAUSE_JOULES[cause]: 2,
        }
        signal = _SIGNAL_OF.get(cause)
        if signal is not None:
            part[signal.field] = (
                1 if signal.signal == "activity" else _UNUSED - 3 + _SIGNALS.index(signal.signal)
            )
        if cause in _IDLE_CAUSES:
            part["idle_seconds"] = 0
        if rung == _GPU_UTIL:
            part["fallback_seconds"] = 0
    return tuple((n, i) for n, i in bare.items() if n in wanted), tuple(
        (n, i) for n, i in part.items() if n in wanted
    )


def _scans(
    key_of: dict[tuple[int, datetime, datetime], int], gap: timedelta
) -> list[tuple[Any, ...]]:
    """Rows of ``_READS``: each stretch (gpu_id, start, end) -> k read alone, or with the next
    one of its GPU that starts where it ends (one scan, read at most once in a pair)."""
    rows = []
    ordered = sorted(key_of.items())
    i = 0
    while i < len(ordered):
        (gpu_id, start, end), k = ordered[i]
        k2: int | None = None
        hi = end
        if i + 1 < len(ordered):
            (gpu_next, start_next, end_next), k_next = ordered[i + 1]
            if gpu_next == gpu_id and start_next == end:
                k2, hi = k_next, end_next
                i += 1
        rows.append((k, k2, gpu_id, start - gap, start, end, hi,
                     start.timestamp(), end.timestamp(), hi.timestamp()))  # fmt: skip
        i += 1
    return rows


def sum_raw(
    conn: Connection,
    reads: Sequence[Span],
    out: list[Usage],
    thresholds: Thresholds,
    fields: Sequence[str],
) -> None:
    """Add to ``out[read.group]`` factor x each read's ``fields`` integrated from raw samples
    (the others untouched), in one statement inside the database.

    Each distinct stretch of a GPU is integrated once: the jobs sharing a GPU, and the spans
    of one job cut by a price change, read the same edges; two stretches that meet (the
    seconds on both sides of a job's start) are read in one scan.
    """
    key_of: dict[tuple[int, datetime, datetime], int] = {}
    shares: list[list[tuple[int, float]]] = []  # by k: (group, factor)
    for read in reads:
        key = (read.gpu_id, read.start, read.end)
        k = key_of.get(key)
        if k is None:
            k = key_of[key] = len(shares)
            shares.append([])
        shares[k].append((read.group, read.factor))
    fill(conn, _READS, _scans(key_of, timedelta(seconds=thresholds.max_gap_seconds)))
    # The planner cannot estimate the range join and would hash-join a full scan of samples
    # instead of probing its key once per read; no two scans share a probe, so a cache in
    # front of each (Memoize) only adds work (31 ms against 37 for the jobs page's 2,934).
    with pg_local(
        conn, enable_hashjoin="off", enable_mergejoin="off", enable_memoize="off", jit="off"
    ):
        result = conn.exec_driver_sql(
            _raw_sql(conn.dialect.name == "postgresql", thresholds.max_gap_seconds)
        ).all()
    # Summed per group first (few keys), then spread over the fields.
    by_key: dict[tuple[int, Any, Any], list[float]] = {}
    for k, cause, rung, *sums in result:
        values = [float(v or 0.0) for v in sums]
        for group, factor in shares[k]:
            acc = by_key.get((group, cause, rung))
            if acc is None:
                by_key[(group, cause, rung)] = [factor * v for v in values]
            else:
                for i, v in enumerate(values):
                    acc[i] += factor * v
    wanted = frozenset(fields)
    for (group, cause, rung), values in by_key.items():
        usage = out[group]
        values.append(values[0] - values[1])  # _UNUSED
        bare, full = _part_plan(cause, rung, wanted)
        for name, i in full if values[0] else bare:
            value = values[i]
            if value:
                setattr(usage, name, getattr(usage, name) + value)
