"""Cost day sums: each (job, GPU, UTC day)'s and each (GPU, day)'s seconds, integrals and
dollars (cost_job_1d, cost_gpu_1d), and the changes that make a summed day stale
(cost_day_dirty, fed by triggers on job_gpus, jobs and gpus and by the rollup job).

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.db.types import UTCDateTime

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

# The summed fields as they are at this revision (spelled out: a migration is frozen): a
# report Summary's seconds and dollars, then its Usage.
_CAUSES = (
    "idle_empty", "idle_held", "launch_bound", "input_starved", "transfer_bound",
    "memory_bound", "compute_no_tensor", "compute_tensor", "unclassified",
)  # fmt: skip
_SUMS = (
    "held_seconds", "nodata_seconds", "lost_seconds", "unpriced_seconds", "cost_usd",
    "nodata_usd", "lost_usd", *(f"{c}_usd" for c in _CAUSES),
    "covered_seconds", "idle_seconds", "idle_held_seconds", "unused_seconds", "fallback_seconds",
    "energy_used_joules", "idle_empty_seconds", "launch_bound_seconds", "input_starved_seconds",
    "transfer_bound_seconds", "memory_bound_seconds", "compute_no_tensor_seconds",
    "compute_tensor_seconds", "unclassified_seconds", "idle_empty_energy_joules",
    "idle_held_energy_joules", "launch_bound_energy_joules", "input_starved_energy_joules",
    "transfer_bound_energy_joules", "memory_bound_energy_joules",
    "compute_no_tensor_energy_joules", "compute_tensor_energy_joules",
    "unclassified_energy_joules", "input_starved_duty_seconds", "launch_bound_duty_seconds",
    "compute_no_tensor_active_seconds", "memory_bound_dram_seconds", "transfer_bound_pcie_bytes",
    "tensor_active_sum", "tensor_active_count", "dram_active_sum", "dram_active_count",
)  # fmt: skip

# What makes a summed day stale, as a range [lo, hi) of one GPU (NULL: unbounded). An interval
# written, moved or removed; a job's end changing its open intervals; a GPU lost, returned,
# retired or re-modelled.
_SQLITE_TRIGGERS = (
    "CREATE TRIGGER cost_days_job_gpus_ins AFTER INSERT ON job_gpus BEGIN "
    "INSERT INTO cost_day_dirty (gpu_id, lo, hi) VALUES (NEW.gpu_id, NEW.started_at, "
    "NEW.ended_at); END",
    "CREATE TRIGGER cost_days_job_gpus_del AFTER DELETE ON job_gpus BEGIN "
    "INSERT INTO cost_day_dirty (gpu_id, lo, hi) VALUES (OLD.gpu_id, OLD.started_at, "
    "OLD.ended_at); END",
    "CREATE TRIGGER cost_days_job_gpus_upd AFTER UPDATE OF gpu_id, started_at, ended_at, job_id "
    "ON job_gpus WHEN OLD.gpu_id IS NOT NEW.gpu_id OR OLD.started_at IS NOT NEW.started_at "
    "  OR OLD.ended_at IS NOT NEW.ended_at OR OLD.job_id IS NOT NEW.job_id BEGIN "
    "INSERT INTO cost_day_dirty (gpu_id, lo, hi) VALUES (OLD.gpu_id, CASE "
    "  WHEN OLD.gpu_id <> NEW.gpu_id OR OLD.started_at <> NEW.started_at "
    "    OR OLD.job_id <> NEW.job_id THEN MIN(OLD.started_at, NEW.started_at) "
    "  WHEN OLD.ended_at IS NULL THEN NEW.ended_at WHEN NEW.ended_at IS NULL THEN OLD.ended_at "
    "  ELSE MIN(OLD.ended_at, NEW.ended_at) END, NULL); "
    "INSERT INTO cost_day_dirty (gpu_id, lo, hi) SELECT NEW.gpu_id, NEW.started_at, NULL "
    "  WHERE OLD.gpu_id <> NEW.gpu_id; END",
    "CREATE TRIGGER cost_days_jobs_end AFTER UPDATE OF ended_at ON jobs "
    "WHEN OLD.ended_at IS NOT NEW.ended_at BEGIN "
    "INSERT INTO cost_day_dirty (gpu_id, lo, hi) SELECT gpu_id, CASE "
    "  WHEN OLD.ended_at IS NULL THEN NEW.ended_at WHEN NEW.ended_at IS NULL THEN OLD.ended_at "
    "  ELSE MIN(OLD.ended_at, NEW.ended_at) END, NULL "
    "  FROM job_gpus WHERE job_id = NEW.id AND ended_at IS NULL; END",
    "CREATE TRIGGER cost_days_gpus AFTER UPDATE OF lost_at, retired_at, model, first_seen_at "
    "ON gpus WHEN OLD.lost_at IS NOT NEW.lost_at OR OLD.retired_at IS NOT NEW.retired_at "
    "  OR OLD.model IS NOT NEW.model OR OLD.first_seen_at IS NOT NEW.first_seen_at BEGIN "
    "INSERT INTO cost_day_dirty (gpu_id, lo, hi) VALUES (NEW.id, CASE "
    "  WHEN OLD.model IS NOT NEW.model OR OLD.first_seen_at IS NOT NEW.first_seen_at THEN NULL "
    "  ELSE (SELECT MIN(t) FROM (SELECT OLD.lost_at AS t UNION ALL SELECT NEW.lost_at "
    "    UNION ALL SELECT OLD.retired_at UNION ALL SELECT NEW.retired_at)) END, NULL); END",
)
_PG_FUNCTIONS = """
CREATE FUNCTION cost_days_job_gpus() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO cost_day_dirty (gpu_id, lo, hi) VALUES (NEW.gpu_id, NEW.started_at, NEW.ended_at);
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO cost_day_dirty (gpu_id, lo, hi) VALUES (OLD.gpu_id, OLD.started_at, OLD.ended_at);
  ELSIF OLD.gpu_id <> NEW.gpu_id OR OLD.started_at <> NEW.started_at OR OLD.job_id <> NEW.job_id
  THEN
    INSERT INTO cost_day_dirty (gpu_id, lo, hi)
      VALUES (OLD.gpu_id, LEAST(OLD.started_at, NEW.started_at), NULL),
             (NEW.gpu_id, LEAST(OLD.started_at, NEW.started_at), NULL);
  ELSIF OLD.ended_at IS DISTINCT FROM NEW.ended_at THEN
    INSERT INTO cost_day_dirty (gpu_id, lo, hi)
      VALUES (NEW.gpu_id, LEAST(OLD.ended_at, NEW.ended_at), NULL);
  END IF;
  RETURN NULL;
