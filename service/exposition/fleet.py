"""Metric families of the fleet (per-GPU gauges and fleet figures) from the latest readings.

Pure: takes the GPUs' latest readings, the price table, the thresholds and ``now``; returns
prometheus_client metric families. It reads no database and no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from prometheus_client.core import GaugeMetricFamily, Metric

from service.core.diagnosis import (
    CAUSE_NAMES,
    FIXABLE_CAUSES,
    IDLE_CAUSES,
    STATE_NAMES,
    Cause,
    Decision,
    GpuState,
    Rung,
    Thresholds,
    decide,
    gpu_state,
)
from service.costs.money import sample_waste_share, waste_share
from service.costs.prices import price_at
from service.costs.recommend import FixAssumptions
from service.exposition.dcgm import dcgm_families
from service.exposition.families import GpuFamily
from service.exposition.types import FleetGpu, FleetSnapshot, LostGpu
from service.vocabulary import METRICS, MetricSpec

# The alert label vocabulary, so rules built on these series label alerts as GPU Warden does.
# The current job is named job_id, not job: Prometheus attaches its own `job` label (the scrape
# job) to every series, and an exported `job` would be renamed exported_job or, with
# honor_labels, would overwrite it.
# Every per-GPU family carries the GPU's identity only, so its series live as long as the GPU;
# who holds the GPU is one series of gpuwarden_gpu_job_info per GPU (job_id "" while no job
# does), joined in queries: ``... * on (gpu_uuid) group_left (job_id, user, team, project)
# gpuwarden_gpu_job_info``. A new job then starts one new series, not one per family.
LOST_LABELS: tuple[str, ...] = ("node", "gpu_index", "gpu_uuid", "model")
# job_node: every node the job holds a GPU on, comma-joined as a native job alert's node label,
# so a rule's per-job alert can carry the same node (GpuJobLowSmActivity).
JOB_INFO_LABELS: tuple[str, ...] = (
    "node", "gpu_uuid", "job_id", "job_node", "user", "team", "project",
)  # fmt: skip
INFO_LABELS: tuple[str, ...] = (*LOST_LABELS, "source", "mig_parent_uuid")

_UNIT_SUFFIX = {
    "ratio": "ratio",
    "bytes": "bytes",
    "watts": "watts",
    "joules": "joules",
    "celsius": "celsius",
    "hertz": "hertz",
    "bytes_per_second": "bytes_per_second",
    "code": "",  # an XID code is a number without a unit
    "state": "",  # 0 or 1
    "rows": "",  # counts carry no unit suffix (Prometheus naming)
    "replays": "",
    "errors": "",
    "pages": "",
    "bitmask": "",  # NVML's clocks event reasons: bits, no unit
}


def exported_name(spec: MetricSpec) -> str:
    """The Prometheus family name of a canonical metric, with its unit spelt out at the end.

    Counters are named without ``_total``; prometheus_client appends it on exposition.
    """
    base = spec.name
    unit = _UNIT_SUFFIX[spec.unit]
    if base.endswith("_hz") and unit == "hertz":
        base = base[: -len("_hz")]
    if unit and not base.endswith("_" + unit):
        base = f"{base}_{unit}"
    return f"gpuwarden_gpu_{base}"


def info_values(r: FleetGpu) -> tuple[str, ...]:
    """The gpuwarden_gpu_info label values of a reading, in INFO_LABELS order."""
    return (r.node, str(r.index), r.uuid, r.model, r.source, r.mig_parent_uuid or "")


def decision_of(r: FleetGpu, thresholds: Thresholds) -> Decision | None:
    """The reading's stored decision, or (for a reading not from storage) the same rule
    applied to its values; None without an activity figure."""
    if r.activity is not None and r.rung is not None and r.cause is not None:
        return Decision(r.activity, Rung(r.rung), Cause(r.cause))
    return decide(r.values, thresholds)


def fleet_families(
    snapshot: FleetSnapshot,
    *,
    thresholds: Thresholds,
    now: datetime,
    dcgm_compat: bool = False,
    assumptions: FixAssumptions | None = None,
    exported: Callable[[str], bool] | None = None,
    fleet_wide: bool = True,
) -> list[Metric]:
    """Per-GPU gauges, the fleet's idle/idle-held/cost/waste figures and, if asked, DCGM names;
    waste per hour is the price x the waste share of the current cause (docs/costs.md).

    ``exported`` (a node name -> bool) limits the per-GPU families to the GPUs of some nodes
    (a shard of /metrics), while the fleet figures still count every reading; without
    ``fleet_wide`` the fleet figures are left out.
    """
    assumptions = assumptions or FixAssumptions()
    node_exported: dict[str, bool] = {}
    gpus = _GpuFamilies()
    tally = _Tally.starting(lost=len(snapshot.lost))
    price_of = _model_prices(snapshot, now)
    job_nodes = _job_nodes(snapshot)
    for r in snapshot.readings:
        mine = node_exported.get(r.node)
        if mine is None:
            mine = node_exported[r.node] = exported is None or exported(r.node)
        i = gpus.add(r, now, job_nodes) if mine else -1
        price = price_of(r.model)
        tally.count_price(price)
        if mine and price is not None:
            gpus.price.rows.append((i, price))
        d = decision_of(r, thresholds)
        # The readings are the GPUs reporting now, so only their cause decides the state.
        share = (
            sample_waste_share(d, r.values, r.model, assumptions)
            if d is not None and d.cause in FIXABLE_CAUSES
            else None
        )
        state = gpu_state(
            cause=None if d is None else d.cause, lost=False, age_seconds=0.0, fixable_share=share
        )
        tally.by_state[state] += 1
        if d is None:
            continue  # no activity figure: no data is never idle and never waste
        waste = tally.count_decision(d, price, assumptions)
        if mine:
            gpus.add_decision(i, d, waste)

    reporting = {r.uuid for r in snapshot.readings}
    for g in snapshot.lost:
        # A lost GPU sends no samples, yet a job may still hold it: GpuLost names that job.
        if g.uuid not in reporting and (exported is None or exported(g.node)):
            gpus.add_holder(g, job_nodes)
    lost_fam, lost_usd_per_hour = _lost_family(snapshot, now, exported)
    families = [*gpus.in_order(), lost_fam]
    if fleet_wide:
        families += _fleet_families(snapshot, tally, lost_usd_per_hour)
    if dcgm_compat:
        readings = snapshot.readings
        if exported is not None:
            readings = [r for r in readings if node_exported[r.node]]
        families += dcgm_families(readings)
    return families


def _job_nodes(snapshot: FleetSnapshot) -> dict[str, str]:
    """Each job's nodes (those of its reporting and lost GPUs), comma-joined and sorted as a
    native job alert's node label is."""
    nodes: dict[str, set[str]] = {}
    held: list[tuple[str | None, str]] = [(r.job_id, r.node) for r in snapshot.readings]
    held += [(g.job_id, g.node) for g in snapshot.lost]
    for job, node in held:
        if job:
            nodes.setdefault(job, set()).add(node)
    return {job: ",".join(sorted(ns)) for job, ns in nodes.items()}


