"""The fleet collector for /metrics: reads the database at scrape time, never fails a scrape."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Connection

from service.context import ServiceContext
from service.costs.assumptions import fix_assumptions_of
from service.db import policies_repo, savings_repo
from service.db.evidence_repo import CLOCK_OFFSET_VALID_SECONDS
from service.db.metrics_repo import (
    count_actions,
    node_clock_offsets,
    node_last_seen,
    read_fleet,
    shard_node_ids,
)
from service.exposition.actions import actions_family, ladder_label_sets
from service.exposition.fleet import fleet_families
from service.exposition.shards import Shard
from service.usecases.price_table import effective_prices

# The two kinds of family the fleet collector fills with series.
F = TypeVar("F", CounterMetricFamily, GaugeMetricFamily)

log = logging.getLogger(__name__)


class FleetCollector(Collector):
    """Per-GPU and fleet families built from the latest sample per GPU on every collect()."""

    def __init__(self, ctx: ServiceContext, shard: Shard | None = None) -> None:
        self._ctx = ctx
        self._shard = shard  # None: the whole fleet

    def describe(self) -> Iterable[Metric]:
        # Declaring nothing keeps registration from calling collect(), which reads the database.
        return []

    def collect(self) -> Iterable[Metric]:
        """The fleet families; on a database error only gpuwarden_fleet_metrics_up 0."""
        ctx = self._ctx
        started = time.perf_counter()
        try:
            now = ctx.clock()
            shard = self._shard
            with ctx.reads.connect() as conn:
                # A shard reads only its nodes' GPUs; shard 0 reads every GPU, for the fleet
                # figures it alone carries.
                node_ids = None if shard is None else shard_node_ids(conn, shard=shard)
                fleet_ids = None if shard is None or shard.carries_fleet else node_ids
                # A GPU whose data is late (ingest behind, a slow node) stays, with its age:
                # dropping it would flap dashboards and absent() alerts fleet-wide.
                keep = max(ctx.settings.metrics_keep_late_seconds, ctx.settings.max_gap_seconds)
                snapshot = read_fleet(
                    conn,
                    now=now,
                    max_age_seconds=keep,
                    start_skew_seconds=ctx.settings.ingest_max_future_seconds,
                    node_ids=fleet_ids,
                )
                # the same table in force as the cost reports: stored, else config, else default
                prices = effective_prices(conn, ctx.settings).rows
                # Nodes silent longer than raw retention are taken as gone for good.
                horizon = now - timedelta(days=ctx.settings.retention_raw_days)
                last_seen = node_last_seen(conn, since=horizon, node_ids=node_ids)
                measured = now - timedelta(seconds=CLOCK_OFFSET_VALID_SECONDS)
                offsets = node_clock_offsets(conn, since=measured, node_ids=node_ids)
            snapshot = replace(snapshot, prices=prices)
            families = fleet_families(
                snapshot,
                thresholds=ctx.thresholds,
                now=now,
                dcgm_compat=ctx.settings.metrics_dcgm_compat,
                assumptions=fix_assumptions_of(ctx.settings),
                exported=None if fleet_ids is not None or shard is None else shard.holds,
                fleet_wide=shard is None or shard.carries_fleet,
            )
            families.append(node_last_seen_family(last_seen))
            families.append(node_clock_offset_family(offsets))
            if shard is None or shard.carries_fleet:
                # From the primary: a replica lagging behind it would read as a counter reset.
                with ctx.engine.connect() as conn:
                    families.append(actions_counter(conn))
                    families.append(realised_savings_counter(conn))
            up = 1.0
        except Exception:
            log.exception("reading the fleet for /metrics failed")
            ctx.telemetry.db_errors.labels("metrics").inc()
            families, up = [], 0.0
        yield from families
        yield GaugeMetricFamily(
            "gpuwarden_fleet_metrics_up",
            "1 when the fleet families of this scrape were read from the database, else 0.",
            value=up,
        )
        yield GaugeMetricFamily(
            "gpuwarden_fleet_metrics_duration_seconds",
            "Time to read and build the fleet families of this scrape (seconds).",
            value=time.perf_counter() - started,
        )


def actions_counter(conn: Connection) -> CounterMetricFamily:
    """``gpuwarden_actions_total`` from the audit log (the same on every replica, as only the
    leader acts), with each laddered policy's label sets from 0."""
    ladders = [
        (p.name, [step.action for step in p.ladder.steps])
        for p in policies_repo.list_policies(conn)
        if p.ladder is not None
    ]
    return actions_family(count_actions(conn), zero=ladder_label_sets(ladders))


def realised_savings_counter(conn: Connection) -> CounterMetricFamily:
    """``gpuwarden_realised_savings_usd_total{team,cause}``: the booked realised savings the
    savings round stored (docs/savings.md), the same on every replica."""
    family = CounterMetricFamily(
        "gpuwarden_realised_savings_usd",
        "Realised savings (USD) of later runs that applied a fix GPU Warden named, measured "
        "against the earlier run of their work, per team and cause.",
        labels=["team", "cause"],
    )
    return _with_series(family, savings_repo.realised_by_team_and_cause(conn).items())


def _with_series(family: F, series: Iterable[tuple[tuple[str, ...], float]]) -> F:
    """``family`` with one sample per label values of ``series``, in label order."""
    for labels, value in sorted(series):
        family.add_metric(list(labels), value)
    return family


NODE_CLOCK_OFFSET = "gpuwarden_node_clock_offset_seconds"


def node_clock_offset_family(offsets: dict[str, float]) -> GaugeMetricFamily:
    """One series per node measured lately: its clock minus the central's (seconds)."""
    family = GaugeMetricFamily(
        NODE_CLOCK_OFFSET,
        "The node's clock minus the central's, in seconds, from the Date header of its agent's "
        "batches (positive: ahead); past GPUWARDEN_LADDER_MAX_CLOCK_OFFSET_SECONDS no ladder "
        "acts on its jobs.",
        labels=["node"],
    )
    return _with_series(family, (((host,), offset) for host, offset in offsets.items()))


NODE_LAST_SEEN = "gpuwarden_node_last_seen_timestamp_seconds"


def node_last_seen_family(last_seen: dict[str, datetime]) -> GaugeMetricFamily:
    """One series per node: when it last reported (Unix seconds), kept while it is silent."""
    family = GaugeMetricFamily(
        NODE_LAST_SEEN,
        "When the node last reported (its latest batch or GPU sample), in Unix seconds; the "
        "series stays while the node is silent, so time() minus it is how long it has been.",
        labels=["node"],
    )
    return _with_series(family, (((host,), seen.timestamp()) for host, seen in last_seen.items()))
