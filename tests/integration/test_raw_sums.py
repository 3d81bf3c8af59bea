"""The raw-sample integration inside the database (one statement per report) gives the numbers
``integrate`` gives in Python, on SQLite and PostgreSQL: random sample sequences with gaps
longer than max_gap, nodata samples, the gpu_util rung, no power, sub-second timestamps, reads
inside one minute, reads sharing a GPU, one stretch read for several groups, and reads that meet
(a job's start inside a minute: both sides read in one scan)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from sqlalchemy import Engine, insert

from service.core.diagnosis import Cause, Rung
from service.costs.integrals import (
    INTEGRAL_FIELDS,
    SIGNAL_METRICS,
    Thresholds,
    integrate,
    stored_point,
)
from service.costs.waste import Span, Usage
from service.db.costing.raw_sums import sum_raw
from service.db.partitions import ensure_partitions
from service.db.schema import CUMULATIVE_FIELDS, gpus, nodes, samples

T0 = datetime(2026, 12, 2, 5, 0, 0, 250_000, tzinfo=UTC)
GPUS = (1, 2)
THRESHOLDS = Thresholds()  # max_gap 60 s


def random_samples(rng: random.Random, gpu_id: int, n: int) -> list[dict[str, object]]:
    """``n`` samples from T0, 0.3 s to 150 s apart (some gaps past max_gap), at any microsecond."""
    rows = []
    ts = T0 + timedelta(seconds=rng.uniform(0, 5))
    for _ in range(n):
        draw = rng.random()
        activity = None if draw < 0.1 else rng.random()
        # A sample with an activity but no cause is nodata too.
        cause = None if activity is None or draw > 0.95 else int(rng.choice(list(Cause)))
        rows.append(
            {
                "gpu_id": gpu_id,
                "ts": ts,
                "source": "test",
                "activity": activity,
                "activity_rung": None if activity is None else int(rng.choice(list(Rung))),
                "cause": cause,
                "power_watts": None if rng.random() < 0.2 else rng.uniform(50, 700),
                "tensor_active": None if rng.random() < 0.3 else rng.random(),
                "dram_active": None if rng.random() < 0.5 else rng.random(),
                "gr_engine_active": None if rng.random() < 0.3 else rng.random(),
                "gpu_util": None if rng.random() < 0.3 else rng.random(),
                "pcie_tx_bytes_per_second": None if rng.random() < 0.3 else rng.uniform(0, 6e10),
                "pcie_rx_bytes_per_second": None if rng.random() < 0.3 else rng.uniform(0, 6e10),
            }
        )
        step = rng.choice((0.3, 1.0, 9.999, 10.0, 10.0, 30.5, 59.9, 61.0, 150.0)) * rng.uniform(
            0.9, 1.1
        )
        ts += timedelta(microseconds=round(step * 1e6))
    return rows


def expected(rows: list[dict[str, object]], read: Span) -> Usage:
    """The read's usage as the Python integration computes it, times its factor."""
    points = [
        stored_point(r["ts"].timestamp(), r["activity"], r["activity_rung"], r["cause"],  # type: ignore[attr-defined,arg-type]
                     r["power_watts"], {m: r[m] for m in SIGNAL_METRICS})  # type: ignore[arg-type,misc]
        for r in rows
        if r["gpu_id"] == read.gpu_id
    ]  # fmt: skip
    integrals = integrate(points, read.start.timestamp(), read.end.timestamp(), THRESHOLDS)
    usage = Usage(**{name: getattr(integrals, name) for name in INTEGRAL_FIELDS})
    for r in rows:
        if r["gpu_id"] == read.gpu_id and read.start <= r["ts"] < read.end:  # type: ignore[operator]
            for metric in ("tensor_active", "dram_active"):
                if r[metric] is not None:
                    setattr(usage, f"{metric}_sum", getattr(usage, f"{metric}_sum") + r[metric])
                    setattr(usage, f"{metric}_count", getattr(usage, f"{metric}_count") + 1)
    return usage.scaled(read.factor)


def random_reads(rng: random.Random, n_groups: int, rows: list[dict[str, object]]) -> list[Span]:
    reads = []
    for _ in range(40):
        lo = T0 + timedelta(seconds=rng.uniform(-100, 3000))
        length = rng.choice((0.5, 7.25, 59.0, 60.0, 300.0, 1800.0)) * rng.uniform(0.5, 1.0)
        hi = lo + timedelta(seconds=length)
        reads.append(Span(rng.randrange(n_groups), rng.choice(GPUS), lo, hi,
                          rng.choice((1.0, 0.5, 1 / 3))))  # fmt: skip
    # A minute read as two edge pieces (a split inside it) and a read exactly at a sample.
    reads.append(Span(0, 1, T0 + timedelta(seconds=120), T0 + timedelta(seconds=143.5), 1.0))
    reads.append(Span(0, 1, T0 + timedelta(seconds=143.5), T0 + timedelta(seconds=180), 1.0))
    # A job starting mid-minute on GPU 2: the seconds before its first whole minute, then the
    # minute split at its start (two reads scanned as one), then a third piece meeting those.
    cuts = [T0 + timedelta(seconds=s) for s in (455.125, 480.0, 497.75, 540.0, 561.5)]
    for group, (lo, hi) in enumerate(pairwise(cuts)):
        reads.append(Span(group % n_groups, 2, lo, hi, 1.0))
    # The same stretch read for three groups (jobs sharing a GPU): integrated once, each gets
    # its factor's share.
    reads += [reads[0]._replace(group=g, factor=f) for g, f in ((2, 0.25), (3, 0.5), (2, 1.0))]
    # Reads from one sample to another: the first counts, the last does not.
    tensor = [r for r in rows if r["tensor_active"] is not None]
    for a, b in zip(tensor[10:20], tensor[12:22], strict=True):
        reads.append(Span(1, a["gpu_id"], a["ts"], b["ts"], 1.0))  # type: ignore[arg-type]
    return reads


@pytest.mark.parametrize("seed", range(4))
def test_the_database_integrates_raw_samples_as_integrate_does(engine: Engine, seed: int) -> None:
    rng = random.Random(seed)
    rows = [row for gpu_id in GPUS for row in random_samples(rng, gpu_id, 150)]
    with engine.begin() as conn:
        conn.execute(
            insert(nodes),
            [{"hostname": "n", "labels": {}, "first_seen_at": T0, "last_seen_at": T0}],
        )
        conn.execute(
            insert(gpus),
            [{"id": g, "uuid": f"GPU-{g}", "node_id": 1, "gpu_index": g, "model": "H100",
              "first_seen_at": T0} for g in GPUS],
        )  # fmt: skip
        if conn.dialect.name == "postgresql":
            ensure_partitions(conn, {T0.date()})
        conn.execute(insert(samples), rows)
    n_groups = 5
    reads = random_reads(rng, n_groups, rows)
    want = [Usage() for _ in range(n_groups)]
    for read in reads:
        want[read.group].add(expected(rows, read))
    got = [Usage() for _ in range(n_groups)]
    with engine.connect() as conn:
        sum_raw(conn, reads, got, THRESHOLDS, CUMULATIVE_FIELDS)
    assert any(w.covered_seconds > 0 for w in want)
    assert any(w.fallback_seconds > 0 for w in want)
    for group, (g, w) in enumerate(zip(got, want, strict=True)):
        for name in CUMULATIVE_FIELDS:
            assert getattr(g, name) == pytest.approx(getattr(w, name), rel=1e-9, abs=1e-6), (
                group,
                name,
            )