def _model_prices(snapshot: FleetSnapshot, now: datetime) -> Callable[[str], float | None]:
    """A lookup of a model's price at ``now`` (USD per GPU-hour, None when unpriced), each model
    matched against the price table once."""
    cache: dict[str, float | None] = {}

    def price_of(model: str) -> float | None:
        if model not in cache:
            row = price_at(snapshot.prices, model, now)
            cache[model] = None if row is None else row.usd_per_gpu_hour
        return cache[model]

    return price_of


class _GpuFamilies:
    """The per-GPU families of one scrape; the GPU's identity labels are one shared list."""

    def __init__(self) -> None:
        self.label_sets: list[dict[str, str]] = []
        self.samples = [
            (
                spec.name,
                self._gauge(
                    exported_name(spec),
                    f"{spec.help} ({spec.unit}), from the GPU's latest sample.",
                    "counter" if spec.counter else "gauge",
                ),
            )
            for spec in METRICS
        ]
        self.slots = [(name, fam.rows) for name, fam in self.samples]
        self.fb_total_rows = next(f for name, f in self.samples if name == "fb_total_bytes").rows
        self.last_sample = self._gauge(
            "gpuwarden_gpu_last_sample_timestamp_seconds",
            "Unix time of the GPU's latest sample (seconds).",
        )
        self.age = self._gauge(
            "gpuwarden_gpu_sample_age_seconds",
            "Age of the GPU's latest sample at this scrape (seconds); past max_gap the GPU's data "
            "is late (ingest behind, a slow node) and its series stay until "
            "metrics_keep_late_seconds.",
        )
        self.price = self._gauge(
            "gpuwarden_gpu_price_usd_per_hour",
            "Price of the GPU from the price table (USD per GPU-hour).",
        )
        self.waste = self._gauge(
            "gpuwarden_gpu_waste_usd_per_hour",
            "Waste now: the price x the waste share of the latest sample's cause (all of it when "
            "idle, the fix's saving fraction when inefficient, none when healthy) (USD per hour).",
        )
        self.idle = self._gauge(
            "gpuwarden_gpu_idle",
            "1 when nothing runs on the GPU now (idle_empty or idle_held), else 0 (boolean).",
        )
        self.activity, self.cause, self.info, self.job_info = _own_label_families()

    def _gauge(self, name: str, doc: str, typ: str = "gauge") -> GpuFamily:
        return GpuFamily(name, doc, typ, self.label_sets)

    def add(self, r: FleetGpu, now: datetime, job_nodes: Mapping[str, str]) -> int:
        """Add reading ``r`` as the next GPU: its label sets and its sample's values; its row."""
        i = len(self.label_sets)
        self.label_sets.append(
            {"node": r.node, "gpu_index": str(r.index), "gpu_uuid": r.uuid, "model": r.model}
        )
        values = r.values
        for name, rows in self.slots:
            v = values.get(name)
            if v is not None:
                rows.append((i, v))
        if "fb_total_bytes" not in values and r.fb_total_bytes is not None:
            self.fb_total_rows.append((i, r.fb_total_bytes))
        self.last_sample.rows.append((i, r.last_sample_at.timestamp()))
        self.age.rows.append((i, max(0.0, (now - r.last_sample_at).total_seconds())))
        self.info.label_sets.append(dict(zip(INFO_LABELS, info_values(r), strict=True)))
        self.info.rows.append((i, 1.0))
        self.add_holder(r, job_nodes)
        return i

    def add_holder(self, g: FleetGpu | LostGpu, job_nodes: Mapping[str, str]) -> None:
        """Add the gpuwarden_gpu_job_info series of GPU ``g``: who holds it (none: job_id "")."""
        self.job_info.label_sets.append(
            {
                "node": g.node,
                "gpu_uuid": g.uuid,
                "job_id": g.job_id or "",
                "job_node": job_nodes.get(g.job_id or "", ""),
                "user": g.user or "",
                "team": g.team or "",
                "project": g.project or "",
            }
        )
        self.job_info.rows.append((len(self.job_info.label_sets) - 1, 1.0))

    def add_decision(self, i: int, d: Decision, waste_usd_per_hour: float | None) -> None:
        """Add the decision of the GPU at row ``i``: activity, cause, idle and waste (if priced)."""
        labels = self.label_sets[i]
        self.activity.label_sets.append({**labels, "rung": d.rung.label})
        self.activity.rows.append((len(self.activity.label_sets) - 1, d.activity))
        self.cause.label_sets.append({**labels, "cause": d.cause.label})
        self.cause.rows.append((len(self.cause.label_sets) - 1, 1.0))
        self.idle.rows.append((i, 1.0 if d.cause in IDLE_CAUSES else 0.0))
        if waste_usd_per_hour is not None:
            self.waste.rows.append((i, waste_usd_per_hour))

    def in_order(self) -> list[Metric]:
        """The families in exposition order."""
        families: list[Metric] = [fam for _, fam in self.samples]
        families += [self.last_sample, self.age, self.price, self.waste, self.idle]
        families += [self.activity, self.cause, self.info, self.job_info]
        return families


