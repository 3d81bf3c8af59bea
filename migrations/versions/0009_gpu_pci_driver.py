"""Each GPU's PCI bus id and driver version (dcgm-exporter's pci_bus_id and DCGM_FI_DRIVER_VERSION).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpus") as batch:
        batch.add_column(sa.Column("pci_bus_id", sa.String(32), nullable=True))
        batch.add_column(sa.Column("driver_version", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpus") as batch:
        batch.drop_column("driver_version")
        batch.drop_column("pci_bus_id")
