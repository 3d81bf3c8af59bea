"""Benchmark: a 30-day cost report over 1,000 GPUs (1m and 1h rollups present, 5,000 jobs).

Targets: the report grouped by team in at most 1 s, one job's summary in at most
100 ms, on SQLite and on PostgreSQL; the report with seconds per cause at most 1.3x the same
report without them (timed side by side, interleaved, in the same run).

Run:  .venv/bin/python bench/cost_report.py [--backend sqlite|postgresql|both] [--gpus 1000]
      [--days 30] [--jobs 5000] [--reuse] [--shared-gpus 0.1 [--shared-runs 2]]
      [--edge-samples [--edge-runs 3]] [--scope] [--rolling]

With ``--shared-gpus F`` the reports are timed again after a fraction F of the GPUs is shared
(see ``load_shared``): tenant rows for every shared minute, as the rollup job writes them.

With ``--day-sums`` the cost day sums (cost_job_1d, cost_gpu_1d) are written by the cost-days
job's own code (timed), then the 30-day team, user and job reports are timed without them
(every second from the rollups, the code before the day sums) and with them, interleaved, best
of ``--day-runs``, over the whole days and over a window with two edge days, and their totals
compared to the cent.

With ``--rolling`` the day-sum reports are timed over the whole days, a window cut at whole
hours and one cut at any second (the console's "last 30 days"), alternated in one run, each
printed beside the whole days' (issue 52 item 1).

With ``--scope`` a signed-in person's reports (issue 51: their own jobs and their team's) are
timed beside the whole fleet's, from the day sums.

With ``--edge-samples`` raw samples are stored around every job edge inside raw retention
(see ``load_edge_samples``), so the reports read those edges from raw samples as in
production, and the team and job reports are timed with edges raw and pro rata side by side.

Data: 1h rollup rows are generated in Python (executemany on SQLite, COPY on PostgreSQL);
the 1m rows (43 M at full size) are expanded inside the database with one INSERT ... SELECT
(60 minutes per hour, each 1/60 of its hour) so the two resolutions agree. Raw samples are
stored only with ``--edge-samples`` (around the job edges raw retention holds); without them
those edges read an empty samples table and older edges read 1m buckets.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine, func, insert, select, text

# Appended, not first: PYTHONPATH (another copy of the code, timed against this one) wins.
sys.path.append(str(Path(__file__).resolve().parents[1]))

from bench import report_bytes
from service.api.app import freeze_start_up_objects
from service.core.diagnosis import Cause, Rung
from service.costs.integrals import INTEGRAL_FIELDS
from service.costs.prices import PriceRow
from service.db import cost_scratch, jobs_repo, partitions, prices_repo, tenants_repo
from service.db.engine import make_engine
from service.db.migrate import upgrade
from service.db.schema import (
    CUMULATIVE_FIELDS,
    gpus,
    job_gpus,
    jobs,
    nodes,
    rollup_1h,
    rollup_1m,
    samples,
    shared_1h,
    tenant_1m,
)
from service.roles import JobScope
from service.settings import Settings
from service.usecases.costing import cost_days, cost_report
from service.usecases.costing.dollars import EdgeRule, ReadPath, forced
from service.usecases.job_summary import job_summary

END = datetime(2026, 12, 1, 0, 0, tzinfo=UTC)
GPUS_PER_NODE = 8
MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA H200", "NVIDIA L40S")
# The 1h rollup columns the generator fills: every summed field the report reads (from the
# schema, so a new integral needs no change here) and sm_active's sum and count.
COLS_1H = ("gpu_id", "bucket_start", "sample_count", *CUMULATIVE_FIELDS, "sm_active_sum",
           "sm_active_count")  # fmt: skip


def analyze(engine: Engine) -> None:
    """Refresh the planner's statistics after a bulk load."""
    with engine.connect() as conn:
        conn.execute(text("ANALYZE"))
        conn.commit()


def hour_rows(n_gpus: int, days: int, rng: random.Random) -> list[tuple[Any, ...]]:
    """One 1h rollup row per GPU-hour with plausible integrals (some hours have no data)."""
    start = END - timedelta(days=days)
    hours = [start + timedelta(hours=h) for h in range(days * 24)]
    out = []
    for gpu_id in range(1, n_gpus + 1):
        for ts in hours:
            draw = rng.random()
            if draw < 0.01:
                continue  # no data this hour
            sm = 0.01 if draw < 0.3 else rng.random()
            covered = 3600.0
            idle = covered if sm < 0.05 else 0.0
            held = idle if rng.random() < 0.5 else 0.0
            tensor = 0.0 if draw < 0.4 else sm * 0.8
            row: dict[str, Any] = dict.fromkeys(COLS_1H, 0.0)
            row.update(
                gpu_id=gpu_id, bucket_start=ts, sample_count=360, covered_seconds=covered,
                idle_seconds=idle, idle_held_seconds=held, idle_empty_seconds=idle - held,
                unused_seconds=covered * (1 - sm), energy_used_joules=covered * 300.0,
                sm_active_sum=360 * sm, sm_active_count=360, tensor_active_sum=360 * tensor,
                tensor_active_count=360, dram_active_sum=360 * sm * 0.3, dram_active_count=360,
            )  # fmt: skip
            if not idle:
                busy = "compute_tensor_seconds" if tensor else "compute_no_tensor_seconds"
                row[busy] = covered
            out.append(tuple(row[col] for col in COLS_1H))
    return out


