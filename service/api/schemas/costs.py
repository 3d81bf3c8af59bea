"""Request and response models of jobs, prices and cost reports."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from service.api.schemas.derive import mirror
from service.api.schemas.progress import ProgressSummaryPublic
from service.api.schemas.savings import SavingPublic
from service.api.schemas.times import StoredTime
from service.core.job_ids import job_id_problem
from service.costs.recommend import Recommendation
from service.wire import MAX_NODE_LABELS, LabelKey, LabelValue, Name

# Where a report's prices came from (service.usecases.price_table.PriceSource).
PriceSourcePublic = Literal["api", "config", "default", "opencost", "none"]


class CauseFiguresPublic(BaseModel):
    """Covered seconds of one cause, their cost and the waste in it (USD, null when unpriced):
    all of it for idle_empty and idle_held, usd x the fix's saving fraction for an inefficient
    cause, 0 for compute_tensor and unclassified."""

    seconds: float
    usd: float | None
    waste_usd: float | None


@mirror(Recommendation)
class RecommendationPublic(BaseModel):
    """A fix: what to do, the GPU-seconds and USD it acts on, what it saves and the assumption
    behind the saving. ``kind`` is ``cause`` (the fix of one cause), ``fewer_gpus`` or ``mig``
    (a smaller allocation), or ``pool`` (idle time no job held: the pool's capacity to release
    or shrink); no two fixes of a job claim the same second's dollars. ``saving_fraction`` is a
    share of what ``base`` names."""


class EnergyPublic(BaseModel):
    """A job's energy: kWh, its cost at ``usd_per_kwh``, the part burned while nothing ran
    (idle_empty + idle_held), and kWh per cause; ``source`` says whether the GPUs' energy
    counters scaled the power integral (``energy_counter``) or not (``power``)."""

    kwh: float
    usd: float
    idle_kwh: float
    idle_usd: float
    usd_per_kwh: float
    source: Literal["energy_counter", "power", "mixed", "none"]
    by_cause_kwh: dict[str, float]


class JobFaultPublic(BaseModel):
    """A hardware fault of one of the job's GPUs while the job held it: a hardware XID
    (``kind`` xid, ``xid`` its code, ``at`` its first sample) or the GPU fell off the bus
    (``kind`` lost, ``at`` its last sample, ``lost_at`` when it was reported lost, and the
    seconds and USD of the job's hold on it from then; null when unpriced)."""

    gpu_uuid: str
    node: str
    gpu_index: int
    kind: Literal["xid", "lost"]
    xid: int | None
    at: datetime
    lost_at: datetime | None = None
    lost_seconds: float | None = None
    lost_usd: float | None = None


class CostRowPublic(BaseModel):
    """The money model's fields for one group (seconds, joules, USD; USD null when any held
    second is unpriced), with seconds and USD per cause: cost_usd = the causes' usd +
    nodata_usd + lost_usd; waste_usd = idle_usd + fixable_usd (docs/costs.md)."""

    # Field order is the CSV's column order (the per-cause columns go last).
    key: str
    user: str | None = None
    team: str | None = None
    project: str | None = None
    gpus: int
    jobs: int
    held_seconds: float = Field(description="every second the group held its GPUs")
    allocated_seconds: float = Field(description="the held seconds samples cover")
    nodata_seconds: float = Field(description="held seconds no sample covers (GPU not lost)")
    lost_seconds: float = Field(
        0.0, description="held seconds of a GPU fallen off the bus (from lost_at), unsampled"
    )
    idle_seconds: float
    idle_held_seconds: float
    unused_seconds: float
    fallback_seconds: float
    energy_used_joules: float
    energy_kwh: float = Field(0.0, description="energy_used_joules in kWh")
    energy_usd: float = Field(0.0, description="energy_kwh at the energy_usd_per_kwh setting (USD)")
    efficiency: float | None = Field(
        description="mean activity over the covered time (an activity figure, not dollars)"
    )
    cost_usd: float | None = Field(description="price x every held second")
    waste_usd: float | None = Field(
        description="idle_usd + fixable_usd: the sum of the cause fixes' savings"
    )
    idle_usd: float | None = Field(description="idle_empty + idle_held dollars (certain)")
    fixable_usd: float | None = Field(
        description="each inefficient cause's dollars x its fix's saving fraction (estimated)"
    )
    nodata_usd: float | None = Field(description="held time no sample covers; never waste")
    lost_usd: float | None = Field(
        description="held time of a GPU fallen off the bus: a hardware-fault cost, never waste"
    )
    unpriced_seconds: float
    held_gpu_hours: float = Field(0.0, description="held_seconds / 3600: what cost_usd prices")
    waste_gpu_hours: float = Field(
        0.0,
        description="idle_gpu_hours + fixable_gpu_hours: waste_usd's model in GPU-hours, "
        "priced or not",
    )
    idle_gpu_hours: float = Field(0.0, description="idle_empty + idle_held time in GPU-hours")
    fixable_gpu_hours: float = Field(
        0.0, description="each inefficient cause's GPU-hours x its fix's saving fraction"
    )
    top_cause: str | None = Field(
        None, description="the waste cause whose fix saves the most, null if none"
    )
    causes: dict[str, CauseFiguresPublic] = Field(
        default_factory=dict,
        description="seconds, USD and waste USD per cause (idle_empty, idle_held, "
        "launch_bound, ...); the seconds add up to allocated_seconds",
    )
    fixes: list[RecommendationPublic] = Field(
        default_factory=list, description="the top fixes by USD saved, one per waste cause"
    )
    faults: list[JobFaultPublic] | None = Field(
        None,
        description="grouped by job: the hardware faults of the job's GPUs in the window "
        "(XIDs, GPUs off the bus); an XID older than two hours is timed to its hour",
    )


class CostReportRowPublic(CostRowPublic):
    """A cost report's row with the proven savings of its jobs (docs/savings.md): realised and
    promised USD of the fixes applied by its later runs that ended in the report's window, as
    the savings round stored them; null for hardware groupings."""

    realised_usd: float | None = Field(
        None, description="realised savings of the group's later runs (USD, to the cent)"
    )
    promised_usd: float | None = Field(
        None, description="what the same fixes promised (USD, to the cent)"
    )


class CostReportPublic(BaseModel):
    """A cost report: rows largest ``sort`` dollars first (waste by default), the page
    [offset, offset + limit) of them, totals of every row (not only the page), and warnings."""

    start: datetime
    end: datetime
    group_by: str
    sort: Literal["waste", "cost", "idle", "fixable"] = "waste"
    rows: list[CostReportRowPublic]
    row_count: int = Field(description="rows the report has, before offset and limit")
    offset: int = 0
    limit: int | None = None
    totals: CostReportRowPublic
    price_source: PriceSourcePublic = Field(
        description="where prices came from: api (PUT /api/v1/prices), config, default (the "
        "shipped list prices), opencost (a running OpenCost) or none (no prices: GPU-hours)"
    )
    unit: Literal["usd", "gpu_hours"] = Field(
        "usd",
        description="the report's headline unit: gpu_hours where no prices are configured "
        "(price_source none; every *_usd is null), else usd with *_gpu_hours beside it",
    )
    split_rule: Literal["equal", "memory", "activity"] = Field(
        "equal",
        description="how the time and cost of a GPU shared by several jobs is split between "
        "them (docs/costs.md#shared-gpus)",
    )
    warnings: list[str]


def _job_id(value: str) -> str:
    """``value`` unchanged; a ValueError (for pydantic) if it may not name a job."""
    problem = job_id_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


# A job id reaches mail subjects, log lines and the scheduler's command line: no control
# characters, and slurm: and k8s: ids in the one spelling the scheduler acts on.
JobId = Annotated[str, Field(min_length=1, max_length=255), AfterValidator(_job_id)]


class JobCreate(BaseModel):
    """``POST /jobs``: register a job (or fill in an observed one) with the GPUs it holds."""

    model_config = ConfigDict(extra="forbid")

    id: JobId = Field(
        description="slurm:<id as squeue prints it>, k8s:<namespace>/<pod> (DNS-1123 names), "
        "or any other prefix; never a control character"
    )
    user: Name | None = Field(None, max_length=255)
    team: Name | None = Field(None, max_length=255)
    project: Name | None = Field(None, max_length=255)
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=MAX_NODE_LABELS)
    gpus: list[str] = Field(default_factory=list, max_length=1024)
    started_at: StoredTime
    ended_at: StoredTime | None = None
    exclusive: bool = Field(
        False,
        strict=True,  # true or false, never 0 or "yes"
        description="the job holds these GPUs alone (not shared by design, as Slurm shards "
        "are): any other job of the same scheduler (the id's prefix, e.g. slurm:) still open "
        "on them since before started_at missed its end and is ended at started_at",
    )

    @model_validator(mode="after")
    def _end_after_start(self) -> JobCreate:
        if self.ended_at is not None and self.ended_at < self.started_at:
            raise ValueError("ended_at must not be before started_at")
        return self


