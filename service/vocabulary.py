"""The canonical metric vocabulary, declared once as data.

Storage columns, ingest validation, series queries and exporters are all generated
from ``METRICS``; adding a metric here is the only change a new field needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal
from urllib.parse import quote


class ActivitySource(StrEnum):
    """Where a sample's activity figures (sm_active and friends) came from."""

    GPM = "gpm"  # NVML GPM profiling counters (Hopper and newer)
    DCGM = "dcgm"  # DCGM profiling fields, read from dcgm-exporter
    NVML = "nvml"  # the coarse NVML duty cycle only (gpu_util); sm_active is absent
    SIMULATED = "simulated"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One canonical metric: its name, unit, valid range and storage type."""

    name: str
    unit: str
    help: str
    minimum: float = 0.0
    maximum: float | None = None  # every metric has one (what hardware can report)
    kind: Literal["float", "int"] = "float"
    counter: bool = False


# What hardware can report, so no stored value is beyond it (ingest refuses more with a 422, the
# agent drops it as implausible, and every later sum of a day's samples stays finite). Generous:
# each is several times the largest part shipping today.
POWER_MAX_WATTS = 5000.0  # a GB200 superchip board draws 2.7 kW
FB_MAX_BYTES = 2**42  # 4 TiB of frame buffer; a B300 has 288 GB
# PCIe 6.0 x16 moves 128 GB/s each way and NVLink 5 1.8 TB/s in all per GPU: 10 TB/s is past any.
LINK_MAX_BYTES_PER_SECOND = 1e13
# A board at the power bound for 100 years since its driver loaded.
ENERGY_MAX_JOULES = POWER_MAX_WATTS * 100 * 365.25 * 86400
# NVML reports XIDs, remapped rows and PCIe replays as unsigned 32-bit numbers.
COUNT_MAX = float(2**32 - 1)
# A label key (a node's, a job's) as Kubernetes allows its name part: the wire refuses longer.
MAX_LABEL_KEY_CHARS = 63
# ECC and NVLink error counts are 64-bit in NVML; a JSON number stays exact up to 2^53.
LINK_COUNT_MAX = float(2**53)

METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "sm_active", "ratio", "Fraction of time at least one warp was active on an SM", maximum=1.0
    ),
    MetricSpec(
        "sm_occupancy", "ratio", "Resident warps as a fraction of the SM maximum", maximum=1.0
    ),
    MetricSpec(
        "tensor_active", "ratio", "Fraction of time any tensor pipe was active", maximum=1.0
    ),
    MetricSpec(
        "dram_active",
        "ratio",
        "Fraction of time device memory was being read or written",
        maximum=1.0,
    ),
    MetricSpec(
        "gr_engine_active",
        "ratio",
        "Fraction of time the graphics/compute engine was busy",
        maximum=1.0,
    ),
    MetricSpec(
        "gpu_util", "ratio", "NVML duty cycle: fraction of time any kernel ran", maximum=1.0
    ),
    MetricSpec(
        "mem_copy_util",
        "ratio",
        "NVML fraction of time memory was being read or written",
        maximum=1.0,
    ),
    # Video engines: NVML's duty cycle and the SM figures count kernels only, so a GPU that
    # only decodes or encodes reads 0 there; these keep it from being called idle.
    MetricSpec(
        "enc_util", "ratio", "Fraction of time the video encoder (NVENC) was busy", maximum=1.0
    ),
    MetricSpec(
        "dec_util", "ratio", "Fraction of time the video decoder (NVDEC) was busy", maximum=1.0
    ),
    MetricSpec(
        "fb_used_bytes", "bytes", "Frame buffer memory in use", maximum=FB_MAX_BYTES, kind="int"
    ),
    MetricSpec(
        "fb_total_bytes", "bytes", "Frame buffer memory in total", maximum=FB_MAX_BYTES, kind="int"
    ),
    # Free as the driver reports it: total less used less what the driver reserves for itself.
    MetricSpec(
        "fb_free_bytes", "bytes", "Frame buffer memory free", maximum=FB_MAX_BYTES, kind="int"
    ),
    MetricSpec("power_watts", "watts", "Board power draw", maximum=POWER_MAX_WATTS),
    MetricSpec(
        "energy_joules",
        "joules",
        "Energy used since the driver loaded",
        maximum=ENERGY_MAX_JOULES,
        counter=True,
    ),
    MetricSpec("temperature_celsius", "celsius", "GPU core temperature", -50.0, 200.0),
    MetricSpec("sm_clock_hz", "hertz", "SM clock frequency", maximum=1e10),
    *(
        MetricSpec(name, "bytes_per_second", text, maximum=LINK_MAX_BYTES_PER_SECOND)
        for name, text in (
            ("pcie_tx_bytes_per_second", "PCIe transmit throughput"),
            ("pcie_rx_bytes_per_second", "PCIe receive throughput"),
            ("nvlink_tx_bytes_per_second", "NVLink transmit throughput"),
            ("nvlink_rx_bytes_per_second", "NVLink receive throughput"),
        )
    ),
    MetricSpec(
        "xid_last",
        "code",
        "Most recent XID error code seen in the interval",
        maximum=COUNT_MAX,
        kind="int",
    ),
    # GPU health. A row-remap failure is a state; remapped rows and PCIe replays are counters
    # since the driver loaded, so a fault is their rise within a window, never their level.
    MetricSpec(
        "row_remap_failure",
        "state",
        "1 when the GPU could not remap a memory row (it needs service), else 0",
        maximum=1.0,
        kind="int",
    ),
    MetricSpec(
        "remapped_rows_uncorrectable",
        "rows",
        "Memory rows remapped after uncorrectable errors since the driver loaded",
        maximum=COUNT_MAX,
        kind="int",
        counter=True,
    ),
    MetricSpec(
        "pcie_replays",
        "replays",
        "PCIe replays (link-level retries) since the driver loaded",
        maximum=COUNT_MAX,
        kind="int",
        counter=True,
    ),
    # The rest of DCGM's health watches (memory, NVLink) and the clocks' state, read every few
    # polls with the counters above (the clocks every poll).
    MetricSpec(
        "ecc_dbe_errors",
        "errors",
        "Double-bit (uncorrectable) ECC errors since the driver loaded",
        maximum=LINK_COUNT_MAX,
        kind="int",
        counter=True,
    ),
    MetricSpec(
        "retired_pages_dbe",
        "pages",
        "Memory pages retired after double-bit ECC errors (before Ampere; later GPUs remap rows)",
        maximum=COUNT_MAX,
        kind="int",
        counter=True,
    ),
    MetricSpec(
        "retired_pages_pending",
        "pages",
        "Memory pages waiting to be retired at the next GPU reset (NVML says 1 when any wait)",
        maximum=COUNT_MAX,
        kind="int",
    ),
    MetricSpec(
        "nvlink_crc_errors",
        "errors",
        "NVLink flow-control (flit) CRC errors over all links since the driver loaded",
        maximum=LINK_COUNT_MAX,
        kind="int",
        counter=True,
    ),
    MetricSpec(
        "nvlink_replay_errors",
        "replays",
        "NVLink replays (link-level retries) over all links since the driver loaded",
        maximum=LINK_COUNT_MAX,
        kind="int",
        counter=True,
    ),
    MetricSpec(
        "nvlink_recovery_errors",
        "errors",
        "NVLink recoveries (a link went down and came back) over all links since the driver loaded",
        maximum=LINK_COUNT_MAX,
        kind="int",
        counter=True,
    ),
    MetricSpec(
        "clocks_event_reasons",
        "bitmask",
        "Why the clocks are below their maximum now (NVML clocks event reasons, CLOCK_EVENT_BITS)",
        maximum=COUNT_MAX,
        kind="int",
    ),
)

# NVML's clocks event (formerly throttle) reasons: bit -> name, and whether it means the
# hardware itself is holding the clocks down (a slowdown the job did not ask for and cannot fix).
CLOCK_EVENT_BITS: dict[int, tuple[str, bool]] = {
    0x1: ("gpu_idle", False),
    0x2: ("applications_clocks_setting", False),
    0x4: ("sw_power_cap", False),
    0x8: ("hw_slowdown", True),
    0x10: ("sync_boost", False),
    0x20: ("sw_thermal_slowdown", False),
    0x40: ("hw_thermal_slowdown", True),
    0x80: ("hw_power_brake_slowdown", True),
    0x100: ("display_clock_setting", False),
}
HW_SLOWDOWN_MASK = sum(bit for bit, (_, hw) in CLOCK_EVENT_BITS.items() if hw)


def clock_event_names(reasons: float | None) -> list[str]:
    """The names of the clocks event reasons set in NVML's bitmask ``reasons`` (none if None)."""
    if reasons is None:
        return []
    mask = int(reasons)
    return [name for bit, (name, _) in CLOCK_EVENT_BITS.items() if mask & bit]