def make_jobs(n_gpus: int, days: int, n_jobs: int, rng: random.Random) -> tuple[list, list]:  # type: ignore[type-arg]
    """Jobs of 1-8 GPUs on one node, 1-48 h long, starting at any second of the range."""
    start = END - timedelta(days=days)
    job_rows, interval_rows = [], []
    n_nodes = n_gpus // GPUS_PER_NODE
    for j in range(n_jobs):
        node = rng.randrange(n_nodes)
        k = rng.choice((1, 1, 2, 4, 8))
        first = rng.randrange(GPUS_PER_NODE - k + 1)
        begin = start + timedelta(seconds=rng.randrange(days * 86400))
        end = min(begin + timedelta(seconds=rng.randrange(3600, 48 * 3600)), END)
        jid = f"slurm:{100000 + j}"
        job_rows.append(
            {"id": jid, "user": f"user{rng.randrange(200)}", "team": f"team{rng.randrange(20)}",
             "project": None, "labels": {}, "source": "api", "started_at": begin, "ended_at": end,
             "created_at": begin, "updated_at": end}
        )  # fmt: skip
        for i in range(first, first + k):
            interval_rows.append(
                {"job_id": jid, "gpu_id": node * GPUS_PER_NODE + i + 1, "started_at": begin,
                 "ended_at": end, "source": "api"}
            )  # fmt: skip
    return job_rows, interval_rows


def expand_minutes(conn: Any, dialect: str) -> None:
    """Fill rollup_1m from rollup_1h inside the database: 60 rows per hour, 1/60 each.

    The running totals (``cum_*``) come from a running sum over the hours plus the minutes
    so far in the hour, which equals what the rollup job computes minute by minute.
    """
    value_cols = [c for c in COLS_1H[3:] if not c.endswith("_count")]
    count_cols = [c for c in COLS_1H[3:] if c.endswith("_count")]
    share = {c: f"h.{c} / 60.0" for c in value_cols} | {c: f"h.{c} / 60" for c in count_cols}
    cum_cols = list(CUMULATIVE_FIELDS)
    before = ", ".join(
        f"SUM({c}) OVER (PARTITION BY gpu_id ORDER BY bucket_start) - {c} AS before_{c}"
        for c in cum_cols
    )
    cums = ", ".join(f"h.before_{c} + (m + 1) * ({share[c]})" for c in cum_cols)
    cols = ", ".join(
        ["gpu_id", "bucket_start", "sample_count", *value_cols, *count_cols]
        + [f"cum_{c}" for c in cum_cols]
    )
    values = ", ".join(share[c] for c in [*value_cols, *count_cols])
    if dialect == "postgresql":
        minute = "h.bucket_start + m * interval '1 minute'"
        series = "generate_series(0, 59) AS m"
    else:
        # UTCDateTime stores SQLite timestamps as 'YYYY-MM-DD HH:MM:SS.ffffff' text.
        minute = (
            "strftime('%Y-%m-%d %H:%M:%S', h.bucket_start, '+' || m.m || ' minutes') || '.000000'"
        )
        series = "(WITH RECURSIVE s(m) AS (SELECT 0 UNION ALL SELECT m + 1 FROM s WHERE m < 59) SELECT m FROM s) AS m"
    conn.execute(
        text(
            f"WITH h AS (SELECT *, {before} FROM rollup_1h) "
            f"INSERT INTO rollup_1m ({cols}) SELECT h.gpu_id, {minute}, h.sample_count / 60, "
            f"{values}, {cums} FROM h CROSS JOIN {series}"
        )
    )