END $$;
CREATE FUNCTION cost_days_jobs_end() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO cost_day_dirty (gpu_id, lo, hi)
    SELECT gpu_id, LEAST(OLD.ended_at, NEW.ended_at), NULL FROM job_gpus
    WHERE job_id = NEW.id AND ended_at IS NULL;
  RETURN NULL;
END $$;
CREATE FUNCTION cost_days_gpus() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO cost_day_dirty (gpu_id, lo, hi) VALUES (NEW.id, CASE
    WHEN OLD.model IS DISTINCT FROM NEW.model OR OLD.first_seen_at IS DISTINCT FROM
      NEW.first_seen_at THEN NULL
    ELSE LEAST(OLD.lost_at, NEW.lost_at, OLD.retired_at, NEW.retired_at) END, NULL);
  RETURN NULL;
END $$;
"""
_PG_TRIGGERS = (
    "CREATE TRIGGER cost_days_job_gpus AFTER INSERT OR UPDATE OR DELETE ON job_gpus "
    "FOR EACH ROW EXECUTE FUNCTION cost_days_job_gpus()",
    "CREATE TRIGGER cost_days_jobs_end AFTER UPDATE OF ended_at ON jobs FOR EACH ROW "
    "WHEN (OLD.ended_at IS DISTINCT FROM NEW.ended_at) EXECUTE FUNCTION cost_days_jobs_end()",
    "CREATE TRIGGER cost_days_gpus AFTER UPDATE OF lost_at, retired_at, model, first_seen_at "
    "ON gpus FOR EACH ROW WHEN (OLD.lost_at IS DISTINCT FROM NEW.lost_at OR OLD.retired_at IS "
    "DISTINCT FROM NEW.retired_at OR OLD.model IS DISTINCT FROM NEW.model OR OLD.first_seen_at "
    "IS DISTINCT FROM NEW.first_seen_at) EXECUTE FUNCTION cost_days_gpus()",
)


def _sums() -> list[sa.Column[float]]:
    return [sa.Column(f, sa.Float(), nullable=False, server_default="0") for f in _SUMS]


def upgrade() -> None:
    op.create_table(
        "cost_gpu_1d",
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("day", UTCDateTime(), nullable=False),
        sa.Column("basis", sa.String(64), nullable=False),
        sa.Column("held_from", UTCDateTime(), nullable=True),
        sa.Column("held_until", UTCDateTime(), nullable=True),
        sa.Column("written_at", UTCDateTime(), nullable=False),
        *_sums(),
        sa.PrimaryKeyConstraint("day", "gpu_id", name="pk_cost_gpu_1d"),
    )
    op.create_index("ix_cost_gpu_1d_gpu_day", "cost_gpu_1d", ["gpu_id", "day"])
    op.create_table(
        "cost_job_1d",
        sa.Column("day", UTCDateTime(), nullable=False),
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(255), nullable=False),  # "" for time no job held
        *_sums(),
        sa.PrimaryKeyConstraint("day", "gpu_id", "job_id", name="pk_cost_job_1d"),
    )
    op.create_table(
        "cost_day_dirty",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("lo", UTCDateTime(), nullable=True),
        sa.Column("hi", UTCDateTime(), nullable=True),
    )
    # A report by job names each job's hardware XIDs: the few buckets that carry one, found
    # without reading a month of every GPU's hours.
    for table in ("rollup_1h", "rollup_1m"):
        op.create_index(
            f"ix_{table}_xid", table, ["bucket_start"],
            postgresql_where=sa.text("xid_last_max IS NOT NULL"),
            sqlite_where=sa.text("xid_last_max IS NOT NULL"),
        )  # fmt: skip
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_FUNCTIONS)
        for statement in _PG_TRIGGERS:
            op.execute(statement)
    else:
        for statement in _SQLITE_TRIGGERS:
            op.execute(statement)


def downgrade() -> None:
    pg = op.get_bind().dialect.name == "postgresql"
    for table, trigger in (("job_gpus", "cost_days_job_gpus"), ("jobs", "cost_days_jobs_end"),
                           ("gpus", "cost_days_gpus")):  # fmt: skip
        if pg:
            op.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {table}")
            op.execute(f"DROP FUNCTION IF EXISTS {trigger}()")
    if not pg:
        for name in ("cost_days_job_gpus_ins", "cost_days_job_gpus_del", "cost_days_job_gpus_upd",
                     "cost_days_jobs_end", "cost_days_gpus"):  # fmt: skip
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    for table in ("cost_day_dirty", "cost_job_1d", "cost_gpu_1d"):
        op.drop_table(table)
    for table in ("rollup_1h", "rollup_1m"):
        op.drop_index(f"ix_{table}_xid", table_name=table)