def _own_label_families() -> tuple[GpuFamily, GpuFamily, GpuFamily, GpuFamily]:
    """Activity, cause, info and job-info: per-GPU families with label sets of their own (one
    more label, the rung or the cause; or other labels than the GPU's identity)."""
    activity = GpuFamily(
        "gpuwarden_gpu_activity_ratio",
        "Activity from the latest sample: sm_active, else gr_engine_active, else gpu_util; "
        "the rung label says which (ratio).",
        "gauge",
        [],
    )
    cause = GpuFamily(
        "gpuwarden_gpu_cause",
        "Always 1; the cause label says why the GPU's latest sample went the way it did.",
        "gauge",
        [],
    )
    info = GpuFamily(
        "gpuwarden_gpu_info",
        "Always 1; labels say where the GPU's activity figures come from (gpm, dcgm, nvml).",
        "gauge",
        [],
    )
    job_info = GpuFamily(
        "gpuwarden_gpu_job_info",
        "Always 1; labels say which job (job_id, user, team, project) holds the GPU now, "
        "job_id empty while none does, and every node the job holds a GPU on (job_node, "
        "comma-separated). Join it to the per-GPU families on gpu_uuid.",
        "gauge",
        [],
    )
    return activity, cause, info, job_info


@dataclass(slots=True)
class _Tally:
    """The fleet figures, counted over every reading (exported or not)."""

    by_cause: dict[str, int]
    by_state: dict[str, int]
    usd_by_cause: dict[str, float]
    idle: int = 0
    idle_held: int = 0
    unpriced: int = 0
    waste_usd_per_hour: float = 0.0
    cost_usd_per_hour: float = 0.0

    @classmethod
    def starting(cls, *, lost: int) -> _Tally:
        """Every cause and state at 0 but the ``lost`` GPUs."""
        by_state = dict.fromkeys(STATE_NAMES, 0)
        by_state[GpuState.LOST] = lost
        return cls(
            by_cause=dict.fromkeys(CAUSE_NAMES, 0),
            by_state=by_state,
            usd_by_cause=dict.fromkeys(CAUSE_NAMES, 0.0),
        )

    def count_price(self, price: float | None) -> None:
        """Count a reporting GPU's price (USD per hour) into the cost, or it as unpriced."""
        if price is None:
            self.unpriced += 1
        else:
            self.cost_usd_per_hour += price

    def count_decision(
        self, d: Decision, price: float | None, assumptions: FixAssumptions
    ) -> float | None:
        """Count a reporting GPU's cause; its waste (USD per hour), None when unpriced."""
        self.by_cause[d.cause.label] += 1
        if d.cause in IDLE_CAUSES:
            self.idle += 1
            if d.cause is Cause.IDLE_HELD:
                self.idle_held += 1
        if price is None:
            return None
        self.usd_by_cause[d.cause.label] += price
        waste = price * waste_share(d.cause, assumptions)
        self.waste_usd_per_hour += waste
        return waste