def hw_slowdown(reasons: float | None) -> bool:
    """Whether NVML's clocks event bitmask says the hardware is holding the clocks down."""
    return reasons is not None and bool(int(reasons) & HW_SLOWDOWN_MASK)


# XID codes that mean the hardware (or its firmware) failed, after NVIDIA's XID catalogue: they
# page as hardware faults. Everything else - 13 (graphics engine exception), 31 (GPU memory page
# fault), 43 (GPU stopped processing), 45 (preemptive cleanup), 68 (video decoder exception) and
# the rest - is almost always the application's own error (an illegal address, a killed kernel),
# is shown as ``xid_last`` and never pages.
HARDWARE_XID_MEANINGS: dict[int, str] = {
    48: "double-bit ECC error",
    54: "auxiliary power not connected",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
HARDWARE_XIDS: frozenset[int] = frozenset(HARDWARE_XID_MEANINGS)
# The health metrics whose value above 0 is a fault (the GPU needs a reset or service) ...
FAULT_STATES: tuple[str, ...] = ("row_remap_failure", "retired_pages_pending")
# ... and the counters whose rise within a window is one (their level counts since the driver
# loaded, or for ever). NVLink CRC errors and replays are left out: the link corrects them, and
# DCGM's health watch too pages only past a rate; a recovery is a link that went down.
FAULT_COUNTERS: tuple[str, ...] = (
    "remapped_rows_uncorrectable",
    "pcie_replays",
    "ecc_dbe_errors",
    "retired_pages_dbe",
    "nvlink_recovery_errors",
)
FAULT_METRICS: tuple[str, ...] = ("xid_last", *FAULT_STATES, *FAULT_COUNTERS)


METRICS_BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}


