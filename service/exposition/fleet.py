"""Metric families of the fleet (per-GPU gauges and fleet figures) from the latest readings.

Pure: takes the GPUs' latest readings, the price table, the thresholds and ``now``; returns
prometheus_client metric families. It reads no database and no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

from prometheus_client.core import GaugeMetricFamily, Metric

from service.core.diagnosis import (
    CAUSE_NAMES,
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
from service.costs.money import waste_share
from service.costs.prices import price_at
from service.costs.recommend import FixAssumptions
from service.exposition.dcgm import dcgm_families
from service.exposition.families import GpuFamily
from service.exposition.types import FleetGpu, FleetSnapshot
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
JOB_INFO_LABELS: tuple[str, ...] = ("node", "gpu_uuid", "job_id", "user", "team", "project")
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
    label_sets: list[dict[str, str]] = []

    def gpu_family(name: str, doc: str, typ: str = "gauge") -> GpuFamily:
        return GpuFamily(name, doc, typ, label_sets)

    per_metric = [
        (
            spec.name,
            gpu_family(
                exported_name(spec),
                f"{spec.help} ({spec.unit}), from the GPU's latest sample.",
                "counter" if spec.counter else "gauge",
            ),
        )
        for spec in METRICS
    ]
    fb_total_rows = next(f for name, f in per_metric if name == "fb_total_bytes").rows
    last_ts = gpu_family(
        "gpuwarden_gpu_last_sample_timestamp_seconds",
        "Unix time of the GPU's latest sample (seconds).",
    )
    age_fam = gpu_family(
        "gpuwarden_gpu_sample_age_seconds",
        "Age of the GPU's latest sample at this scrape (seconds); past max_gap the GPU's data is "
        "late (ingest behind, a slow node) and its series stay until metrics_keep_late_seconds.",
    )
    price_fam = gpu_family(
        "gpuwarden_gpu_price_usd_per_hour",
        "Price of the GPU from the price table (USD per GPU-hour).",
    )
    waste_fam = gpu_family(
        "gpuwarden_gpu_waste_usd_per_hour",
        "Waste now: the price x the waste share of the latest sample's cause (all of it when "
        "idle, the fix's saving fraction when inefficient, none when healthy) (USD per hour).",
    )
    idle_fam = gpu_family(
        "gpuwarden_gpu_idle",
        "1 when nothing runs on the GPU now (idle_empty or idle_held), else 0 (boolean).",
    )
    # Activity and cause carry one more label each (the rung, the cause): own label sets.
    activity_sets: list[dict[str, str]] = []
    activity_fam = GpuFamily(
        "gpuwarden_gpu_activity_ratio",
        "Activity from the latest sample: sm_active, else gr_engine_active, else gpu_util; "
        "the rung label says which (ratio).",
        "gauge",
        activity_sets,
    )
    cause_sets: list[dict[str, str]] = []
    cause_fam = GpuFamily(
        "gpuwarden_gpu_cause",
        "Always 1; the cause label says why the GPU's latest sample went the way it did.",
        "gauge",
        cause_sets,
    )
    by_cause = dict.fromkeys(CAUSE_NAMES, 0)
    by_state = dict.fromkeys(STATE_NAMES, 0)
    by_state[GpuState.LOST] = len(snapshot.lost)
    usd_by_cause = dict.fromkeys(CAUSE_NAMES, 0.0)
    info_sets: list[dict[str, str]] = []
    info_fam = GpuFamily(
        "gpuwarden_gpu_info",
        "Always 1; labels say where the GPU's activity figures come from (gpm, dcgm, nvml).",
        "gauge",
        info_sets,
    )

    job_sets: list[dict[str, str]] = []
    job_info_fam = GpuFamily(
        "gpuwarden_gpu_job_info",
        "Always 1; labels say which job (job_id, user, team, project) holds the GPU now, "
        "job_id empty while none does. Join it to the per-GPU families on gpu_uuid.",
        "gauge",
        job_sets,
    )

    price_cache: dict[str, float | None] = {}
    n_idle = n_idle_held = n_unpriced = 0
    waste_usd_per_hour = cost_usd_per_hour = 0.0
    slots = [(name, fam.rows) for name, fam in per_metric]
    for r in snapshot.readings:
        mine = node_exported.get(r.node)
        if mine is None:
            mine = node_exported[r.node] = exported is None or exported(r.node)
        i = len(label_sets) if mine else -1
        if mine:
            _gpu_rows(r, i, label_sets, job_sets, info_sets, slots, fb_total_rows)
            job_info_fam.rows.append((i, 1.0))
            last_ts.rows.append((i, r.last_sample_at.timestamp()))
            age_fam.rows.append((i, max(0.0, (now - r.last_sample_at).total_seconds())))
            info_fam.rows.append((i, 1.0))

        if r.model not in price_cache:
            row = price_at(snapshot.prices, r.model, now)
            price_cache[r.model] = None if row is None else row.usd_per_gpu_hour
        price = price_cache[r.model]
        if price is None:
            n_unpriced += 1
        else:
            if mine:
                price_fam.rows.append((i, price))
            cost_usd_per_hour += price

        d = decision_of(r, thresholds)
        # The readings are the GPUs reporting now, so only their cause decides the state.
        state = gpu_state(cause=None if d is None else d.cause, lost=False, age_seconds=0.0)
        by_state[state] += 1
        if d is None:
            continue  # no activity figure: no data is never idle and never waste
        idle = d.cause in IDLE_CAUSES
        if mine:
            labels = label_sets[i]
            activity_sets.append({**labels, "rung": d.rung.label})
            activity_fam.rows.append((len(activity_sets) - 1, d.activity))
            cause_sets.append({**labels, "cause": d.cause.label})
            cause_fam.rows.append((len(cause_sets) - 1, 1.0))
            idle_fam.rows.append((i, 1.0 if idle else 0.0))
        by_cause[d.cause.label] += 1
        if idle:
            n_idle += 1
            if d.cause is Cause.IDLE_HELD:
                n_idle_held += 1
        if price is not None:
            usd_by_cause[d.cause.label] += price
            waste = price * waste_share(d.cause, assumptions)
            if mine:
                waste_fam.rows.append((i, waste))
            waste_usd_per_hour += waste

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

    families: list[Metric] = [fam for _, fam in per_metric]
    families += [last_ts, age_fam, price_fam, waste_fam, idle_fam, activity_fam, cause_fam]
    families += [info_fam, job_info_fam, lost_fam]
    if fleet_wide:
        families += _fleet_families(
            snapshot,
            by_cause=by_cause,
            usd_by_cause=usd_by_cause,
            by_state=by_state,
            idle=n_idle,
            idle_held=n_idle_held,
            unpriced=n_unpriced,
            waste_usd_per_hour=waste_usd_per_hour,
            cost_usd_per_hour=cost_usd_per_hour + lost_usd_per_hour,
            lost_usd_per_hour=lost_usd_per_hour,
        )
    if dcgm_compat:
        readings = snapshot.readings
        if exported is not None:
            readings = [r for r in readings if node_exported[r.node]]
        families += dcgm_families(readings)
    return families


def _gpu_rows(
    r: FleetGpu,
    i: int,
    label_sets: list[dict[str, str]],
    job_sets: list[dict[str, str]],
    info_sets: list[dict[str, str]],
    slots: list[tuple[str, list[tuple[int, float]]]],
    fb_total_rows: list[tuple[int, float]],
) -> None:
    """Append reading ``r`` as the GPU at row ``i``: its label sets and its metrics' values."""
    label_sets.append(
        {"node": r.node, "gpu_index": str(r.index), "gpu_uuid": r.uuid, "model": r.model}
    )
    job_sets.append(
        {
            "node": r.node,
            "gpu_uuid": r.uuid,
            "job_id": r.job_id or "",
            "user": r.user or "",
            "team": r.team or "",
            "project": r.project or "",
        }
    )
    values = r.values
    for name, rows in slots:
        v = values.get(name)
        if v is not None:
            rows.append((i, v))
    if "fb_total_bytes" not in values and r.fb_total_bytes is not None:
        fb_total_rows.append((i, r.fb_total_bytes))
    info_sets.append(dict(zip(INFO_LABELS, info_values(r), strict=True)))


