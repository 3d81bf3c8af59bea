"""Base schema: nodes, GPUs, samples (partitioned by day on PostgreSQL), rollups, tokens, jobs.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.db.types import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# The metric columns as they stood at this revision; later metrics arrive in later migrations.
METRICS_0001: tuple[tuple[str, str], ...] = (
    ("sm_active", "float"),
    ("sm_occupancy", "float"),
    ("tensor_active", "float"),
    ("dram_active", "float"),
    ("gr_engine_active", "float"),
    ("gpu_util", "float"),
    ("mem_copy_util", "float"),
    ("fb_used_bytes", "int"),
    ("fb_total_bytes", "int"),
    ("power_watts", "float"),
    ("energy_joules", "float"),
    ("temperature_celsius", "float"),
    ("sm_clock_hz", "float"),
    ("pcie_tx_bytes_per_second", "float"),
    ("pcie_rx_bytes_per_second", "float"),
    ("nvlink_tx_bytes_per_second", "float"),
    ("nvlink_rx_bytes_per_second", "float"),
    ("xid_last", "int"),
)


def _type(kind: str) -> type[sa.types.TypeEngine[object]]:
    return sa.BigInteger if kind == "int" else sa.Float


def _rollup_table(name: str) -> None:
    cols: list[sa.Column[object]] = [
        sa.Column("gpu_id", sa.Integer, nullable=False),
        sa.Column("bucket_start", UTCDateTime, nullable=False),
        sa.Column("sample_count", sa.Integer, nullable=False),
    ]
    for integral in (
        "covered_seconds",
        "idle_seconds",
        "idle_held_seconds",
        "unused_seconds",
        "fallback_seconds",
        "energy_used_joules",
    ):
        cols.append(sa.Column(integral, sa.Float, nullable=False, server_default="0"))
    for metric, _kind in METRICS_0001:
        cols += [
            sa.Column(f"{metric}_sum", sa.Float, nullable=True),
            sa.Column(f"{metric}_min", sa.Float, nullable=True),
            sa.Column(f"{metric}_max", sa.Float, nullable=True),
            sa.Column(f"{metric}_count", sa.Integer, nullable=False, server_default="0"),
        ]
    op.create_table(
        name, *cols, sa.PrimaryKeyConstraint("gpu_id", "bucket_start", name=f"pk_{name}")
    )


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("labels", sa.JSON, nullable=False),
        sa.Column("first_seen_at", UTCDateTime, nullable=False),
        sa.Column("last_seen_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_nodes"),
        sa.UniqueConstraint("hostname", name="uq_nodes_hostname"),
    )
    op.create_table(
        "gpus",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("uuid", sa.String(96), nullable=False),
        sa.Column("node_id", sa.Integer, nullable=False),
        sa.Column("gpu_index", sa.Integer, nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("fb_total_bytes", sa.BigInteger, nullable=True),
        sa.Column("mig_parent_uuid", sa.String(96), nullable=True),
        sa.Column("first_seen_at", UTCDateTime, nullable=False),
        sa.Column("last_sample_at", UTCDateTime, nullable=True),
        sa.Column("lost_at", UTCDateTime, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_gpus"),
        sa.UniqueConstraint("uuid", name="uq_gpus_uuid"),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name="fk_gpus_node_id_nodes", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_gpus_node_id", "gpus", ["node_id"])

    sample_cols = [sa.Column(m, _type(k), nullable=True) for m, k in METRICS_0001]
    op.create_table(
        "samples",
        sa.Column("gpu_id", sa.Integer, nullable=False),
        sa.Column("ts", UTCDateTime, nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        *sample_cols,
        sa.PrimaryKeyConstraint("gpu_id", "ts", name="pk_samples"),
        # Day partitions are created by service.db.partitions as data arrives; retention
        # then drops whole partitions instead of deleting rows.
        postgresql_partition_by="RANGE (ts)",
    )
    _rollup_table("rollup_1m")
    _rollup_table("rollup_1h")
    op.create_table(
        "rollup_dirty",
        sa.Column("gpu_id", sa.Integer, nullable=False),
        sa.Column("bucket_start", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("gpu_id", "bucket_start", name="pk_rollup_dirty"),
    )
    op.create_table(
        "gpu_processes",
        sa.Column("gpu_id", sa.Integer, nullable=False),
        sa.Column("ts", UTCDateTime, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("fb_used_bytes", sa.BigInteger, nullable=True),
        sa.Column("job_id", sa.String(255), nullable=True),
        sa.Column("user", sa.String(255), nullable=True),
        sa.PrimaryKeyConstraint("gpu_id", "ts", "pid", name="pk_gpu_processes"),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(255), nullable=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("node", sa.String(255), nullable=True),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("last_used_at", UTCDateTime, nullable=True),
        sa.Column("revoked_at", UTCDateTime, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
        sa.UniqueConstraint("token_hash", name="uq_api_tokens_token_hash"),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(255), nullable=False),
        sa.Column("user", sa.String(255), nullable=True),
        sa.Column("team", sa.String(255), nullable=True),
        sa.Column("project", sa.String(255), nullable=True),
        sa.Column("labels", sa.JSON, nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("started_at", UTCDateTime, nullable=False),
        sa.Column("ended_at", UTCDateTime, nullable=True),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
    )
    op.create_index("ix_jobs_started_at", "jobs", ["started_at"])
    op.create_table(
        "job_gpus",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(255), nullable=False),
        sa.Column("gpu_id", sa.Integer, nullable=False),
        sa.Column("started_at", UTCDateTime, nullable=False),
        sa.Column("ended_at", UTCDateTime, nullable=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_job_gpus"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_gpus_job_id_jobs", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["gpu_id"], ["gpus.id"], name="fk_job_gpus_gpu_id_gpus", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_job_gpus_gpu_id_started_at", "job_gpus", ["gpu_id", "started_at"])
    op.create_index("ix_job_gpus_job_id", "job_gpus", ["job_id"])
    op.create_table(
        "prices",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("model_pattern", sa.String(255), nullable=False),
        sa.Column("usd_per_gpu_hour", sa.Float, nullable=False),
        sa.Column("effective_from", UTCDateTime, nullable=False),
        sa.Column("note", sa.Text, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_prices"),
    )


def downgrade() -> None:
    for table in (
        "prices",
        "job_gpus",
        "jobs",
        "api_tokens",
        "gpu_processes",
        "rollup_dirty",
        "rollup_1h",
        "rollup_1m",
        "samples",
        "gpus",
        "nodes",
    ):
        op.drop_table(table)
