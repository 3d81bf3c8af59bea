"""Table definitions (SQLAlchemy Core); alembic migrations create them, repositories query them."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Table,
    Text,
    text,
)

from service.core.diagnosis import CAUSE_NAMES
from service.costs.integrals import INTEGRAL_FIELDS
from service.costs.waste import USAGE_FIELDS
from service.db.types import UTCDateTime
from service.vocabulary import METRICS, MetricSpec

# Per-sample figures decided at ingest (service.core.diagnosis) that rollups aggregate like metrics.
ROLLED_UP_DERIVED: tuple[str, ...] = ("activity",)

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


def _metric_type(spec: MetricSpec) -> type[Float[float]] | type[BigInteger]:
    return BigInteger if spec.kind == "int" else Float


def metric_columns() -> list[Column[object]]:
    """One nullable column per canonical metric: absent means not supported, never 0."""
    return [Column(m.name, _metric_type(m), nullable=True) for m in METRICS]


def decision_columns() -> list[Column[object]]:
    """A sample's activity (ratio), its rung and its cause, decided once at ingest; NULL when
    the sample reports no activity (nodata)."""
    return [
        Column("activity", Float, nullable=True),
        Column("activity_rung", SmallInteger, nullable=True),
        Column("cause", SmallInteger, nullable=True),
    ]


def rollup_columns() -> list[Column[object]]:
    """Per metric (and the derived activity): sum, min, max and count of the samples in the
    bucket (avg = sum / count)."""
    cols: list[Column[object]] = []
    for name in (*(m.name for m in METRICS), *ROLLED_UP_DERIVED):
        cols += [
            Column(f"{name}_sum", Float, nullable=True),
            Column(f"{name}_min", Float, nullable=True),
            Column(f"{name}_max", Float, nullable=True),
            Column(f"{name}_count", Integer, nullable=False, server_default="0"),
        ]
    return cols


def bucket_columns() -> list[Column[object]]:
    """What every rollup bucket holds: its GPU and start (the key), how many samples it
    summarises, the waste-model integrals and the per-metric aggregates."""
    return [
        Column("gpu_id", Integer, primary_key=True),
        Column("bucket_start", UTCDateTime, primary_key=True),
        Column("sample_count", Integer, nullable=False),
        *integral_columns(),
        *rollup_columns(),
    ]


def integral_columns() -> list[Column[object]]:
    """The waste-model integrals for one bucket (seconds, seconds per cause, joules)."""
    return [Column(f, Float, nullable=False, server_default="0") for f in INTEGRAL_FIELDS]


# Fields of rollup_1m that also carry a running total per GPU (``cum_<field>``): the sum of
# the field over every earlier bucket of the GPU and this one. A cost report then reads any
# range of whole minutes as the difference of two rows, instead of summing the buckets between.
CUMULATIVE_FIELDS = (
    *INTEGRAL_FIELDS,
    "tensor_active_sum",
    "tensor_active_count",
    "dram_active_sum",
    "dram_active_count",
)


def cumulative_columns() -> list[Column[object]]:
    """One running-total column per field of CUMULATIVE_FIELDS; NULL until it is computed."""
    return [Column(f"cum_{f}", Float, nullable=True) for f in CUMULATIVE_FIELDS]


nodes = Table(
    "nodes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("hostname", String(255), nullable=False, unique=True),
    Column("labels", JSON, nullable=False, default=dict),
    Column("first_seen_at", UTCDateTime, nullable=False),
    Column("last_seen_at", UTCDateTime, nullable=False),
    # The node's clock minus the central's, from the agent's send time of its last live batch
    # (migration 0027): the ladder does not act on a node whose clock is off by more than a bound.
    Column("clock_offset_seconds", Float, nullable=True),
    Column("clock_checked_at", UTCDateTime, nullable=True),
)

gpus = Table(
    "gpus",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("uuid", String(96), nullable=False, unique=True),
    Column("node_id", Integer, ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
    Column("gpu_index", Integer, nullable=False),
    Column("model", String(255), nullable=False),
    Column("fb_total_bytes", BigInteger, nullable=True),
    Column("mig_parent_uuid", String(96), nullable=True),
    Column("first_seen_at", UTCDateTime, nullable=False),
    Column("last_sample_at", UTCDateTime, nullable=True),
    # The cause of the sample at last_sample_at, moved with it: a fleet view reads no samples.
    Column("last_cause", SmallInteger, nullable=True),
    # Its earliest sample ever stored (a replayed spool moves it back), so reports know since
    # when it is held without reading samples.
    Column("first_sample_at", UTCDateTime, nullable=True),
    Column("lost_at", UTCDateTime, nullable=True),
    # A MIG instance destroyed in a reconfiguration while its parent stayed healthy.
    Column("retired_at", UTCDateTime, nullable=True),
    Column("pci_bus_id", String(32), nullable=True),
    Column("driver_version", String(64), nullable=True),
    Index(None, "node_id"),
    # A MIG instance reported by another node is found by its parent GPU on every batch.
    Index(None, "mig_parent_uuid"),
)

# One wide row per GPU per timestamp. On PostgreSQL the migration partitions it by day.
samples = Table(
    "samples",
    metadata,
    Column("gpu_id", Integer, primary_key=True),
    Column("ts", UTCDateTime, primary_key=True),
    Column("source", String(16), nullable=False),
    *metric_columns(),
    *decision_columns(),
)

rollup_1m = Table(
    "rollup_1m",
    metadata,
    *bucket_columns(),
    *cumulative_columns(),
    Index(None, "bucket_start"),
    # The buckets whose running totals are still to be computed (normally the last few).
    Index(
        "ix_rollup_1m_cum_pending",
        "gpu_id",
        "bucket_start",
        postgresql_where=text("cum_covered_seconds IS NULL"),
        sqlite_where=text("cum_covered_seconds IS NULL"),
    ),
    # The few buckets with a hardware XID (a report by job names each job's).
    Index(
        "ix_rollup_1m_xid",
        "bucket_start",
        postgresql_where=text("xid_last_max IS NOT NULL"),
        sqlite_where=text("xid_last_max IS NOT NULL"),
    ),
)

rollup_1h = Table(
    "rollup_1h",
    metadata,
    *bucket_columns(),
    Index(None, "bucket_start"),
    Index(
        "ix_rollup_1h_xid",
        "bucket_start",
        postgresql_where=text("xid_last_max IS NOT NULL"),
        sqlite_where=text("xid_last_max IS NOT NULL"),
    ),
)

# 1-minute buckets whose raw data changed since their rollup was last computed. A bucket may
# be marked more than once: with no unique key, ingest's marks never wait for a rollup that is
# deleting the same bucket's marks in its open transaction (they did, for the whole rollup).
rollup_dirty = Table(
    "rollup_dirty",
    metadata,
    Column("gpu_id", Integer, nullable=False),
    Column("bucket_start", UTCDateTime, nullable=False),
    Index(None, "gpu_id", "bucket_start"),
)

gpu_processes = Table(
    "gpu_processes",
    metadata,
    Column("gpu_id", Integer, primary_key=True),
    Column("ts", UTCDateTime, primary_key=True),
    Column("pid", Integer, primary_key=True),
    Column("fb_used_bytes", BigInteger, nullable=True),
    Column("job_id", String(255), nullable=True),
    Column("user", String(255), nullable=True),
    Column("sm_util", Float, nullable=True),  # ratio over the agent's last poll (NVML)
    Column("mem_util", Float, nullable=True),
    # The process's host side from /proc, running totals with its descendants' (migration
    # 0037, issue 47; NULL from an agent that sends none): the useful-work verdict reads them.
    Column("host_cpu_seconds", Float, nullable=True),
    Column("host_read_bytes", BigInteger, nullable=True),
    Column("host_write_bytes", BigInteger, nullable=True),
    Column("host_voluntary_switches", BigInteger, nullable=True),
    Column("host_children", Integer, nullable=True),
)

# Each job's part of a shared GPU, per minute: only minutes in which two or more jobs held the
# GPU have rows (one per job, and one under tenant "" for time no job held), so a report reads
# those minutes from here and the rest from the GPU's rollups. The job is a key of a relational
# row, never a label on a series; interval_id names the job_gpus interval the row belongs to.
tenant_1m = Table(
    "tenant_1m",
    metadata,
    Column("gpu_id", Integer, primary_key=True),
    Column("bucket_start", UTCDateTime, primary_key=True),
    Column("tenant", String(255), primary_key=True),  # the job id, "" for no job
    Column("interval_id", Integer, nullable=True),
    Column("split_rule", String(16), nullable=False),
    Column("held_seconds", Float, nullable=False, server_default="0"),
    *integral_columns(),
    Index(None, "bucket_start"),
    Index(None, "interval_id"),
)


def _tenant_sums(name: str) -> Table:
    """A table of tenant rows summed over a longer bucket: one row per GPU, bucket, job and
    split rule."""
    return Table(
        name,
        metadata,
        Column("gpu_id", Integer, primary_key=True),
        Column("bucket_start", UTCDateTime, primary_key=True),
        Column("tenant", String(255), primary_key=True),  # the job id, "" for no job
        Column("split_rule", String(16), primary_key=True),
        Column("held_seconds", Float, nullable=False, server_default="0"),
        *integral_columns(),
    )


# tenant_1m summed per hour: a report reads the whole hours of a shared stretch from here and
# only the minutes at its ends from tenant_1m. The rollup job rewrites an hour's rows whenever
# it rewrites one of its minutes.
tenant_1h = _tenant_sums("tenant_1h")
# tenant_1h summed per day (bucket_start the day's midnight, UTC), read for the whole days of
# a report; rewritten with its hours.
tenant_1d = _tenant_sums("tenant_1d")

# Which minutes of each GPU-hour have tenant rows (bit m for minute m of the hour), so a report
# finds the shared stretches of a GPU from one row per hour.
shared_1h = Table(
    "shared_1h",
    metadata,
    Column("gpu_id", Integer, primary_key=True),
    Column("bucket_start", UTCDateTime, primary_key=True),  # the hour
    Column("minute_mask", BigInteger, nullable=False),
)

# A report Summary's figures, as the day sums store them: seconds, USD (at the prices in
# force when written; ``<cause>_usd`` per cause in Cause order), then the Usage integrals.
COST_SUM_FIELDS: tuple[str, ...] = (
    "held_seconds", "nodata_seconds", "lost_seconds", "unpriced_seconds", "cost_usd",
    "nodata_usd", "lost_usd", *(f"{name}_usd" for name in CAUSE_NAMES), *USAGE_FIELDS,
)  # fmt: skip


def _cost_sums() -> list[Column[object]]:
    """One column per field of COST_SUM_FIELDS."""
    return [Column(f, Float, nullable=False, server_default="0") for f in COST_SUM_FIELDS]


# Per GPU and UTC day (``day`` its midnight): the figures of every second of the day, a job's
# or not, written by the cost-days job under ``basis`` (the price table and settings it was
# priced with); [held_from, held_until) the part of the day the GPU was held. A row's presence
# with the current basis, and no overlapping cost_day_dirty range, says the day is summed.
cost_gpu_1d = Table(
    "cost_gpu_1d",
    metadata,
    Column("gpu_id", Integer, primary_key=True),
    Column("day", UTCDateTime, primary_key=True),
    Column("basis", String(64), nullable=False),
    Column("held_from", UTCDateTime, nullable=True),
    Column("held_until", UTCDateTime, nullable=True),
    Column("written_at", UTCDateTime, nullable=False),
    *_cost_sums(),
    Index("ix_cost_gpu_1d_gpu_day", "gpu_id", "day"),
)
# Per (job, GPU, day) the same figures: one row per job that held the GPU that day, and one
# with job_id "" for its time no job held. Owners (user, team) are joined when read.
cost_job_1d = Table(
    "cost_job_1d",
    metadata,
    Column("day", UTCDateTime, primary_key=True),
    Column("gpu_id", Integer, primary_key=True),
    Column("job_id", String(255), primary_key=True),
    *_cost_sums(),
    # A report page reads its few jobs' rows, not the window's.
    Index("ix_cost_job_1d_job_day", "job_id", "day"),
)
# Per (job, day) its cost_job_1d rows summed over its GPUs, with those GPUs' ids ("3,17,42"),
# written with them: reports grouped by job, user or team read these (a month of a 10,000-GPU
# fleet is about 90,000 rows here against 615,000 there). job_id "" is the time no job held.
cost_job_day_1d = Table(
    "cost_job_day_1d",
    metadata,
    Column("day", UTCDateTime, primary_key=True),
    Column("job_id", String(255), primary_key=True),
    Column("gpu_ids", Text, nullable=False),
    *_cost_sums(),
    Index("ix_cost_job_day_1d_job_day", "job_id", "day"),
)
# Ranges [lo, hi) of one GPU (NULL: unbounded) whose summed days are stale: written by
# triggers (job_gpus, jobs.ended_at, gpus.lost_at/retired_at/model) and by the rollup job
# for the minutes it recomputes; the cost-days job re-writes those days and deletes the rows.
cost_day_dirty = Table(
    "cost_day_dirty",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("gpu_id", Integer, nullable=False),
    Column("lo", UTCDateTime, nullable=True),
    Column("hi", UTCDateTime, nullable=True),
)

api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(255), nullable=True),
    Column("role", String(16), nullable=False),
    Column("node", String(255), nullable=True),
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("prefix", String(16), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("last_used_at", UTCDateTime, nullable=True),
    Column("revoked_at", UTCDateTime, nullable=True),
    # A personal token a person minted in the console (migration 0034): who they are, as
    # {"user", "teams", "fleet"}; it sees what they saw when they minted it.
    Column("person", JSON, nullable=True),
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", String(255), primary_key=True),
    Column("user", String(255), nullable=True),
    Column("team", String(255), nullable=True),
    Column("project", String(255), nullable=True),
    Column("labels", JSON, nullable=False, default=dict),
    Column("source", String(16), nullable=False),  # "api" or "observed"
    Column("started_at", UTCDateTime, nullable=False),
    Column("ended_at", UTCDateTime, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    # The job's work key (0036, service.core.work_key): runs of the same work share it.
    Column("work_key", String(64), nullable=True),
    Index(None, "started_at"),
    Index(None, "user"),
    Index(None, "team"),
    Index(None, "work_key", "started_at"),
)

# A node's claim on a job that disagreed with the job's metadata (a squatted id, a hijack): refused
# and kept here for admins, who settle it (docs/security.md). ``source``: api (a POST or PATCH of
# the node's agent token) or observed (its process hints); ``claimed``: the values it sent.
job_conflicts = Table(
    "job_conflicts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(255), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("node", String(255), nullable=False),
    Column("source", String(16), nullable=False),
    Column("claimed", JSON, nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Index(None, "job_id"),
)

# Which GPU a job held and when; ended_at is null while it still holds it.
job_gpus = Table(
    "job_gpus",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(255), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("gpu_id", Integer, ForeignKey("gpus.id", ondelete="CASCADE"), nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("ended_at", UTCDateTime, nullable=True),
    Column("source", String(16), nullable=False),
    # The GPU's node when the interval was registered or observed (0029): an agent's rights to
    # the job go by it, so they stay behind when the GPU moves. Null: written outside the
    # service (no agent has rights through it).
    Column("registered_node", String(255), nullable=True),
    Index(None, "gpu_id", "started_at"),
    Index(None, "job_id"),
    Index(None, "ended_at"),
)

prices = Table(
    "prices",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("model_pattern", String(255), nullable=False),
    Column("usd_per_gpu_hour", Float, nullable=False),
    Column("effective_from", UTCDateTime, nullable=False),
    Column("note", Text, nullable=True),
)

# --- alerting (migration 0003) ---------------------------------------------------------

# Threshold policies; ``spec`` holds the validated policy document (service.thresholds.policy).
policies = Table(
    "policies",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("spec", JSON, nullable=False),
    Column("source", String(16), nullable=False),  # "file" or "api"
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)

# Notification channels; ``spec`` holds type, url and the signing secret (never shown by the API).
channels = Table(
    "channels",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("spec", JSON, nullable=False),
    Column("source", String(16), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)

# One row per alert episode of a (policy, scope key): pending -> firing -> resolved.
alerts = Table(
    "alerts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("policy", String(255), nullable=False),
    Column("scope_key", String(512), nullable=False),
    Column("severity", String(32), nullable=False),
    Column("state", String(16), nullable=False),  # pending | firing | resolved
    Column("labels", JSON, nullable=False),
    Column("value", Float, nullable=True),
    Column("threshold", Float, nullable=False),
    Column("active_since", UTCDateTime, nullable=False),
    Column("fired_at", UTCDateTime, nullable=True),
    Column("resolved_at", UTCDateTime, nullable=True),
    Column("last_eval_at", UTCDateTime, nullable=False),
    Column("last_notified_at", UTCDateTime, nullable=True),
    Column("last_resent_at", UTCDateTime, nullable=True),
    Column("stale", Integer, nullable=False, server_default="0"),
    Column("suppressed", Integer, nullable=False, server_default="0"),
    Column("silenced", Integer, nullable=False, server_default="0"),
    Column("job_id", String(255), nullable=True),
    Column("node", String(255), nullable=True),
    Column("gpu_uuid", String(96), nullable=True),
    Index(None, "policy", "scope_key", "state"),
    Index(None, "state"),
    Index(None, "active_since"),
)

# Every state change of an alert, oldest first: the alert's history.
alert_events = Table(
    "alert_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("alert_id", Integer, ForeignKey("alerts.id", ondelete="CASCADE"), nullable=False),
    Column("ts", UTCDateTime, nullable=False),
    Column("from_state", String(16), nullable=False),
    Column("to_state", String(16), nullable=False),
    Column("value", Float, nullable=True),
    Index(None, "alert_id"),
)

silences = Table(
    "silences",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("matchers", JSON, nullable=False),
    Column("starts_at", UTCDateTime, nullable=False),
    Column("ends_at", UTCDateTime, nullable=False),
    Column("comment", Text, nullable=False),
    Column("created_by", String(255), nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
)

# The durable notification queue: a row per (notification, channel), sent at least once.
outbox = Table(
    "outbox",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("delivery_id", String(64), nullable=False, unique=True),
    Column("channel", String(255), nullable=False),
    Column("alert_id", Integer, nullable=True),
    Column("payload", JSON, nullable=False),
    Column("status", String(16), nullable=False),  # pending | sent | failed
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("next_attempt_at", UTCDateTime, nullable=False),
    Column("last_error", Text, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("sent_at", UTCDateTime, nullable=True),
    Index(None, "status", "next_attempt_at"),
)

# Secrets the service makes for itself at first start (the console's session-signing key), kept
# in the database so every replica on it signs and checks alike.
service_secrets = Table(
    "service_secrets",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", String(128), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
)

# Console sessions ended by logging out (the cookie's nonce), until the cookie would expire: a
# copied cookie stops working on every replica.
ended_sessions = Table(
    "ended_sessions",
    metadata,
    Column("nonce", String(64), primary_key=True),
    Column("expires_at", UTCDateTime, nullable=False),
    Index(None, "expires_at"),
)

# A GPU seen from another node than its own moved there (hardware moved, a node renamed): one
# row per move, the GPU's history of nodes. Hostnames, not node ids, so the history outlives
# a node's row.
gpu_moves = Table(
    "gpu_moves",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("gpu_id", Integer, ForeignKey("gpus.id", ondelete="CASCADE"), nullable=False),
    Column("from_node", String(255), nullable=False),
    Column("to_node", String(255), nullable=False),
    Column("moved_at", UTCDateTime, nullable=False),
    Column("from_last_sample_at", UTCDateTime, nullable=True),
    Index(None, "gpu_id", "moved_at"),
)

# --- the warn-then-reclaim ladder (migration 0020) ------------------------------------------

# How far a policy's ladder has gone for one job in one alert episode: ``steps_done`` steps of
# the ladder are finished (never redone); ``pending_step`` is a reclaim whose intent is recorded
# and whose outcome is not yet (a restart retries it through the idempotent driver); ``state``
# is active, done (the last step finished), gone (the job ended), reset (the GPUs turned busy
# again) or exempt (recorded once, never acted on).
ladder_progress = Table(
    "ladder_progress",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("policy", String(255), nullable=False),
    Column("job_id", String(255), nullable=False),
    Column("alert_id", Integer, nullable=False),  # the alert episode the ladder runs in
    Column("episode_start", UTCDateTime, nullable=False),
    Column("state", String(16), nullable=False),
    Column("steps_done", Integer, nullable=False, server_default="0"),
    Column("pending_step", Integer, nullable=True),
    Column("last_step_at", UTCDateTime, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    # The ladder (dry_run and steps) this progress runs under: another one restarts it (0027).
    Column("ladder_digest", String(64), nullable=True),
    Index("uq_ladder_progress_episode", "policy", "job_id", "alert_id", unique=True),
    Index(None, "state"),
)

# The audit log: one row per ladder step taken or declined, with the numbers that triggered it.
# ``outcome``: would (dry run), warned, reclaimed, skipped, failed or gone; ``reason`` says why
# for skipped and failed; ``since`` is when the condition began; dollars from the money model.
ladder_actions = Table(
    "ladder_actions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime, nullable=False),
    Column("policy", String(255), nullable=False),
    Column("job_id", String(255), nullable=False),
    Column("user", String(255), nullable=True),
    Column("team", String(255), nullable=True),
    Column("alert_id", Integer, nullable=True),
    Column("step", Integer, nullable=True),  # index in the ladder's steps; NULL for a skip
    Column("action", String(32), nullable=False),  # notify_owner | reclaim
    Column("outcome", String(16), nullable=False),
    Column("reason", Text, nullable=True),
    Column("dry_run", Integer, nullable=False, server_default="0"),
    Column("driver", String(32), nullable=True),
    Column("mode", String(32), nullable=True),
    Column("detail", Text, nullable=True),
    Column("value", Float, nullable=True),
    Column("threshold", Float, nullable=True),
    Column("since", UTCDateTime, nullable=True),
    Column("waste_usd", Float, nullable=True),
    Column("idle_usd", Float, nullable=True),
    # The outbox deliveries of a warning's notice (0027): a reclaim needs one of them sent.
    Column("delivery_ids", JSON, nullable=True),
    Index(None, "at"),
    Index(None, "job_id", "at"),
    Index(None, "policy", "at"),
    Index(None, "user", "at"),
    Index(None, "outcome", "at"),
)

# The periodic reports claimed for sending: one row per (period, recipient), inserted in the
# transaction that queues the report's deliveries, so a report goes out once per period on any
# number of replicas and across restarts. ``recipient`` is "user:<name>", "team:<name>",
# "admins", or "__period__": the marker that the whole period has been claimed.
report_sends = Table(
    "report_sends",
    metadata,
    Column("period_start", UTCDateTime, nullable=False),
    Column("recipient", String(300), nullable=False),
    Column("period_end", UTCDateTime, nullable=False),
    Column("status", String(16), nullable=False),  # queued | opted_out | no_jobs | no_route
    Column("delivery_ids", JSON, nullable=False),
    Column("claimed_at", UTCDateTime, nullable=False),
    PrimaryKeyConstraint("period_start", "recipient", name="pk_report_sends"),
)

# Users and teams who asked not to get the periodic report (the admins' one cannot be).
report_opt_outs = Table(
    "report_opt_outs",
    metadata,
    Column("recipient", String(300), primary_key=True),
    Column("opted_out_at", UTCDateTime, nullable=False),
    Column("by", String(255), nullable=True),
)

# --- owners and what was sent to them (migration 0024) ----------------------------------

# The owner directory: a user, team or the admins and how to reach them. ``source``: file (the
# config file's owners section), api (an admin's PUT) or lookup (the lookup command's answer,
# cached until ``expires_at``; an answer without an address is cached too).
owners = Table(
    "owners",
    metadata,
    Column("kind", String(16), primary_key=True),  # user | team | admins
    Column("name", String(255), primary_key=True),
    Column("email", String(254), nullable=True),
    Column("slack", String(32), nullable=True),
    Column("cc_email", String(254), nullable=True),
    Column("cc_slack", String(32), nullable=True),
    Column("team", String(255), nullable=True),
    Column("source", String(16), nullable=False),
    Column("expires_at", UTCDateTime, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)

# Every message queued for a person (owner notices, reports): what, to whom, when, and whether
# it went. ``asked`` is whom it was meant for (user:alice), ``recipient`` whose address it
# used (user:alice, team:vision, admins) with ``fallback`` (team | admins) and ``reason`` when
# that differs; ``status`` follows the outbox row of ``delivery_id`` (pending | sent | failed,
# or unreachable when no address was found at all and nothing was queued).
notices = Table(
    "notices",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("delivery_id", String(64), nullable=True, unique=True),
    Column("kind", String(32), nullable=False),  # owner_notice | report | ...
    Column("subject", Text, nullable=False),
    Column("job_id", String(255), nullable=True),
    Column("policy", String(255), nullable=True),
    Column("asked", String(300), nullable=False),
    Column("recipient", String(300), nullable=True),
    Column("fallback", String(16), nullable=True),
    Column("reason", Text, nullable=True),
    Column("channel", String(255), nullable=True),
    Column("address", String(300), nullable=True),
    Column("status", String(16), nullable=False),
    Column("error", Text, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("sent_at", UTCDateTime, nullable=True),
    Index(None, "created_at"),
    Index(None, "job_id"),
    Index(None, "asked"),
)

# --- who changed the configuration (migration 0034) -------------------------------------

# One row per change of a policy, ladder, channel, silence, price table or owner entry made
# through the API: who made it (``person:alice`` signed in, or ``token:<name or prefix>``).
config_changes = Table(
    "config_changes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime, nullable=False),
    Column("actor", String(300), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("name", String(300), nullable=False),
    Column("action", String(16), nullable=False),
    Index(None, "at"),
)

# --- a job's progress counter (migration 0035, issue 46) --------------------------------

# One row per progress reading a job reported: its running total ``value`` of ``unit`` (steps,
# samples or tokens) at ``at``. A job's rows keep one unit and never go down (core/progress.py).
job_progress = Table(
    "job_progress",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(255), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Column("unit", String(16), nullable=False),
    Column("value", Float(precision=53), nullable=False),
    Index(None, "job_id", "at"),
)


# Each cause's calibration (0036): its compared pairs, median promised and realised shares, and
# the factor its promises carry (null under 20 pairs); rewritten whole by the savings round.
savings_calibration = Table(
    "savings_calibration",
    metadata,
    Column("cause", String(32), primary_key=True),
    Column("pairs", Integer, nullable=False),
    Column("median_promised", Float(precision=53), nullable=False),
    Column("median_realised", Float(precision=53), nullable=False),
    Column("factor", Float(precision=53), nullable=True),
    Column("computed_at", UTCDateTime, nullable=False),
)

# The saving of each later run against the earlier run of its work (0036), as the savings
# round last computed it: /metrics counts the booked ones, the calibration learns from them.
work_savings = Table(
    "work_savings",
    metadata,
    Column("job_id", String(255), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("compared_with", String(255), nullable=False),
    Column("team", String(255), nullable=True),
    Column("user", String(255), nullable=True),
    Column("project", String(255), nullable=True),
    Column("ended_at", UTCDateTime, nullable=False),
    Column("fix_cause", String(32), nullable=True),
    Column("verdict", String(32), nullable=False),
    Column("booked", Boolean, nullable=False),
    Column("promised_fraction", Float(precision=53), nullable=True),
    Column("realised_fraction", Float(precision=53), nullable=True),
    Column("promised_usd", Float(precision=53), nullable=True),
    Column("realised_usd", Float(precision=53), nullable=True),
    Column("computed_at", UTCDateTime, nullable=False),
    Index(None, "ended_at"),
)