def _fleet_families(
    snapshot: FleetSnapshot,
    *,
    by_cause: dict[str, int],
    usd_by_cause: dict[str, float],
    by_state: dict[str, int],
    idle: int,
    idle_held: int,
    unpriced: int,
    waste_usd_per_hour: float,
    cost_usd_per_hour: float,
    lost_usd_per_hour: float,
) -> list[Metric]:
    """The fleet-wide families: GPUs by cause and state, and the fleet's figures."""
    cause_count = GaugeMetricFamily(
        "gpuwarden_fleet_gpus_by_cause",
        "Reporting GPUs whose latest sample has each cause (GPUs).",
        labels=["cause"],
    )
    cause_usd = GaugeMetricFamily(
        "gpuwarden_fleet_cause_usd_per_hour",
        "Price of the priced GPUs whose latest sample has each cause: what each cause costs "
        "per hour now (USD per hour).",
        labels=["cause"],
    )
    for name, n in by_cause.items():
        cause_count.add_metric([name], n)
        cause_usd.add_metric([name], usd_by_cause[name])
    state_count = GaugeMetricFamily(
        "gpuwarden_fleet_gpus_by_state",
        "GPUs in each state (working, underused, idle-held, idle, lost, no-data, unclassified), "
        "from the cause of each reporting GPU's latest sample; lost GPUs as lost (GPUs).",
        labels=["state"],
    )
    for name, n in by_state.items():
        state_count.add_metric([name], n)
    families: list[Metric] = [cause_count, cause_usd, state_count]
    families += _fleet_figures(
        reporting=len(snapshot.readings),
        idle=idle,
        idle_held=idle_held,
        lost=len(snapshot.lost),
        unpriced=unpriced,
        waste_usd_per_hour=waste_usd_per_hour,
        cost_usd_per_hour=cost_usd_per_hour,
        lost_usd_per_hour=lost_usd_per_hour,
    )
    return families


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