def _lost_family(
    snapshot: FleetSnapshot, now: datetime, exported: Callable[[str], bool] | None
) -> tuple[GaugeMetricFamily, float]:
    """gpuwarden_gpu_lost of the exported nodes, and the price of every lost GPU (USD per hour)."""
    lost_fam = GaugeMetricFamily(
        "gpuwarden_gpu_lost",
        "1 for a GPU its reporting node says is lost or fell off the bus (boolean).",
        labels=LOST_LABELS,
    )
    lost_usd_per_hour = 0.0
    for g in snapshot.lost:
        if exported is None or exported(g.node):
            lost_fam.add_metric([g.node, str(g.index), g.uuid, g.model], 1.0)
        row = price_at(snapshot.prices, g.model, now)
        if row is not None:
            lost_usd_per_hour += row.usd_per_gpu_hour
    return lost_fam, lost_usd_per_hour


def _fleet_families(
    snapshot: FleetSnapshot, tally: _Tally, lost_usd_per_hour: float
) -> list[Metric]:
    """The fleet-wide families: GPUs by cause and state, and the fleet's figures."""
    families: list[Metric] = [
        _by_label(
            "gpuwarden_fleet_gpus_by_cause",
            "Reporting GPUs whose latest sample has each cause (GPUs).",
            "cause",
            tally.by_cause,
        ),
        _by_label(
            "gpuwarden_fleet_cause_usd_per_hour",
            "Price of the priced GPUs whose latest sample has each cause: what each cause costs "
            "per hour now (USD per hour).",
            "cause",
            {name: tally.usd_by_cause[name] for name in tally.by_cause},
        ),
        _by_label(
            "gpuwarden_fleet_gpus_by_state",
            "GPUs in each state (working, underused, idle-held, idle, lost, no-data, "
            "unclassified, sham, hung), from the cause of each reporting GPU's latest sample; "
            "lost GPUs as lost (GPUs).",
            "state",
            tally.by_state,
        ),
    ]
    families += _fleet_figures(
        reporting=len(snapshot.readings),
        idle=tally.idle,
        idle_held=tally.idle_held,
        lost=len(snapshot.lost),
        unpriced=tally.unpriced,
        waste_usd_per_hour=tally.waste_usd_per_hour,
        cost_usd_per_hour=tally.cost_usd_per_hour + lost_usd_per_hour,
        lost_usd_per_hour=lost_usd_per_hour,
    )
    return families


