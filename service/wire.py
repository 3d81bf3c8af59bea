"""The agent-to-central wire format of ``POST /api/v1/ingest``, generated from the vocabulary.

Both sides use these models: the agent builds and serialises them, the central service
validates incoming bodies with them, so the contract lives in exactly one place.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, create_model

from service.vocabulary import FB_MAX_BYTES, MAX_LABEL_KEY_CHARS, METRICS, ActivitySource

# Limits of one batch: central refuses more, and the agent splits its batches to fit.
MAX_BATCH_SAMPLES = 10_000
MAX_BATCH_PROCESSES = 10_000
MAX_NODE_LABELS = 64
MAX_LABEL_VALUE_CHARS = 256
MAX_BATCH_GPUS = 4096

# The stores keep integers in 64-bit columns (PIDs and GPU indexes in 32-bit ones): refuse what
# would overflow them, rather than fail inside the database.
MAX_INT64 = 2**63 - 1
MAX_INT32 = 2**31 - 1


def _no_nul(value: str) -> str:
    # PostgreSQL text cannot hold NUL; refusing it here names the field on both stores.
    if "\x00" in value:
        raise ValueError("must not contain a NUL character")
    return value


# C0 and C1 control characters, DEL, and the Unicode line and paragraph separators: each can
# end a mail header or a log line, or split a command's argument. Here, not in service.core,
# because the agent (which may import only the wire) drops such hints before it ships them.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def control_problem(value: str) -> str | None:
    """Why ``value`` may not be stored as a name or id (a control character), or None."""
    found = _CONTROL.search(value)
    if found is None:
        return None
    return f"must not contain control characters (found U+{ord(found.group()):04X})"


def no_control(value: str) -> str:
    """``value`` unchanged; a ValueError (for pydantic) if it holds a control character."""
    problem = control_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


Text = Annotated[str, AfterValidator(_no_nul)]
# Text that can reach a mail header, a log line or a command's argument (a job id, a user, a
# label): no control character at all, CR and LF above all (they would end a header line).
Name = Annotated[str, AfterValidator(no_control)]
LabelKey = Annotated[Name, Field(min_length=1, max_length=MAX_LABEL_KEY_CHARS)]
LabelValue = Annotated[Name, Field(max_length=MAX_LABEL_VALUE_CHARS)]


def _metric_field(spec: Any) -> tuple[Any, Any]:
    # Strict: a number is a JSON number; "0.5", true and 1.0 for an integer are refused by name.
    if spec.kind == "int":
        top = MAX_INT64 if spec.maximum is None else min(spec.maximum, MAX_INT64)
        return (
            int | None,
            Field(None, ge=spec.minimum, le=top, strict=True, description=spec.help),
        )
    return (
        float | None,
        Field(None, ge=spec.minimum, le=spec.maximum, strict=True, description=spec.help),
    )


# Unknown names are rejected (extra="forbid"), so a typo never silently drops a metric.
Metrics: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "Metrics",
    __config__=ConfigDict(extra="forbid", allow_inf_nan=False),
    **{m.name: _metric_field(m) for m in METRICS},
)


class NodeIn(BaseModel):
    """The node a batch comes from."""

    model_config = ConfigDict(extra="forbid")

    hostname: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=MAX_NODE_LABELS)


class GpuIn(BaseModel):
    """A GPU (or MIG instance) on the node, as the agent sees it now."""

    model_config = ConfigDict(extra="forbid")

    uuid: Text = Field(min_length=1, max_length=96)
    index: int = Field(ge=0, le=MAX_INT32, strict=True)
    model: Text = Field(min_length=1, max_length=255)
    fb_total_bytes: int | None = Field(None, ge=0, le=FB_MAX_BYTES, strict=True)
    mig_parent_uuid: Text | None = Field(None, max_length=96)
    # NVML says the GPU is lost or has fallen off the bus (strict: true or false, never 0 or 1).
    lost: bool = Field(False, strict=True)
    # A MIG instance destroyed while its parent is healthy (a reconfiguration): never lost.
    retired: bool = Field(False, strict=True)
    pci_bus_id: Text | None = Field(None, max_length=32)
    driver_version: Text | None = Field(None, max_length=64)


class SampleIn(BaseModel):
    """One GPU's metrics at one instant."""

    model_config = ConfigDict(extra="forbid")

    gpu_uuid: Text = Field(min_length=1, max_length=96)
    ts: AwareDatetime
    source: ActivitySource | None = None  # where sm_active and friends came from
    metrics: Metrics


class ProcessIn(BaseModel):
    """A process seen on a GPU, with the job the agent attributed it to."""

    model_config = ConfigDict(extra="forbid")

    gpu_uuid: Text = Field(min_length=1, max_length=96)
    ts: AwareDatetime
    pid: int = Field(ge=0, le=MAX_INT32, strict=True)
    fb_used_bytes: int | None = Field(None, ge=0, le=FB_MAX_BYTES, strict=True)
    job_id: Name | None = Field(None, max_length=255)
    user: Name | None = Field(None, max_length=255)
    # NVML's per-process samples over the agent's last poll: the share of time this process's
    # kernels ran on the SMs, and its memory-controller share (ratios; absent if not reported).
    sm_util: float | None = Field(None, ge=0, le=1, strict=True)
    mem_util: float | None = Field(None, ge=0, le=1, strict=True)
    # The process's host side from /proc (issue 47; running totals with its descendants'):
    # optional, so older agents and agents that cannot read /proc are accepted unchanged.
    host_cpu_seconds: float | None = Field(None, ge=0, le=1e12)
    host_read_bytes: int | None = Field(None, ge=0, le=2**62, strict=True)
    host_write_bytes: int | None = Field(None, ge=0, le=2**62, strict=True)
    host_voluntary_switches: int | None = Field(None, ge=0, le=2**62, strict=True)
    host_children: int | None = Field(None, ge=0, le=MAX_INT32, strict=True)


class IngestBatch(BaseModel):
    """One batch from one node: its GPUs, their samples and their processes."""

    model_config = ConfigDict(extra="forbid")

    node: NodeIn
    gpus: list[GpuIn] = Field(default_factory=list, max_length=MAX_BATCH_GPUS)
    samples: list[SampleIn] = Field(default_factory=list, max_length=MAX_BATCH_SAMPLES)
    processes: list[ProcessIn] = Field(default_factory=list, max_length=MAX_BATCH_PROCESSES)


class GpuClaim(BaseModel):
    """A GPU of the batch that another node owned: moved to this node, or left out of it."""

    gpu_uuid: str
    from_node: str
    moved: bool  # True: it is this node's now; False: its items were left out of the batch
    reason: str


class IngestResult(BaseModel):
    """What the central service did with a batch."""

    samples_received: int  # distinct (GPU, ts) in the batch: a repeat inside it counts once
    samples_stored: int = 0  # of those, how many were new (0 when the batch is sent again)
    processes_received: int  # distinct (GPU, ts, pid) in the batch
    gpus: int
    gpu_claims: list[GpuClaim] = Field(default_factory=list)