class JobUpdate(BaseModel):
    """``PATCH /jobs/{id}``: change metadata or end the job (``ended_at``)."""

    model_config = ConfigDict(extra="forbid")

    user: Name | None = Field(None, max_length=255)
    team: Name | None = Field(None, max_length=255)
    project: Name | None = Field(None, max_length=255)
    labels: dict[LabelKey, LabelValue] | None = Field(None, max_length=MAX_NODE_LABELS)
    ended_at: StoredTime | None = None


class JobGpuPublic(BaseModel):
    """One interval during which the job held a GPU (``ended_at`` null while it still does)."""

    gpu_uuid: str
    node: str = Field(description="the GPU's node now")
    registered_node: str | None = Field(
        description="the node that registered (or observed) the interval, whose agent token has"
        " rights over the job; null where unknown"
    )
    started_at: datetime
    ended_at: datetime | None
    source: str


class PerGpuPublic(CostRowPublic):
    """A job's summary on one GPU."""

    gpu_uuid: str


class JobConflictPublic(BaseModel):
    """A node's claim on the job that disagreed with it: refused, kept for an admin to settle."""

    node: str
    source: Literal["api", "observed"]
    claimed: dict[str, Any]
    at: datetime


class JobFieldsPublic(BaseModel):
    """What a job is: its id, owner, labels, where it came from and when it ran."""

    id: str
    user: str | None
    team: str | None
    project: str | None
    labels: dict[str, str]
    source: str
    started_at: datetime
    ended_at: datetime | None


