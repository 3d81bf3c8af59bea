"""Response models of the GPU endpoints."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from service.core.diagnosis import GpuState


class GpuPublic(BaseModel):
    """A GPU as the API shows it, with the values of its latest sample."""

    uuid: str
    index: int
    model: str
    node: str
    node_labels: dict[str, str]
    fb_total_bytes: int | None
    mig_parent_uuid: str | None
    first_seen_at: datetime
    last_seen_at: datetime | None
    lost: bool
    retired_at: datetime | None = None  # a MIG instance destroyed in a reconfiguration
    source: str | None
    latest: dict[str, float | int]
    activity: float | None = None  # of the latest sample: sm_active, else gr_engine, else util
    activity_rung: str | None = None  # which metric the activity came from
    cause: str | None = None  # of the latest sample (idle_empty, idle_held, compute_tensor, ...)
    # The causes this GPU's metrics can tell apart (a GPU with only NVML's duty cycle gets
    # idle_empty, idle_held and otherwise unclassified).
    supported_causes: list[str] = []
    # The latest sample reports activity but not memory use (dcgm-exporter without the FB
    # fields): idle-held or idle was then told by whether a job or a process holds the GPU.
    memory_unknown: bool = False
    # Why the clocks are below their maximum in the latest sample (NVML's clocks event reasons:
    # gpu_idle, sw_power_cap, hw_thermal_slowdown, ...), and whether one of them is the
    # hardware's own (hw_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown).
    clock_event_reasons: list[str] = []
    hw_slowdown: bool = False
    # What the GPU does now, from its latest cause (diagnosis.STATE_OF_CAUSE): working,
    # underused, idle-held, idle, lost, no-data (no sample for 2 minutes), unclassified, sham
    # (a keep-alive loop) or hung (resident work that stopped advancing).
    state: GpuState = GpuState.NO_DATA
    job: str | None = None  # the job holding the GPU now
    user: str | None = None
    team: str | None = None


class FleetGpuPublic(GpuPublic):
    """A GPU with the money figures of its time since midnight UTC (USD, null if unpriced):
    cost_usd = every held second, waste_usd = idle_usd + fixable_usd, lost_usd the time
    after it fell off the bus (docs/costs.md)."""

    cost_usd: float | None = None
    waste_usd: float | None = None
    idle_usd: float | None = None
    fixable_usd: float | None = None
    lost_usd: float | None = None
    held_gpu_hours: float | None = Field(None, description="held time since midnight, GPU-hours")
    waste_gpu_hours: float | None = Field(
        None, description="waste (idle + fixable) since midnight in GPU-hours, priced or not"
    )


class FleetChoicesPublic(BaseModel):
    """What the whole fleet can be filtered by: its nodes, models and the teams holding a GPU
    now or today."""

    node: list[str]
    model: list[str]
    team: list[str]


class FleetPublic(BaseModel):
    """The fleet now: the GPUs the filters let through (every GPU without), largest ``sort``
    dollars of today first (waste by default), counted per state and summed since ``start``;
    ``gpus`` the page [offset, offset + limit) of them in full; the price source."""

    start: datetime  # midnight UTC: "today" as the service's clock has it
    now: datetime
    # The dollars' end: now, or (fleets summing today so far) where today's sums end.
    dollars_until: datetime
    sort: Literal["waste", "cost", "idle", "fixable"] = "waste"
    gpu_count: int  # GPUs the filters let through; the page holds at most limit of them
    fleet_gpu_count: int  # every GPU, filters or not
    offset: int
    limit: int | None
    state_counts: dict[GpuState, int]  # of the GPUs the filters let through
    gpus: list[FleetGpuPublic]
    choices: FleetChoicesPublic
    # Null only where no prices are configured (price_source none): see the GPU-hours.
    cost_usd: float | None
    waste_usd: float | None
    idle_usd: float | None
    fixable_usd: float | None
    nodata_usd: float | None
    lost_usd: float | None
    held_gpu_hours: float = 0.0
    waste_gpu_hours: float = 0.0
    price_source: Literal["api", "config", "default", "opencost", "none"]
    warnings: list[str]


class SeriesPointPublic(BaseModel):
    """One step of a series; ``ts`` is the start of the step."""

    ts: datetime
    avg: float
    min: float
    max: float
    count: int


class SeriesPublic(BaseModel):
    """A metric of one GPU over time, with the resolution it was read from."""

    gpu_uuid: str
    metric: str
    unit: str
    start: datetime
    end: datetime
    step_seconds: float
    resolution: Literal["raw", "1m", "1h"]
    points: list[SeriesPointPublic]


class SeriesLinePublic(BaseModel):
    """One metric of one GPU within a batch of series."""

    gpu_uuid: str
    node: str | None = Field(None, description="the GPU's node (as the job recorded it)")
    metric: str
    unit: str
    points: list[SeriesPointPublic]


class SeriesBatchPublic(BaseModel):
    """Several metrics of several GPUs (a job's, or those named) over one window and step."""

    job: str | None = Field(None, description="the job whose GPUs these are, when one was named")
    start: datetime
    end: datetime
    step_seconds: float
    resolution: Literal["raw", "1m", "1h"]
    series: list[SeriesLinePublic] = Field(
        description="one per GPU and metric, GPUs in the order asked (a job's by start), "
        "metrics in the order asked"
    )


class GpuMovePublic(BaseModel):
    """A GPU seen from another node than its own moved there (hardware moved, node renamed)."""

    from_node: str
    to_node: str
    moved_at: datetime
    from_last_sample_at: datetime | None = Field(
        None, description="the old node's last sample of the GPU before the move"
    )
