"""Activity, its rung and the cause stored with each sample; seconds per cause in the rollups.

Samples already stored get their decision under the default thresholds. Idle changes meaning
with this revision (nothing running, rather than sm_active below 0.05), so every 1-minute
bucket whose raw samples are still kept is marked for the rollup job to recompute (and its
hour and running totals with it); older buckets keep the rule of their time and no seconds
per cause: docs/diagnosis.md dates the change.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from service.core.diagnosis import Thresholds, decide

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# Frozen as of this revision: the new integral columns (idle_held_seconds already exists).
_CAUSE_COLUMNS = (
    "idle_empty_seconds",
    "launch_bound_seconds",
    "input_starved_seconds",
    "transfer_bound_seconds",
    "memory_bound_seconds",
    "compute_no_tensor_seconds",
    "compute_tensor_seconds",
    "unclassified_seconds",
)
# The sample columns the decision reads.
_READS = (
    "sm_active",
    "gr_engine_active",
    "gpu_util",
    "fb_used_bytes",
    "tensor_active",
    "dram_active",
    "pcie_tx_bytes_per_second",
    "pcie_rx_bytes_per_second",
    "nvlink_tx_bytes_per_second",
    "nvlink_rx_bytes_per_second",
)
_CHUNK = 50_000


def _backfill(conn: sa.Connection) -> None:
    """Decide every stored sample, in key order, a chunk at a time."""
    thresholds = Thresholds()
    cols = ", ".join(f"s.{c}" for c in _READS)
    listed = "EXISTS (SELECT 1 FROM gpu_processes p WHERE p.gpu_id = s.gpu_id AND p.ts = s.ts)"
    update = sa.text(
        "UPDATE samples SET activity = :a, activity_rung = :r, cause = :c "
        "WHERE gpu_id = :g AND ts = :t"
    )
    after: tuple[Any, Any] | None = None
    while True:
        where = "" if after is None else "WHERE (s.gpu_id > :g OR (s.gpu_id = :g AND s.ts > :t))"
        params = {} if after is None else {"g": after[0], "t": after[1]}
        rows = conn.execute(
            sa.text(
                f"SELECT s.gpu_id, s.ts, {listed} AS listed, {cols} FROM samples s {where} "
                f"ORDER BY s.gpu_id, s.ts LIMIT {_CHUNK}"
            ),
            params,
        ).all()
        if not rows:
            return
        updates = []
        for r in rows:
            d = decide(dict(zip(_READS, r[3:], strict=True)), thresholds, has_process=bool(r[2]))
            if d is not None:
                updates.append(
                    {"a": d.activity, "r": int(d.rung), "c": int(d.cause), "g": r[0], "t": r[1]}
                )
        if updates and conn.dialect.name == "postgresql":
            _update_by_copy(conn, updates)
        elif updates:
            conn.execute(update, updates)
        after = (rows[-1][0], rows[-1][1])


def _update_by_copy(conn: sa.Connection, updates: list[dict[str, Any]]) -> None:
    """On PostgreSQL: COPY the decisions into a scratch table and join it in one UPDATE
    (several times faster than an UPDATE per row on a big samples table)."""
    conn.exec_driver_sql(
        "CREATE TEMPORARY TABLE IF NOT EXISTS gw_decisions "
        "(gpu_id integer, ts timestamptz, a double precision, r smallint, c smallint)"
    )
    conn.exec_driver_sql("TRUNCATE gw_decisions")
    raw: Any = conn.connection.dbapi_connection
    with raw.cursor() as cur, cur.copy("COPY gw_decisions (gpu_id, ts, a, r, c) FROM STDIN") as cp:
        for u in updates:
            cp.write_row((u["g"], u["t"], u["a"], u["r"], u["c"]))
    conn.exec_driver_sql(
        "UPDATE samples s SET activity = d.a, activity_rung = d.r, cause = d.c "
        "FROM gw_decisions d WHERE s.gpu_id = d.gpu_id AND s.ts = d.ts"
    )


def upgrade() -> None:
    op.add_column("samples", sa.Column("activity", sa.Float(), nullable=True))
    op.add_column("samples", sa.Column("activity_rung", sa.SmallInteger(), nullable=True))
    op.add_column("samples", sa.Column("cause", sa.SmallInteger(), nullable=True))
    for table in ("rollup_1m", "rollup_1h"):
        with op.batch_alter_table(table) as batch:
            for c in _CAUSE_COLUMNS:
                batch.add_column(sa.Column(c, sa.Float(), nullable=False, server_default="0"))
            for suffix in ("sum", "min", "max"):
                batch.add_column(sa.Column(f"activity_{suffix}", sa.Float(), nullable=True))
            batch.add_column(
                sa.Column("activity_count", sa.Integer(), nullable=False, server_default="0")
            )
    with op.batch_alter_table("rollup_1m") as batch:
        for c in _CAUSE_COLUMNS:
            batch.add_column(sa.Column(f"cum_{c}", sa.Float(), nullable=True))
    # The new fields are 0 in every stored bucket, and so are their running totals.
    op.execute("UPDATE rollup_1m SET " + ", ".join(f"cum_{c} = 0" for c in _CAUSE_COLUMNS))
    conn = op.get_bind()
    _backfill(conn)
    # Recompute every minute raw retention still covers, under the new meaning of idle.
    op.execute(
        "INSERT INTO rollup_dirty (gpu_id, bucket_start) "
        "SELECT r.gpu_id, r.bucket_start FROM rollup_1m r "
        "WHERE r.bucket_start >= (SELECT MIN(s.ts) FROM samples s WHERE s.gpu_id = r.gpu_id) "
        "AND NOT EXISTS (SELECT 1 FROM rollup_dirty d "
        "  WHERE d.gpu_id = r.gpu_id AND d.bucket_start = r.bucket_start)"
    )


def downgrade() -> None:
    with op.batch_alter_table("rollup_1m") as batch:
        for c in reversed(_CAUSE_COLUMNS):
            batch.drop_column(f"cum_{c}")
    for table in ("rollup_1m", "rollup_1h"):
        with op.batch_alter_table(table) as batch:
            for suffix in ("count", "max", "min", "sum"):
                batch.drop_column(f"activity_{suffix}")
            for c in reversed(_CAUSE_COLUMNS):
                batch.drop_column(c)
    for c in ("cause", "activity_rung", "activity"):
        op.drop_column("samples", c)