class JobPublic(JobFieldsPublic):
    """A job with its GPU intervals."""

    created_at: datetime
    updated_at: datetime
    gpus: list[JobGpuPublic]
    conflicts: list[JobConflictPublic] = Field(
        default_factory=list,
        description="claims of other nodes that disagreed with this job (a squatted or "
        "hijacked id): refused; an admin settles them (docs/security.md)",
    )


class JobRecommendationPublic(RecommendationPublic):
    """A job's fix with its cause's calibration: how that cause's promises came out on the
    runs that applied them (docs/savings.md)."""

    calibration_factor: float | None = Field(
        None,
        description="median realised / median promised share of this cause's fixes, from 20 "
        "compared pairs on; null before",
    )
    calibrated_saving_usd: float | None = Field(
        None, description="saving_usd times the factor (never more than the USD it acts on)"
    )


class OddGpuPublic(BaseModel):
    """A GPU of a multi-GPU job whose activity departs from its peers' (a straggler, or a
    dead rank whose peers spin in a collective) over the last useful-work hold time."""

    gpu_uuid: str
    mean_duty: float = Field(description="the GPU's mean duty cycle over that time (0 to 1)")
    peers_duty: float = Field(description="the median of the other GPUs' mean duty cycles")


class JobDetailPublic(JobPublic):
    """A job with its money summary over its lifetime (cost, waste, seconds and USD per
    cause, top cause), per GPU, recommendations and energy."""

    summary: CostRowPublic
    per_gpu: list[PerGpuPublic]
    energy: EnergyPublic | None = None
    recommendations: list[JobRecommendationPublic] = Field(
        default_factory=list,
        description="every fix with its saving, largest first: one per waste cause and fewer "
        "GPUs (their savings add up to summary.waste_usd), and a MIG slice where the job fits "
        "one (its saving is on the time the other fixes leave, beyond the waste)",
    )
    savings_usd: float | None = Field(
        None,
        description="what all the recommendations save together (USD): summary.waste_usd, "
        "plus a MIG slice's saving when one is offered",
    )
    faults: list[JobFaultPublic] = Field(
        default_factory=list,
        description="hardware faults of its GPUs while it held them (XIDs, GPUs off the bus)",
    )
    warnings: list[str]
    progress: ProgressSummaryPublic | None = Field(
        None,
        description="the job's reported progress (POST /jobs/{id}/progress): first and last "
        "total, units advanced, rate; null where it reported none",
    )
    unit_of_work: Literal["step", "sample", "token", "run"] = Field(
        "run",
        description="what the job's GPU time is counted per: a unit of its progress, or the "
        "whole run (a fixed-size job) where it reported none",
    )
    gpu_seconds_per_unit: float | None = Field(
        None,
        description="held GPU-seconds per unit of progress (summary.held_seconds / "
        "progress.units_advanced); null where the unit is the whole run",
    )
    unit_of_work_text: str = Field("", description="the unit of work and its figure in words")
    odd_gpus: list[OddGpuPublic] = Field(
        default_factory=list,
        description="of a job on three or more GPUs, each GPU whose mean duty cycle over the "
        "last useful-work hold time (ending now, or at the job's end) is 0.3 or more from the "
        "median of its peers' (a straggler or a dead rank); empty otherwise",
    )
    savings: SavingPublic | None = Field(
        None,
        description="what this run saved against the earlier run of its work that was told a "
        "fix (docs/savings.md); null where there is none",
    )


class JobListItemPublic(JobFieldsPublic):
    """A job in a listing, with its money figures over the listed window (CostRowPublic's)."""

    cost_usd: float | None
    waste_usd: float | None
    idle_usd: float | None
    fixable_usd: float | None
    lost_usd: float | None
    efficiency: float | None
    held_gpu_hours: float = 0.0
    waste_gpu_hours: float = 0.0
    top_cause: str | None = None


class PriceIn(BaseModel):
    """One row of ``PUT /prices``: USD per GPU-hour for models matching a shell-style pattern."""

    model_config = ConfigDict(extra="forbid")

    model_pattern: str = Field(min_length=1, max_length=255)
    usd_per_gpu_hour: float = Field(ge=0, allow_inf_nan=False)
    effective_from: StoredTime
    note: str | None = Field(None, max_length=1000)


class PricePublic(BaseModel):
    """A price row and where the table in force came from (api, config or default)."""

    model_pattern: str
    usd_per_gpu_hour: float
    effective_from: datetime
    note: str | None
    source: PriceSourcePublic