def _by_label(name: str, doc: str, label: str, values: Mapping[str, float]) -> GaugeMetricFamily:
    """Family ``name`` with one series per ``label`` value of ``values``, in their order."""
    family = GaugeMetricFamily(name, doc, labels=[label])
    for value_of, value in values.items():
        family.add_metric([value_of], value)
    return family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _fleet_figures(
    *,
    reporting: int,
    idle: int,
    idle_held: int,
    lost: int,
    unpriced: int,
    waste_usd_per_hour: float,
    cost_usd_per_hour: float,
    lost_usd_per_hour: float,
) -> Iterable[GaugeMetricFamily]:
    return [
        _gauge(
            "gpuwarden_fleet_gpus",
            "GPUs exported: reported within metrics_keep_late_seconds (GPUs).",
            reporting,
        ),
        _gauge(
            "gpuwarden_fleet_gpus_idle",
            "Reporting GPUs on which nothing runs now: idle_empty or idle_held (GPUs).",
            idle,
        ),
        _gauge(
            "gpuwarden_fleet_gpus_idle_held",
            "Idle GPUs that hold memory (a process or more than the held threshold) (GPUs).",
            idle_held,
        ),
        _gauge("gpuwarden_fleet_gpus_lost", "GPUs lost or fallen off the bus (GPUs).", lost),
        _gauge(
            "gpuwarden_fleet_gpus_unpriced",
            "Reporting GPUs whose model matches no price-table pattern (GPUs).",
            unpriced,
        ),
        _gauge(
            "gpuwarden_fleet_waste_usd_per_hour",
            "Waste across the fleet now: the sum of gpuwarden_gpu_waste_usd_per_hour "
            "(USD per hour).",
            waste_usd_per_hour,
        ),
        _gauge(
            "gpuwarden_fleet_cost_usd_per_hour",
            "Price of all priced GPUs, reporting or lost (USD per hour).",
            cost_usd_per_hour,
        ),
        _gauge(
            "gpuwarden_fleet_lost_usd_per_hour",
            "Price of the GPUs lost or fallen off the bus: a hardware-fault cost, never "
            "waste (USD per hour).",
            lost_usd_per_hour,
        ),
    ]