# (lowest, highest) value each metric may take, and the derived activity ratio stored beside
# them: the one table both ingest checks (central's 422, the agent's drop) and every read that
# sets an impossible stored row aside are derived from.
def _bounds(spec: MetricSpec) -> tuple[float, float]:
    if spec.maximum is None:
        raise ValueError(f"metric {spec.name} needs a maximum: what hardware can report")
    return spec.minimum, spec.maximum


METRIC_BOUNDS: dict[str, tuple[float, float]] = {
    **{m.name: _bounds(m) for m in METRICS},
    "activity": (0.0, 1.0),
}
METRIC_NAMES: tuple[str, ...] = tuple(m.name for m in METRICS)
INT_METRICS: frozenset[str] = frozenset(m.name for m in METRICS if m.kind == "int")

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class DcgmField:
    """A dcgm-exporter field: its name, the canonical metric it carries, the factor from its
    unit to the canonical one (dcgm value x ``scale`` = canonical value) and its help text."""

    name: str
    metric: str
    scale: float
    help: str

    @property
    def prom_type(self) -> str:
        """The Prometheus type dcgm-exporter gives the field: a counter for counter metrics."""
        return "counter" if METRICS_BY_NAME[self.metric].counter else "gauge"


# The one DCGM table: the dcgm-exporter backend scrapes by it and the compat exposition writes
# by it (with the inverse scale). Units as dcgm-exporter's default-counters.csv and
# dcp-metrics-included.csv state them.
DCGM_FIELDS: tuple[DcgmField, ...] = (
    DcgmField("DCGM_FI_DEV_GPU_UTIL", "gpu_util", 0.01, "GPU utilization (in %)."),
    DcgmField("DCGM_FI_DEV_MEM_COPY_UTIL", "mem_copy_util", 0.01, "Memory utilization (in %)."),
    DcgmField("DCGM_FI_DEV_ENC_UTIL", "enc_util", 0.01, "Encoder utilization (in %)."),
    DcgmField("DCGM_FI_DEV_DEC_UTIL", "dec_util", 0.01, "Decoder utilization (in %)."),
    DcgmField("DCGM_FI_DEV_FB_USED", "fb_used_bytes", MIB, "Framebuffer memory used (in MiB)."),
    DcgmField("DCGM_FI_DEV_FB_FREE", "fb_free_bytes", MIB, "Framebuffer memory free (in MiB)."),
    DcgmField("DCGM_FI_DEV_POWER_USAGE", "power_watts", 1.0, "Power draw (in W)."),
    DcgmField(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "energy_joules",
        0.001,
        "Total energy consumption since boot (in mJ).",
    ),
    DcgmField("DCGM_FI_DEV_GPU_TEMP", "temperature_celsius", 1.0, "GPU temperature (in C)."),
    DcgmField("DCGM_FI_DEV_SM_CLOCK", "sm_clock_hz", 1e6, "SM clock frequency (in MHz)."),
    DcgmField(
        "DCGM_FI_DEV_XID_ERRORS", "xid_last", 1.0, "Value of the last XID error encountered."
    ),
    DcgmField(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "row_remap_failure",
        1.0,
        "Whether remapping of rows has failed",
    ),
    DcgmField(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "remapped_rows_uncorrectable",
        1.0,
        "Number of remapped rows for uncorrectable errors",
    ),
    DcgmField(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "pcie_replays", 1.0, "Total number of PCIe retries."
    ),
    DcgmField(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "ecc_dbe_errors",
        1.0,
        "Total number of double-bit volatile ECC errors.",
    ),
    DcgmField(
        "DCGM_FI_DEV_RETIRED_DBE",
        "retired_pages_dbe",
        1.0,
        "Total number of retired pages due to double-bit errors.",
    ),
    DcgmField(
        "DCGM_FI_DEV_RETIRED_PENDING",
        "retired_pages_pending",
        1.0,
        "Total number of pages pending retirement.",
    ),
    DcgmField(
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "nvlink_crc_errors",
        1.0,
        "Total number of NVLink flow-control CRC errors.",
    ),
    DcgmField(
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "nvlink_replay_errors",
        1.0,
        "Total number of NVLink retries.",
    ),
    DcgmField(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "nvlink_recovery_errors",
        1.0,
        "Total number of NVLink recovery errors.",
    ),
    DcgmField(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "clocks_event_reasons",
        1.0,
        "Current clock event reasons (bitmask).",
    ),
    DcgmField(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gr_engine_active",
        1.0,
        "Ratio of time the graphics engine is active.",
    ),
    DcgmField(
        "DCGM_FI_PROF_SM_ACTIVE",
        "sm_active",
        1.0,
        "The ratio of cycles an SM has at least 1 warp assigned.",
    ),
    DcgmField(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "sm_occupancy",
        1.0,
        "The ratio of number of warps resident on an SM.",
    ),
    DcgmField(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "tensor_active",
        1.0,
        "Ratio of cycles the tensor (HMMA) pipe is active.",
    ),
    DcgmField(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "dram_active",
        1.0,
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    DcgmField(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "pcie_tx_bytes_per_second",
        1.0,
        "The rate of data transmitted over the PCIe bus, in bytes per second.",
    ),
    DcgmField(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "pcie_rx_bytes_per_second",
        1.0,
        "The rate of data received over the PCIe bus, in bytes per second.",
    ),
    DcgmField(
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "nvlink_tx_bytes_per_second",
        1.0,
        "The rate of data transmitted over NVLink, in bytes per second.",
    ),
    DcgmField(
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "nvlink_rx_bytes_per_second",
        1.0,
        "The rate of data received over NVLink, in bytes per second.",
    ),
)


# Earlier names of a field that exporters still write: DCGM 3.3 renamed the throttle reasons.
DCGM_FIELD_ALIASES: dict[str, str] = {
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
}


# The labels of an alert wherever it leaves the service (Prometheus rules, Alertmanager, webhook
# bodies, Slack); on /metrics the per-GPU series carry the GPU's, gpuwarden_gpu_job_info the
# job's, joined by the rules. Never "job": Prometheus owns that label on every scraped series.
ALERT_LABELS: tuple[str, ...] = (
    "job_id",
    "gpu_uuid",
    "gpu_index",
    "node",
    "user",
    "team",
    "project",
    "model",
    "policy",
    "severity",
    "cause",
)
# The labels that say where an alert is (a policy's match and a silence may name these too).
WHERE_LABELS: tuple[str, ...] = ALERT_LABELS[:8]
# The label that names a scope key: the GPU of a gpu-scoped alert, the job of a job-scoped one.
SCOPE_LABEL: dict[str, str] = {"gpu": "gpu_uuid", "node": "node", "job": "job_id"}
# Earlier names still accepted in policy matchers and silences, read as the names above.
LABEL_ALIASES: dict[str, str] = {"job": "job_id", "gpu": "gpu_uuid", "uuid": "gpu_uuid"}


def canonical_labels(labels: dict[str, str]) -> dict[str, str]:
    """``labels`` with earlier names (``job``, ``gpu``, ``uuid``) read as their canonical ones."""
    return {LABEL_ALIASES.get(k, k): v for k, v in labels.items()}


def job_path(job_id: str) -> str:
    """The path of job ``job_id`` under the console (``/jobs/...``) and the API (``/api/v1``).

    The id is one percent-encoded segment: Kubernetes ids hold ``/`` and any id may hold ``?``,
    ``#``, ``%``, ``|`` or spaces, which a raw id would turn into another path, a query or a
    fragment (and ``|`` ends a Slack link).
    """
    return "/jobs/" + quote(job_id, safe="")


def alert_page_path(alert_id: int) -> str:
    """The console's alerts page, scrolled to alert ``alert_id`` (its row's element id)."""
    return f"/alerts#alert-{alert_id}"


# How a job became known, in words for people (job pages, `gpuwarden job`): ``source`` is "api"
# (registered: a Slurm prolog, the Kubernetes attribution, a POST /api/v1/jobs) or "observed"
# (found from the processes the agents saw on its GPUs). console.js holds the same texts.
# What a ladder step came to, as the audit log stores it: would (dry run), warned, reclaimed,
# skipped (and why), failed (and why), gone (the job had ended), held (due, but its evidence
# did not suffice: stale or missing samples, a moved GPU, a node's clock, no delivered warning,
# the scheduler unreachable; tried again every round, recorded when the reason changes).
ACTION_OUTCOMES: tuple[str, ...] = (
    "would", "warned", "reclaimed", "skipped", "failed", "gone", "held",
)  # fmt: skip
# Of those, the ones that complete a step (a failed step is tried again; skipped and gone end
# the episode without completing one).
STEP_DONE_OUTCOMES: frozenset[str] = frozenset({"would", "warned", "reclaimed"})

JOB_SOURCE_TEXT: dict[str, str] = {
    "api": "registered by its scheduler or the API",
    "observed": "found from its processes on the GPUs",
}


OWNER_KINDS = ("user", "team")  # whose console page and periodic report there is


def owner_page_path(kind: str, name: str) -> str:
    """The console page of a user or team (``/users/...``, ``/teams/...``), the name one
    percent-encoded segment as in ``job_path``."""
    return f"/{kind}s/{quote(name, safe='')}"


# What a job's progress counter counts (issue 46): its monotonic running total is in one of these.
ProgressUnit = Literal["steps", "samples", "tokens"]
PROGRESS_UNITS: tuple[ProgressUnit, ...] = ("steps", "samples", "tokens")
