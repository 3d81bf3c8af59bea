"""Alerting: policies, channels, alerts with their events, silences and the notification outbox.

Revision ID: 0003
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from service.db.types import UTCDateTime

revision = "0003"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for name in ("policies", "channels"):
        op.create_table(
            name,
            sa.Column("name", sa.String(255), nullable=False),
            sa.Column("spec", sa.JSON, nullable=False),
            sa.Column("source", sa.String(16), nullable=False),
            sa.Column("created_at", UTCDateTime, nullable=False),
            sa.Column("updated_at", UTCDateTime, nullable=False),
            sa.PrimaryKeyConstraint("name", name=f"pk_{name}"),
        )
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer, nullable=False, autoincrement=True),
        sa.Column("policy", sa.String(255), nullable=False),
        sa.Column("scope_key", sa.String(512), nullable=False),
        sa.Column("severity", sa.String(32), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("labels", sa.JSON, nullable=False),
        sa.Column("value", sa.Float, nullable=True),
        sa.Column("threshold", sa.Float, nullable=False),
        sa.Column("active_since", UTCDateTime, nullable=False),
        sa.Column("fired_at", UTCDateTime, nullable=True),
        sa.Column("resolved_at", UTCDateTime, nullable=True),
        sa.Column("last_eval_at", UTCDateTime, nullable=False),
        sa.Column("last_notified_at", UTCDateTime, nullable=True),
        sa.Column("last_resent_at", UTCDateTime, nullable=True),
        sa.Column("stale", sa.Integer, nullable=False, server_default="0"),
        sa.Column("suppressed", sa.Integer, nullable=False, server_default="0"),
        sa.Column("silenced", sa.Integer, nullable=False, server_default="0"),
        sa.Column("job_id", sa.String(255), nullable=True),
        sa.Column("node", sa.String(255), nullable=True),
        sa.Column("gpu_uuid", sa.String(96), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_alerts"),
    )
    op.create_index("ix_alerts_policy_scope_key_state", "alerts", ["policy", "scope_key", "state"])
    op.create_index("ix_alerts_state", "alerts", ["state"])
    op.create_index("ix_alerts_active_since", "alerts", ["active_since"])
    op.create_table(
        "alert_events",
        sa.Column("id", sa.Integer, nullable=False, autoincrement=True),
        sa.Column("alert_id", sa.Integer, nullable=False),
        sa.Column("ts", UTCDateTime, nullable=False),
        sa.Column("from_state", sa.String(16), nullable=False),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("value", sa.Float, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_alert_events"),
        sa.ForeignKeyConstraint(
            ["alert_id"], ["alerts.id"], name="fk_alert_events_alert_id_alerts", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_alert_events_alert_id", "alert_events", ["alert_id"])
    op.create_table(
        "silences",
        sa.Column("id", sa.Integer, nullable=False, autoincrement=True),
        sa.Column("matchers", sa.JSON, nullable=False),
        sa.Column("starts_at", UTCDateTime, nullable=False),
        sa.Column("ends_at", UTCDateTime, nullable=False),
        sa.Column("comment", sa.Text, nullable=False),
        sa.Column("created_by", sa.String(255), nullable=True),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_silences"),
    )
    op.create_table(
        "outbox",
        sa.Column("id", sa.Integer, nullable=False, autoincrement=True),
        sa.Column("delivery_id", sa.String(64), nullable=False),
        sa.Column("channel", sa.String(255), nullable=False),
        sa.Column("alert_id", sa.Integer, nullable=True),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_attempt_at", UTCDateTime, nullable=False),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("sent_at", UTCDateTime, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_outbox"),
        sa.UniqueConstraint("delivery_id", name="uq_outbox_delivery_id"),
    )
    op.create_index("ix_outbox_status_next_attempt_at", "outbox", ["status", "next_attempt_at"])


def downgrade() -> None:
    op.drop_table("outbox")
    op.drop_table("silences")
    op.drop_table("alert_events")
    op.drop_table("alerts")
    op.drop_table("channels")
    op.drop_table("policies")
