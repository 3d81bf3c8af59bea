"""The readings the fleet families are built from, as the database hands them to the pure code."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from service.costs.prices import PriceRow


@dataclass(frozen=True, slots=True)
class FleetGpu:
    """A GPU that reported recently: who it is, who holds it, and its latest sample's values."""

    node: str
    index: int
    uuid: str
    model: str
    last_sample_at: datetime
    values: dict[str, float]  # canonical metric name -> value; absent metrics are not there
    source: str = ""
    fb_total_bytes: int | None = None  # from the GPU's inventory, when the sample lacks it
    mig_parent_uuid: str | None = None
    pci_bus_id: str | None = None
    driver_version: str | None = None
    job_id: str | None = None
    user: str | None = None
    team: str | None = None
    project: str | None = None
    # The decision stored with the sample at ingest (service.core.diagnosis); None when the
    # sample has none (no activity figure), or when it was not read from storage.
    activity: float | None = None
    rung: int | None = None
    cause: int | None = None


@dataclass(frozen=True, slots=True)
class LostGpu:
    """A GPU its (still reporting) node says is lost or has fallen off the bus."""

    node: str
    index: int
    uuid: str
    model: str
    job_id: str | None = None  # the job that still holds it, if any
    user: str | None = None
    team: str | None = None
    project: str | None = None


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """Everything the families are built from, as read at one instant."""

    readings: Sequence[FleetGpu]
    lost: Sequence[LostGpu] = ()
    prices: Sequence[PriceRow] = field(default_factory=tuple)
