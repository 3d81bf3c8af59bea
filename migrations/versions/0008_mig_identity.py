"""MIG instances: one identity across backends, and retirement instead of loss.

Adds ``gpus.retired_at`` and rewrites the ids the dcgm-exporter backend used to store for MIG
instances (``<parent uuid>::gi<id>``, model ``<parent model> MIG <profile>``) into the identity
both backends now send: ``MIG-<parent uuid>/<gi>/<profile>@<created>``, dated by the row's
first_seen_at. Rows the NVML backend stored under NVML's own ``MIG-<uuid>`` are left as they
are: their GPU instance id was never stored, so they cannot be keyed; they stop receiving samples
and keep their history.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from service.db.types import UTCDateTime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_OLD = re.compile(r"^(?P<parent>.+)::gi(?P<gi>\d+)$")
_PROFILE = re.compile(r"\b(\d+g\.\d+gb(?:\+\w+)?)", re.IGNORECASE)


def _created(value: object) -> str:
    if isinstance(value, str):  # SQLite hands the stored text back
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    assert isinstance(value, datetime)
    moment = value if value.tzinfo else value.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


def upgrade() -> None:
    with op.batch_alter_table("gpus") as batch:
        batch.add_column(sa.Column("retired_at", UTCDateTime, nullable=True))
    conn = op.get_bind()
    rows = conn.execute(
        sa.text("SELECT id, uuid, model, first_seen_at FROM gpus WHERE uuid LIKE '%::gi%'")
    ).all()
    for gid, uuid, model, first_seen in rows:
        m = _OLD.match(uuid)
        if m is None:
            continue
        p = _PROFILE.search(model or "")
        profile = p.group(1).lower() if p else "unknown"
        new = f"MIG-{m['parent']}/{m['gi']}/{profile}@{_created(first_seen)}"
        conn.execute(sa.text("UPDATE gpus SET uuid = :new WHERE id = :id"), {"new": new, "id": gid})


def downgrade() -> None:
    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT id, uuid FROM gpus WHERE uuid LIKE 'MIG-%/%/%@%'")).all()
    for gid, uuid in rows:
        parent, gi = uuid.removeprefix("MIG-").split("/")[:2]
        old = f"{parent}::gi{gi}"
        conn.execute(sa.text("UPDATE gpus SET uuid = :old WHERE id = :id"), {"old": old, "id": gid})
    with op.batch_alter_table("gpus") as batch:
        batch.drop_column("retired_at")
