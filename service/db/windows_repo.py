"""What the evaluator reads: window statistics per GPU over samples and 1-minute rollups."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    Float,
    Integer,
    RowMapping,
    and_,
    any_,
    bindparam,
    case,
    cast,
    func,
    not_,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY

from service.core.diagnosis import Cause
from service.db.schema import ROLLED_UP_DERIVED, rollup_1m, samples
from service.db.set_aside import SetAside, any_impossible, possible
from service.thresholds.evaluator import WindowStats
from service.thresholds.policy import SAMPLE_METRICS, cause_of_metric
from service.vocabulary import (
    FAULT_COUNTERS,
    FAULT_METRICS,
    FAULT_STATES,
    HARDWARE_XIDS,
    METRIC_BOUNDS,
    METRICS_BY_NAME,
)

# Windows longer than this read 1-minute rollups instead of raw samples.
RAW_WINDOW_MAX_SECONDS = 3600.0


def _among(conn: Connection, column: Any, ids: list[int]) -> Any:
    """``column IN ids``; on PostgreSQL one array parameter (``= ANY``), cheap to send and plan."""
    if conn.dialect.name == "postgresql":
        return column == any_(bindparam("gpu_id_list", ids, type_=ARRAY(Integer)))
    return column.in_(ids)


def _sample_expr(metric: str) -> Any:
    """The per-sample value of ``metric`` (canonical or derived) as a SQL expression; derived
    ones read the activity and cause stored with the sample at ingest."""
    cause = Cause.IDLE_HELD if metric == "idle_held" else cause_of_metric(metric)
    if cause is not None:
        # 1 in the cause, 0 in another, NULL (no data) without a decision.
        return case(
            (samples.c.cause.is_(None), None),
            (samples.c.cause == int(cause), 1.0),
            else_=0.0,
        )
    # A stored value past what hardware can report is left out (counted by the caller).
    return cast(possible(samples.c[metric], metric), Float)


def _fault_aggregates(table: Any, *, rollup: bool, recent: Any = None) -> list[Any]:
    """``FAULT_AGGREGATES`` aggregates, each above 0 when the window holds a hardware fault.

    A hardware XID or a fault state (``FAULT_STATES``) in any sample (bucket), then per
    ``FAULT_COUNTERS`` its rise from the window's first reading to its last (their level says
    nothing: they count since the driver loaded). In rollups the XID test reads each bucket's
    largest code, which finds a hardware XID unless a larger application code shared its minute.
    ``recent`` narrows every aggregate to the rows of a shorter window (an aggregate FILTER).
    """

    def agg(fn: Any) -> Any:
        return fn if recent is None else fn.filter(recent)

    c = table.c

    def col(name: str, end: str) -> Any:
        return possible(c[f"{name}_{end}"] if rollup else c[name], name)

    xid = col("xid_last", "max")
    faults = case(
        (xid.in_(sorted(HARDWARE_XIDS)), 1.0),
        *((col(state, "max") > 0, 1.0) for state in FAULT_STATES),
        else_=0.0,
    )
    aggs: list[Any] = [agg(func.max(faults))]
    for counter in FAULT_COUNTERS:
        aggs.append(agg(func.max(col(counter, "max"))) - agg(func.min(col(counter, "min"))))
    return aggs


FAULT_AGGREGATES = 1 + len(FAULT_COUNTERS)


def _faulted(values: Iterable[Any]) -> bool:
    return any(v is not None and float(v) > 0 for v in values)


WindowStatsByGpu = dict[int, dict[str, WindowStats]]


def window_stats(
    conn: Connection,
    *,
    windows: Mapping[float, Iterable[str]],
    now: datetime,
    gpu_ids: Iterable[int],
    lost_gpu_ids: frozenset[int] = frozenset(),
    set_aside: list[SetAside] | None = None,
) -> dict[float, WindowStatsByGpu]:
    """Per window and GPU, sum/count/min/max of each metric over (now - window, now].

    Every raw-sample window is read in one scan of the widest one (narrower windows are
    aggregate FILTERs); windows longer than an hour read 1-minute rollups. Samples and minutes
    holding a value past what hardware can report are left out and listed in ``set_aside``.
    """
    ids = sorted(gpu_ids)
    out: dict[float, WindowStatsByGpu] = {}
    raw: dict[float, list[str]] = {}
    for w, ms in windows.items():
        if w > RAW_WINDOW_MAX_SECONDS:
            out[w] = _rollup_stats(conn, sorted(set(ms)), w, now, ids, lost_gpu_ids, set_aside)
        else:
            raw[w] = sorted(set(ms) & set(SAMPLE_METRICS))
            out[w] = {}
    if raw:
        _raw_stats(conn, raw, now, ids, out, set_aside)
    for w, ms in raw.items():
        if "hardware_fault" in ms:
            for gid in lost_gpu_ids:
                out[w].setdefault(gid, {})["hardware_fault"] = WindowStats(1.0, 1, 1.0, 1.0)
    return out


def _raw_columns(
    raw: Mapping[float, list[str]], now: datetime
) -> tuple[list[Any], list[tuple[float, str, int]], set[str]]:
    """The aggregate columns after gpu_id that read the metrics of every window of ``raw`` in
    one scan of the widest, each (window, metric)'s first column index, and the metrics read
    (whose values past their bounds the last column counts, when there are any)."""
    widest = max(raw)
    cols: list[Any] = [samples.c.gpu_id]
    plan: list[tuple[float, str, int]] = []  # (window, metric, first column index)
    for w, ms in sorted(raw.items()):
        recent = None if w == widest else samples.c.ts > now - timedelta(seconds=w)
        for m in ms:
            plan.append((w, m, len(cols)))
            if m == "hardware_fault":
                cols += _fault_aggregates(samples, rollup=False, recent=recent)
                continue
            e = _sample_expr(m)
            aggs = [func.sum(e), func.count(e), func.min(e), func.max(e)]
            cols += [a if recent is None else a.filter(recent) for a in aggs]
    read = {m for ms in raw.values() for m in ms if m in METRICS_BY_NAME}
    if any(m == "hardware_fault" for _, m, _ in plan):
        read |= set(FAULT_METRICS)
    if read:  # last column: how many samples hold a value past its bounds
        cols.append(func.sum(any_impossible([(samples.c[n], n) for n in sorted(read)])))
    return cols, plan, read


def _raw_stats(
    conn: Connection,
    raw: Mapping[float, list[str]],
    now: datetime,
    ids: list[int],
    out: dict[float, WindowStatsByGpu],
    set_aside: list[SetAside] | None,
) -> None:
    """Fill ``out`` with the raw-sample windows ``raw`` (seconds -> metrics) of GPUs ``ids``,
    all read by one statement."""
    widest = max(raw)
    cols, plan, read = _raw_columns(raw, now)
    # Naming the GPUs lets PostgreSQL walk the (gpu_id, ts) primary key per GPU instead
    # of scanning the whole day's partition for the time range.
    q = (
        select(*cols)
        .where(
            _among(conn, samples.c.gpu_id, ids),
            samples.c.ts > now - timedelta(seconds=widest),
            samples.c.ts <= now,
        )
        .group_by(samples.c.gpu_id)
    )
    for r in conn.execute(q):
        gid = r[0]
        bad = int(r[-1] or 0) if read else 0
        if bad and set_aside is not None:
            what = f"{bad} samples of GPU {gid} in the last {widest:g} s"
            why = f"a value past its bounds in {', '.join(sorted(read))}"
            set_aside.append(SetAside("evaluate", what, why, bad))
        for w, m, i in plan:
            if m == "hardware_fault":
                v = 1.0 if _faulted(r[i : i + FAULT_AGGREGATES]) else 0.0
                out[w].setdefault(gid, {})[m] = WindowStats(v, 1, v, v)
                continue
            count = int(r[i + 1] or 0)
            if count:
                out[w].setdefault(gid, {})[m] = WindowStats(
                    float(r[i]), count, float(r[i + 2]), float(r[i + 3])
                )


def _rollup_stats(
    conn: Connection,
    wanted: list[str],
    window_seconds: float,
    now: datetime,
    gpu_ids: list[int],
    lost_gpu_ids: frozenset[int],
    set_aside: list[SetAside] | None = None,
) -> dict[int, dict[str, WindowStats]]:
    """Like window_stats from whole 1-minute buckets (long windows)."""
    since = now - timedelta(seconds=window_seconds)
    c = rollup_1m.c
    rolled = [m for m in wanted if m in METRICS_BY_NAME or m in ROLLED_UP_DERIVED]
    causes = {m: Cause.IDLE_HELD if m == "idle_held" else cause_of_metric(m) for m in wanted}
    cause_fields = {m: f"{c.label}_seconds" for m, c in causes.items() if c is not None}
    cols = _rollup_columns(wanted, rolled, cause_fields)
    q = (
        select(*cols)
        .where(_among(conn, c.gpu_id, gpu_ids), c.bucket_start >= since, c.bucket_start < now)
        .group_by(c.gpu_id)
    )
    out: dict[int, dict[str, WindowStats]] = {}
    for r in conn.execute(q):
        m_ = r._mapping
        if rolled and m_["set_aside"] and set_aside is not None:
            what = f"{m_['set_aside']} minutes of GPU {r.gpu_id} in the last {window_seconds:g} s"
            why = f"a figure past its bounds in {', '.join(rolled)}"
            set_aside.append(SetAside("evaluate", what, why, int(m_["set_aside"])))
        per = _rolled_up(m_, rolled, cause_fields)
        if "hardware_fault" in wanted:
            faulted = _faulted(m_[f"fault{k}"] for k in range(FAULT_AGGREGATES))
            v = 1.0 if faulted or r.gpu_id in lost_gpu_ids else 0.0
            per["hardware_fault"] = WindowStats(v, 1, v, v)
        out[r.gpu_id] = per
    if "hardware_fault" in wanted:
        for gid in lost_gpu_ids:
            out.setdefault(gid, {})["hardware_fault"] = WindowStats(1.0, 1, 1.0, 1.0)
    return out


def _rollup_columns(
    wanted: list[str], rolled: list[str], cause_fields: Mapping[str, str]
) -> list[Any]:
    """The columns ``_rollup_stats`` reads per GPU from rollup_1m: the ``rolled`` metrics'
    figures of sane minutes, the count of other minutes, each cause's seconds
    (``cause_fields``), covered seconds and, if ``wanted``, the hardware fault aggregates."""
    c = rollup_1m.c
    cols: list[Any] = [c.gpu_id]
    sane = {m: _sane_minute(m) for m in rolled}
    for m in rolled:
        cols += [
            func.sum(case((sane[m], c[f"{m}_sum"]))).label(f"{m}__sum"),
            func.sum(case((sane[m], c[f"{m}_count"]))).label(f"{m}__count"),
            func.min(case((sane[m], c[f"{m}_min"]))).label(f"{m}__min"),
            func.max(case((sane[m], c[f"{m}_max"]))).label(f"{m}__max"),
        ]
    if rolled:
        insane = or_(*(and_(c[f"{m}_count"] > 0, not_(sane[m])) for m in rolled))
        cols.append(func.sum(case((insane, 1), else_=0)).label("set_aside"))
    cols += [func.sum(c[f]).label(f"{m}__seconds") for m, f in cause_fields.items()]
    cols += [
        func.sum(c.covered_seconds).label("cov"),
    ]
    if "hardware_fault" in wanted:
        cols += [
            a.label(f"fault{k}") for k, a in enumerate(_fault_aggregates(rollup_1m, rollup=True))
        ]
    return cols


def _rolled_up(
    row: RowMapping, rolled: list[str], cause_fields: Mapping[str, str]
) -> dict[str, WindowStats]:
    """One GPU's window stats of the ``rolled`` metrics and cause metrics from its row of
    ``_rollup_columns``."""
    per: dict[str, WindowStats] = {}
    for m in rolled:
        if row[f"{m}__count"]:
            per[m] = WindowStats(
                float(row[f"{m}__sum"]),
                int(row[f"{m}__count"]),
                float(row[f"{m}__min"]),
                float(row[f"{m}__max"]),
            )
    cov = float(row["cov"] or 0.0)
    for m in cause_fields:
        if cov > 0:
            ratio = float(row[f"{m}__seconds"] or 0.0) / cov
            # Weighted by covered seconds: avg is exact; min and max are the window's mean.
            per[m] = WindowStats(ratio, 1, ratio, ratio)
    return per


def _sane_minute(metric: str) -> Any:
    """SQL: whether a 1-minute rollup's figures of ``metric`` lie within what hardware reports
    (its min and max within the bounds, its sum within count times them)."""
    c = rollup_1m.c
    low, high = METRIC_BOUNDS[metric]
    lo, hi, total, n = (c[f"{metric}_{k}"] for k in ("min", "max", "sum", "count"))
    return and_(lo >= low, hi <= high, total >= n * low, total <= n * high)