def load(engine: Engine, n_gpus: int, days: int, n_jobs: int) -> None:
    rng = random.Random(42)
    t = time.perf_counter()
    with engine.begin() as conn:
        now = END
        conn.execute(
            insert(nodes),
            [{"hostname": f"gpu{n:04d}", "labels": {}, "first_seen_at": now, "last_seen_at": now}
             for n in range(n_gpus // GPUS_PER_NODE)],
        )  # fmt: skip
        conn.execute(
            insert(gpus),
            [{"uuid": f"GPU-{g:06d}", "node_id": (g - 1) // GPUS_PER_NODE + 1,
              "gpu_index": (g - 1) % GPUS_PER_NODE, "model": MODELS[((g - 1) // 64) % len(MODELS)],
              "fb_total_bytes": 80 * 2**30, "first_seen_at": now - timedelta(days=days)}
             for g in range(1, n_gpus + 1)],
        )  # fmt: skip
        rows = hour_rows(n_gpus, days, rng)
        cost_scratch.load_rows(conn, rollup_1h, COLS_1H, rows)
        print(f"  1h rows: {len(rows):,} in {time.perf_counter() - t:.1f} s", flush=True)
        t = time.perf_counter()
        expand_minutes(conn, engine.dialect.name)
        print(f"  1m rows expanded in {time.perf_counter() - t:.1f} s", flush=True)
        t = time.perf_counter()
        job_rows, interval_rows = make_jobs(n_gpus, days, n_jobs, rng)
        conn.execute(insert(jobs), job_rows)
        conn.execute(insert(job_gpus), interval_rows)
        prices_repo.replace_prices(
            conn,
            rows=[
                PriceRow("*H100*", 6.88, END - timedelta(days=400)),
                PriceRow("*A100*80GB*", 5.12, END - timedelta(days=400)),
                PriceRow("*H200*", 10.60, END - timedelta(days=400)),
                PriceRow("*L40S*", 1.86, END - timedelta(days=400)),
            ],
        )
        print(f"  {len(job_rows):,} jobs, {len(interval_rows):,} intervals", flush=True)
    analyze(engine)


def timed(fn: Any, runs: int) -> tuple[float, float, Any]:
    fn()  # warm the caches
    times, result = [], None
    for _ in range(runs):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return min(times), statistics.median(times), result


def compare(conn: Any, settings: Settings, start: datetime, fast: dict[str, Any]) -> None:
    """Time the same report read bucket by bucket (as spans past 1m retention are) and diff it."""
    slow_settings = settings.model_copy(update={"retention_1m_days": 1e-6})
    t = time.perf_counter()
    slow = cost_report.cost_report(
        conn, settings=slow_settings, start=start, end=END, now=END, group_by="team"
    )
    elapsed = time.perf_counter() - t
    worst = 0.0
    by_key = {r["key"]: r for r in slow["rows"]}
    for row in fast["rows"]:
        other = by_key[row["key"]]
        for f in ("allocated_seconds", "idle_seconds", "unused_seconds", "cost_usd"):
            if other[f]:
                worst = max(worst, abs(row[f] - other[f]) / abs(other[f]))
    print(
        f"  the same report bucket by bucket: {elapsed * 1000:.0f} ms; largest relative "
        f"difference from the running-totals report: {worst:.2e}"
    )


def bench(engine: Engine, days: int, check: bool = False) -> None:
    settings = Settings()
    freeze_start_up_objects()  # as `gpuwarden serve` and `gpuwarden up` do before serving
    start = END - timedelta(days=days)
    with engine.connect() as conn:
        n1m = conn.execute(select(func.count()).select_from(rollup_1m)).scalar_one()
        n1h = conn.execute(select(func.count()).select_from(rollup_1h)).scalar_one()
        print(f"  rows: rollup_1m {n1m:,}, rollup_1h {n1h:,}")

        def team_report() -> Any:
            return cost_report.cost_report(
                conn, settings=settings, start=start, end=END, now=END, group_by="team"
            )

        best, median, data = timed(team_report, 3)
        # With and without the seconds per cause, interleaved so drift hits both alike.
        with_c, without_c = [], []
        for _ in range(3):
            for flag, acc in ((True, with_c), (False, without_c)):
                t = time.perf_counter()
                report_via(
                    ReadPath(causes=flag),
                    conn, settings=settings, start=start, end=END, now=END, group_by="team",
                )  # fmt: skip
                acc.append(time.perf_counter() - t)
        ratio = statistics.median(with_c) / statistics.median(without_c)
        print(
            f"  report {days} d by team with causes: median {statistics.median(with_c) * 1000:.0f}"
            f" ms; without: {statistics.median(without_c) * 1000:.0f} ms; ratio {ratio:.2f}"
            " (target <= 1.30)"
        )
        if check:
            compare(conn, settings, start, data)
        print(
            f"  report {days} d grouped by team: best {best * 1000:.0f} ms, median "
            f"{median * 1000:.0f} ms ({len(data['rows'])} rows, total ${data['totals']['cost_usd']:,.0f}, "
            f"waste ${data['totals']['waste_usd']:,.0f})"
        )
        best, median, data = timed(
            lambda: cost_report.cost_report(
                conn, settings=settings, start=start, end=END, now=END, group_by="job"
            ),
            3,
        )
        print(
            f"  report {days} d grouped by job: best {best * 1000:.0f} ms, median {median * 1000:.0f} ms"
        )
        # The job with the most GPU-hours: the slowest summary.
        jid = conn.execute(
            text(
                "SELECT job_id FROM job_gpus GROUP BY job_id "
                "ORDER BY count(*) DESC, max(ended_at) - min(started_at) DESC LIMIT 1"
            )
        ).scalar_one()
        job = jobs_repo.get_job(conn, job_id=jid)
        assert job is not None
        best, median, _summary = timed(
            lambda: job_summary(conn, settings=settings, job=job, now=END), 10
        )
        print(
            f"  job summary ({jid}, {len(job['intervals'])} GPUs, "
            f"{(job['ended_at'] - job['started_at']).total_seconds() / 3600:.1f} h): "
            f"best {best * 1000:.1f} ms, median {median * 1000:.1f} ms"
        )


SHARED_JOB_PREFIX = "shared:"


def shared_jobs(
    n_gpus: int, days: int, fraction: float, rng: random.Random
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Jobs that share a fraction of the GPUs: on each, a training job and a notebook hold it
    the whole window, and a third job holds it from a mid-hour, mid-minute moment of day 6 to
    one of day 21 (so 2-3 tenants, more where generated jobs also hold the GPU)."""
    start = END - timedelta(days=days)
    n_shared = round(n_gpus * fraction)
    chosen = sorted(rng.sample(range(1, n_gpus + 1), n_shared))
    job_rows: list[dict[str, Any]] = []
    interval_rows: list[dict[str, Any]] = []
    third = (
        start + timedelta(days=min(6, days / 5), minutes=20, seconds=17),
        start + timedelta(days=min(21, days * 0.7), minutes=40, seconds=5),
    )
    for gpu_id in chosen:
        for name, (begin, end) in (
            ("train", (start, END)),
            ("notebook", (start, END)),
            ("eval", third),
        ):
            jid = f"{SHARED_JOB_PREFIX}{name}-{gpu_id}"
            job_rows.append(
                {"id": jid, "user": f"user{rng.randrange(200)}", "team": f"team{rng.randrange(20)}",
                 "project": None, "labels": {}, "source": "api", "started_at": begin,
                 "ended_at": end, "created_at": begin, "updated_at": end}
            )  # fmt: skip
            interval_rows.append(
                {"job_id": jid, "gpu_id": gpu_id, "started_at": begin, "ended_at": end,
                 "source": "api"}
            )  # fmt: skip
    return job_rows, interval_rows


def load_shared(engine: Engine, n_gpus: int, days: int, fraction: float) -> None:
    """Share ``fraction`` of the GPUs (``shared_jobs``) and write tenant_1m rows for every
    minute two or more jobs hold one of them, as the rollup job would: each holder gets an
    equal share of the GPU's 1m rollup row (the ``equal`` rule; an edge minute is split as if
    every holder held all of it)."""
    rng = random.Random(4242)
    t = time.perf_counter()
    job_rows, interval_rows = shared_jobs(n_gpus, days, fraction, rng)
    with engine.begin() as conn:
        conn.execute(insert(jobs), job_rows)
        conn.execute(insert(job_gpus), interval_rows)
        shared_ids = sorted({row["gpu_id"] for row in interval_rows})
        ids = ", ".join(str(g) for g in shared_ids)
        # The minute an interval starts in is held (in part) by it: compare with that minute.
        if engine.dialect.name == "postgresql":
            first_minute = "date_trunc('minute', iv.started_at)"
        else:
            first_minute = "strftime('%Y-%m-%d %H:%M:00.000000', iv.started_at)"
        f_cols = ", ".join(INTEGRAL_FIELDS)
        shares = ", ".join(f"x.{f} / x.k" for f in INTEGRAL_FIELDS)
        conn.execute(
            text(
                f"INSERT INTO tenant_1m (gpu_id, bucket_start, tenant, interval_id, split_rule, "
                f"held_seconds, {f_cols}) "
                f"SELECT x.gpu_id, x.bucket_start, x.job_id, x.iv_id, 'equal', 60.0 / x.k, "
                f"{shares} FROM (SELECT m.*, iv.job_id, iv.id AS iv_id, "
                "  COUNT(*) OVER (PARTITION BY m.gpu_id, m.bucket_start) AS k "
                "  FROM rollup_1m m JOIN job_gpus iv ON iv.gpu_id = m.gpu_id "
                f"  AND {first_minute} <= m.bucket_start AND iv.ended_at > m.bucket_start "
                f"  WHERE m.gpu_id IN ({ids})) x WHERE x.k >= 2"
            )
        )
        n_rows = conn.execute(select(func.count()).select_from(tenant_1m)).scalar_one()
    analyze(engine)
    print(
        f"  shared: {len(shared_ids)} GPUs, {len(job_rows)} jobs, {n_rows:,} tenant_1m rows "
        f"in {time.perf_counter() - t:.0f} s",
        flush=True,
    )


def fill_tenant_hours(engine: Engine) -> None:
    """Sum the tenant_1m rows into their hours and days, as the rollup job does after writing
    them (where a migration did not already)."""
    with engine.begin() as conn:
        if conn.execute(select(func.count()).select_from(shared_1h)).scalar_one():
            return
        t = time.perf_counter()
        hours = sorted(
            {
                (g, b.replace(minute=0))
                for g, b in conn.execute(select(tenant_1m.c.gpu_id, tenant_1m.c.bucket_start))
            }
        )
        tenants_repo.rollup_hours(conn, hours, hours)
    analyze(engine)
    print(f"  tenant hours and days: {len(hours):,} GPU-hours in {time.perf_counter() - t:.0f} s")


def bench_shared(engine: Engine, days: int, runs: int) -> None:
    """Time the team and job reports as they are (the shared minutes loaded or not)."""
    settings = Settings()
    start = END - timedelta(days=days)
    with engine.connect() as conn:
        n_tenant = conn.execute(select(func.count()).select_from(tenant_1m)).scalar_one()
        for group_by in ("team", "job"):
            best, median, data = timed(
                lambda g=group_by: cost_report.cost_report(
                    conn, settings=settings, start=start, end=END, now=END, group_by=g
                ),
                runs,
            )
            print(
                f"  [{n_tenant:,} tenant_1m rows] report {days} d grouped by {group_by}: best "
                f"{best * 1000:.0f} ms, median {median * 1000:.0f} ms ({len(data['rows'])} rows, "
                f"total ${data['totals']['cost_usd']:,.2f})",
                flush=True,
            )


EDGE_SAMPLE_SECONDS = 10.0  # an agent's default interval
# Minutes stored around each edge's minute m: m - 2 to m + 1 (the read, the minute before it
# whose last sample covers its first seconds, and a margin either side).
EDGE_MINUTES = range(-2, 2)
_EDGE_FIELDS = ("covered_seconds", "unused_seconds", "energy_used_joules", "idle_empty_seconds",
                "idle_held_seconds", "compute_tensor_seconds")  # fmt: skip


def load_edge_samples(engine: Engine, days: int) -> None:
    """Store raw samples every 10 s over the minutes around each job edge inside raw retention,
    each with the activity, cause and power of its 1m bucket (so edges read raw agree with
    edges read pro rata); each GPU's samples at its own sub-second phase."""
    t = time.perf_counter()
    raw_from = END - timedelta(days=Settings().retention_raw_days)
    rng = random.Random(77)
    with engine.begin() as conn:
        edges = conn.execute(
            select(job_gpus.c.gpu_id, job_gpus.c.started_at, job_gpus.c.ended_at)
        ).all()
        minutes: set[tuple[int, datetime]] = set()
        for gpu_id, *ends in edges:
            for edge in ends:
                if edge is None or not raw_from <= edge < END:
                    continue
                floor = edge.replace(second=0, microsecond=0)
                minutes |= {(gpu_id, floor + timedelta(minutes=k)) for k in EDGE_MINUTES}
        table = cost_scratch.scratch_table(
            "bench_edge_minutes", ("gpu_id", "minute"), timestamps={"minute"}, integers={"gpu_id"}
        )
        cost_scratch.fill(conn, table, sorted(minutes))
        m = rollup_1m.c
        buckets = conn.execute(
            select(m.gpu_id, m.bucket_start, *(m[f] for f in _EDGE_FIELDS)).select_from(
                table.join(rollup_1m, (m.gpu_id == table.c.gpu_id)
                           & (m.bucket_start == table.c.minute))
            )
        ).all()  # fmt: skip
        phase = {gpu_id: rng.uniform(0, EDGE_SAMPLE_SECONDS) for gpu_id, _ in minutes}
        rows = []
        for gpu_id, minute, covered, unused, joules, empty, held, tensor in buckets:
            if not covered:
                continue
            cause = (
                Cause.IDLE_EMPTY if empty else Cause.IDLE_HELD if held
                else Cause.COMPUTE_TENSOR if tensor else Cause.COMPUTE_NO_TENSOR
            )  # fmt: skip
            for k in range(round(60 / EDGE_SAMPLE_SECONDS)):
                ts = minute + timedelta(seconds=phase[gpu_id] + k * EDGE_SAMPLE_SECONDS)
                rows.append(
                    (gpu_id, ts, "agent", 1 - unused / covered, int(Rung.SM_ACTIVE), int(cause),
                     joules / covered, 0.5 if tensor else 0.0)
                )  # fmt: skip
        if engine.dialect.name == "postgresql":
            partitions.ensure_partitions(conn, {row[1].date() for row in rows})
        cols = ("gpu_id", "ts", "source", "activity", "activity_rung", "cause", "power_watts",
                "tensor_active")  # fmt: skip
        cost_scratch.load_rows(conn, samples, cols, rows)
    analyze(engine)
    print(
        f"  edge samples: {len(rows):,} around the edges of {len(minutes) // len(EDGE_MINUTES):,} "
        f"GPU-minutes (every {EDGE_SAMPLE_SECONDS:g} s) in {time.perf_counter() - t:.0f} s",
        flush=True,
    )


def bench_edges(engine: Engine, days: int, runs: int) -> None:
    """Time the team and job reports with every edge inside raw retention read from raw
    samples and with edges pro rata from their 1m bucket, interleaved, and compare totals."""
    settings = Settings()
    start = END - timedelta(days=days)
    with engine.connect() as conn:
        n_samples = conn.execute(select(func.count()).select_from(samples)).scalar_one()
        for group_by in ("team", "job"):
            times: dict[bool, list[float]] = {True: [], False: []}
            totals: dict[bool, dict[str, Any]] = {}
            for raw in (True, False):  # warm the caches
                report_via(
                    ReadPath(edges=edge_rule(raw)),
                    conn, settings=settings, start=start, end=END, now=END, group_by=group_by,
                )  # fmt: skip
            for _ in range(runs):
                for raw in (True, False):
                    t = time.perf_counter()
                    data = report_via(
                        ReadPath(edges=edge_rule(raw)),
                        conn, settings=settings, start=start, end=END, now=END, group_by=group_by,
                    )  # fmt: skip
                    times[raw].append(time.perf_counter() - t)
                    totals[raw] = data["totals"]
            diff = max(
                abs(totals[True][f] - totals[False][f]) / abs(totals[False][f])
                for f in ("allocated_seconds", "unused_seconds", "cost_usd")
                if totals[False][f]
            )
            print(
                f"  [{n_samples:,} raw samples] report {days} d grouped by {group_by}: edges raw "
                f"best {min(times[True]) * 1000:.0f} ms, median "
                f"{statistics.median(times[True]) * 1000:.0f} ms; pro rata best "
                f"{min(times[False]) * 1000:.0f} ms, median "
                f"{statistics.median(times[False]) * 1000:.0f} ms; totals differ by {diff:.1e}",
                flush=True,
            )


def edge_rule(raw: bool) -> EdgeRule:
    """The edge rule of the benches' raw flag: raw samples, or pro rata from the minute."""
    return "raw" if raw else "minute"


def report_via(path: ReadPath, conn: Connection, **kwargs: Any) -> dict[str, Any]:
    """``cost_report`` read by ``path`` (the switches only benchmarks and tests set)."""
    with forced(path):
        return cost_report.cost_report(conn, **kwargs)


def write_day_sums(engine: Engine) -> None:
    """Write every GPU-day's sums as the cost-days job does, and say how long it took."""
    settings = Settings()
    t = time.perf_counter()
    n = cost_days.write_days(engine, settings=settings, clock=lambda: END, budget_seconds=1e9)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT count(*) FROM cost_job_1d")).scalar_one()
    analyze(engine)
    print(
        f"  day sums: {n:,} GPU-days, {rows:,} (job, GPU, day) rows written in "
        f"{time.perf_counter() - t:.1f} s",
        flush=True,
    )


MONEY_FIELDS = ("cost_usd", "waste_usd", "idle_usd", "fixable_usd", "nodata_usd")


def bench_day_sums(engine: Engine, days: int, runs: int, csv_dir: str | None = None) -> None:
    """Time the team, user and job reports without and with the day sums, interleaved in one
    run, over whole days and over a window that cuts its first and last day; compare them."""
    settings = Settings()
    windows = {
        "whole days": (END - timedelta(days=days), END),
        "two edge days": (END - timedelta(days=days, hours=-7), END - timedelta(hours=5)),
    }
    with engine.connect() as conn:
        for label, (start, end) in windows.items():
            for group_by in ("team", "user", "job"):
                times: dict[bool, list[float]] = {False: [], True: []}
                out: dict[bool, Any] = {}
                for flag in (False, True):  # warm the caches
                    report_via(ReadPath(day_sums=flag), conn, settings=settings, start=start,
                               end=end, now=END, group_by=group_by)  # fmt: skip
                for _ in range(runs):
                    for flag in (False, True):
                        t = time.perf_counter()
                        out[flag] = report_via(
                            ReadPath(day_sums=flag),
                            conn, settings=settings, start=start, end=end, now=END,
                            group_by=group_by,
                        )  # fmt: skip
                        times[flag].append(time.perf_counter() - t)
                report_bytes.save(csv_dir, f"{label.replace(' ', '_')}_{group_by}", out[True])
                # Exactness: both read every edge from raw samples (the default reading takes
                # a fleet's edges pro rata from their minute, the day sums' edges are raw).
                exact = {
                    flag: report_via(
                        ReadPath(edges="raw", day_sums=flag),
                        conn, settings=settings, start=start, end=end, now=END,
                        group_by=group_by,
                    )
                    for flag in (False, True)
                }  # fmt: skip
                print(
                    f"  [{label}] report {days} d by {group_by}: before best "
                    f"{min(times[False]) * 1000:.0f} ms (median "
                    f"{statistics.median(times[False]) * 1000:.0f}); after best "
                    f"{min(times[True]) * 1000:.0f} ms (median "
                    f"{statistics.median(times[True]) * 1000:.0f}); {len(out[True]['rows'])} "
                    f"rows, total ${out[True]['totals']['cost_usd']:,.2f}; largest difference "
                    f"edges raw in both {_worst(exact[False], exact[True])}, as timed "
                    f"{_worst(out[False], out[True])}",
                    flush=True,
                )


# The rolling windows of ``--rolling``: a "last 30 days" cut at whole hours, and one cut at
# any second (what the console asks), each timed beside the whole days in the same run.
ROLLING_CUTS = {
    "whole days": (timedelta(0), timedelta(0)),
    "whole hours": (timedelta(hours=7), timedelta(hours=5)),
    "any second": (
        timedelta(hours=7, minutes=13, seconds=27.5),
        timedelta(hours=5, minutes=41, seconds=12.25),
    ),
}
ROLLING_REPORTS = (("team", None), ("user", None), ("job", 100))


def bench_rolling(engine: Engine, days: int, runs: int, csv_dir: str | None = None) -> None:
    """Time the team, user and first-100-jobs reports from the day sums over the whole days,
    a window cut at whole hours and one cut at any second, alternated in one run; print each
    beside the whole days' (best / median of ``runs`` after a warm-up)."""
    settings = Settings()
    windows = {
        label: (END - timedelta(days=days) + after, END - before)
        for label, (after, before) in ROLLING_CUTS.items()
    }
    with engine.connect() as conn:
        for group_by, limit in ROLLING_REPORTS:
            times: dict[str, list[float]] = {label: [] for label in windows}

            def report(label: str, g: str = group_by, n: int | None = limit) -> Any:
                start, end = windows[label]
                return cost_report.cost_report(
                    conn, settings=settings, start=start, end=end, now=END, group_by=g, limit=n
                )

            for label in windows:  # warm the caches
                report(label)
            for run in range(runs):
                for label in windows:
                    t = time.perf_counter()
                    out = report(label)
                    times[label].append(time.perf_counter() - t)
                    if run == 0:
                        name = f"rolling_{label.replace(' ', '_')}_{group_by}"
                        report_bytes.save(csv_dir, name, out)
            base = min(times["whole days"])
            for label, ts in times.items():
                print(
                    f"  [rolling] report {days} d by {group_by} (limit {limit}), {label}: best "
                    f"{min(ts) * 1000:.0f} ms (median {statistics.median(ts) * 1000:.0f}); "
                    f"{min(ts) / base:.2f}x the whole days'; load "
                    f"{Path('/proc/loadavg').read_text().split()[0]}",
                    flush=True,
                )


def bench_scope(engine: Engine, days: int, runs: int) -> None:
    """Time a signed-in person's reports (their own jobs and one team's, JobScope) beside the
    same reports of the whole fleet, interleaved, from the day sums: the job list's page (by
    job, 50 rows) and the report by team. Target: the person's at most the fleet's."""
    settings = Settings()
    start, end = END - timedelta(days=days), END
    scope = JobScope(users=frozenset({"user7"}), teams=frozenset({"team3"}))
    with engine.connect() as conn:
        for group_by, limit in (("job", 50), ("team", None)):
            times: dict[bool, list[float]] = {False: [], True: []}
            out: dict[bool, Any] = {}

            def report(scoped: bool, g: str = group_by, n: int | None = limit) -> Any:
                return cost_report.cost_report(
                    conn, settings=settings, start=start, end=end, now=END, group_by=g,
                    limit=n, jobs_only=g == "job", scope=scope if scoped else None,
                )  # fmt: skip

            for flag in (False, True):  # warm the caches
                report(flag)
            for _ in range(runs):
                for flag in (False, True):
                    t = time.perf_counter()
                    out[flag] = report(flag)
                    times[flag].append(time.perf_counter() - t)
            fleet, person = (min(times[f]) * 1000 for f in (False, True))
            print(
                f"  person's report {days} d by {group_by} (limit {limit}): best "
                f"{person:.0f} ms (median {statistics.median(times[True]) * 1000:.0f}), "
                f"{out[True]['row_count']} rows; the fleet's best {fleet:.0f} ms (median "
                f"{statistics.median(times[False]) * 1000:.0f}), {out[False]['row_count']} rows; "
                f"target person <= fleet: {'met' if person <= fleet * 1.05 else 'NOT met'}",
                flush=True,
            )


def _worst(a: dict[str, Any], b: dict[str, Any]) -> str:
    """The largest difference of a money field between two reports' rows (and whether they
    have the same rows)."""
    rows = {r["key"]: r for r in a["rows"]}
    if sorted(rows) != sorted(r["key"] for r in b["rows"]):
        return "(different rows)"
    worst = {
        f: max((abs((r[f] or 0.0) - (rows[r["key"]][f] or 0.0)) for r in b["rows"]), default=0.0)
        for f in MONEY_FIELDS
    }
    return ", ".join(f"{f} ${v:.4f}" for f, v in worst.items())


def engine_for(backend: str, args: argparse.Namespace) -> tuple[Engine, bool]:
    """The bench database of ``backend`` and whether it already holds data."""
    if backend == "sqlite":
        path = Path(args.sqlite_path)
        fresh = not args.reuse or not path.exists()
        if fresh:
            for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                p.unlink(missing_ok=True)
        engine = make_engine(f"sqlite:///{path}")
    else:
        admin = args.pg_admin_url
        fresh = True
        with psycopg.connect(admin, autocommit=True) as c:
            exists = c.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (args.pg_database,)
            ).fetchone()
            if exists and args.reuse:
                fresh = False
            else:
                c.execute(f'DROP DATABASE IF EXISTS "{args.pg_database}" WITH (FORCE)')
                c.execute(f'CREATE DATABASE "{args.pg_database}"')
        base = admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
        engine = make_engine(f"{base}/{args.pg_database}")
    return engine, fresh


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    p.add_argument("--gpus", type=int, default=1000)
    p.add_argument("--days", type=int, default=30)
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--sqlite-path", default="/tmp/gpuwarden-bench.db")
    p.add_argument("--pg-admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--pg-database", default="gpuwarden_bench", help="dropped and created anew")
    p.add_argument("--reuse", action="store_true", help="keep data loaded by an earlier run")
    p.add_argument(
        "--compare", action="store_true", help="also time the bucket-by-bucket reading and diff"
    )
    p.add_argument(
        "--shared-gpus", type=float, default=0.0,
        help="then share this fraction of the GPUs among 2-3 jobs and time the reports again",
    )  # fmt: skip
    p.add_argument("--shared-runs", type=int, default=2, help="timed runs per shared report")
    p.add_argument(
        "--edge-samples", action="store_true",
        help="store raw samples around the job edges in raw retention; time edges raw vs pro rata",
    )  # fmt: skip
    p.add_argument("--edge-runs", type=int, default=3, help="timed runs per edge reading")
    p.add_argument(
        "--day-sums", action="store_true",
        help="write the cost day sums, then time the reports without and with them",
    )  # fmt: skip
    p.add_argument("--day-runs", type=int, default=3, help="timed runs per day-sums reading")
    p.add_argument("--skip-base", action="store_true", help="skip the base report timings")
    p.add_argument("--csv-dir", help="save the day-sum reports' CSV here (bench.report_bytes)")
    p.add_argument(
        "--rolling", action="store_true",
        help="time rolling windows (cut at whole hours, at any second) beside the whole days",
    )  # fmt: skip
    p.add_argument(
        "--scope", action="store_true",
        help="time a signed-in person's reports (their jobs and a team's) beside the fleet's",
    )  # fmt: skip
    args = p.parse_args()
    backends = ("sqlite", "postgresql") if args.backend == "both" else (args.backend,)
    print(f"{args.gpus} GPUs x {args.days} days, {args.jobs} jobs")
    print(f"code timed: {Path(freeze_start_up_objects.__code__.co_filename).parents[2]}")
    for backend in backends:
        print(f"{backend}:", flush=True)
        engine, fresh = engine_for(backend, args)
        if fresh:
            t = time.perf_counter()
            upgrade(engine)
            load(engine, args.gpus, args.days, args.jobs)
            print(f"  loaded in {time.perf_counter() - t:.0f} s", flush=True)
        elif args.shared_gpus or args.edge_samples:
            upgrade(engine)  # data loaded by older code: migrations fill what they add
            fill_tenant_hours(engine)
        if args.edge_samples:
            with engine.connect() as conn:
                stored = conn.execute(select(func.count()).select_from(samples)).scalar_one()
            if not stored:
                load_edge_samples(engine, args.days)
        if not args.skip_base:
            bench(engine, args.days, args.compare)
        if args.day_sums:
            with engine.connect() as conn:
                summed = conn.execute(text("SELECT count(*) FROM cost_gpu_1d")).scalar_one()
            if not summed:
                upgrade(engine)
                write_day_sums(engine)
            bench_day_sums(engine, args.days, args.day_runs, args.csv_dir)
        if args.rolling:
            with engine.connect() as conn:
                summed = conn.execute(text("SELECT count(*) FROM cost_gpu_1d")).scalar_one()
            if not summed:
                write_day_sums(engine)
            bench_rolling(engine, args.days, args.day_runs, args.csv_dir)
        if args.scope:
            with engine.connect() as conn:
                summed = conn.execute(text("SELECT count(*) FROM cost_gpu_1d")).scalar_one()
            if not summed:
                write_day_sums(engine)
            bench_scope(engine, args.days, args.day_runs)
        if args.edge_samples:
            bench_edges(engine, args.days, args.edge_runs)
        if args.shared_gpus:
            with engine.connect() as conn:
                loaded = conn.execute(select(func.count()).select_from(tenant_1m)).scalar_one()
            if not loaded:
                bench_shared(engine, args.days, args.shared_runs)  # before: none shared
                load_shared(engine, args.gpus, args.days, args.shared_gpus)
            fill_tenant_hours(engine)
            bench_shared(engine, args.days, args.shared_runs)
        engine.dispose()


if __name__ == "__main__":
    main()
