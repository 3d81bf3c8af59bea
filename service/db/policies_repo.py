"""Storage of alerting policies and notification channels (API-made and file-made)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Connection, Table, delete, insert, select, update

from service.db.schema import channels, policies
from service.errors import Conflict, NotFound
from service.thresholds.policy import ChannelSpec, PolicySpec

log = logging.getLogger(__name__)

# --- policies and channels -------------------------------------------------------------


def _upsert(
    conn: Connection, table: Table, *, name: str, spec: dict[str, Any], source: str, now: datetime
) -> bool:
    """Insert or replace the row ``name``; True if it was new."""
    exists = conn.execute(select(table.c.name).where(table.c.name == name)).first() is not None
    if exists:
        conn.execute(
            update(table)
            .where(table.c.name == name)
            .values(spec=spec, source=source, updated_at=now)
        )
    else:
        conn.execute(
            insert(table).values(
                name=name, spec=spec, source=source, created_at=now, updated_at=now
            )
        )
    return not exists


def _specs(conn: Connection, table: Table) -> list[Any]:
    """The stored spec documents of ``table`` (policies or channels), by name."""
    return [r.spec for r in conn.execute(select(table.c.spec).order_by(table.c.name))]


def _spec(conn: Connection, table: Table, *, name: str, what: str) -> Any:
    """The stored spec document named ``name``, or NotFound naming the ``what``."""
    spec = conn.execute(select(table.c.spec).where(table.c.name == name)).scalar()
    if spec is None:
        raise NotFound(f"no {what} named {name!r}")
    return spec


def _insert_new(
    conn: Connection, table: Table, *, name: str, spec: dict[str, Any], source: str,
    now: datetime, taken: str,
) -> None:  # fmt: skip
    """Store a new spec; Conflict with the message ``taken`` if the name is in use."""
    if conn.execute(select(table.c.name).where(table.c.name == name)).first():
        raise Conflict(taken)
    _upsert(conn, table, name=name, spec=spec, source=source, now=now)


def _delete(conn: Connection, table: Table, *, name: str, what: str) -> None:
    """Delete the spec named ``name``, or NotFound naming the ``what``."""
    if conn.execute(delete(table).where(table.c.name == name)).rowcount == 0:
        raise NotFound(f"no {what} named {name!r}")


def list_policies(conn: Connection) -> list[PolicySpec]:
    """Every valid policy, by name; a stored one that no longer validates is logged and left out.

    Rules tighten over time (durations are now bounded); a policy stored under older rules must
    not stop every other policy from being listed and evaluated.
    """
    out = []
    for spec in _specs(conn, policies):
        try:
            out.append(PolicySpec.model_validate(spec))
        except ValidationError as exc:
            name = spec.get("name") if isinstance(spec, dict) else None
            log.warning("stored policy %r is not valid any more and is skipped: %s", name, exc)
    return out


def get_policy(conn: Connection, *, name: str) -> PolicySpec:
    """Policy ``name``, or NotFound."""
    return PolicySpec.model_validate(_spec(conn, policies, name=name, what="policy"))


def create_policy(conn: Connection, *, policy: PolicySpec, source: str, now: datetime) -> None:
    """Store a new policy; Conflict if the name is taken."""
    _insert_new(
        conn, policies, name=policy.name, spec=policy.document(), source=source, now=now,
        taken=f"a policy named {policy.name!r} exists; PUT /policies/{policy.name}",
    )  # fmt: skip


def put_policy(conn: Connection, *, policy: PolicySpec, source: str, now: datetime) -> bool:
    """Create or replace a policy; True if it was new."""
    return _upsert(conn, policies, name=policy.name, spec=policy.document(), source=source, now=now)


def delete_policy(conn: Connection, *, name: str) -> None:
    """Delete policy ``name`` (NotFound if absent); its open alerts resolve at the next round."""
    _delete(conn, policies, name=name, what="policy")


def list_channels(conn: Connection) -> list[ChannelSpec]:
    """Every channel, by name (with secrets: never return these from the API as they are)."""
    return [ChannelSpec.model_validate(spec) for spec in _specs(conn, channels)]


def get_channel(conn: Connection, *, name: str) -> ChannelSpec:
    """Channel ``name``, or NotFound."""
    return ChannelSpec.model_validate(_spec(conn, channels, name=name, what="channel"))


def create_channel(conn: Connection, *, channel: ChannelSpec, source: str, now: datetime) -> None:
    """Store a new channel; Conflict if the name is taken."""
    _insert_new(
        conn, channels, name=channel.name, spec=channel.model_dump(), source=source, now=now,
        taken=f"a channel named {channel.name!r} exists",
    )  # fmt: skip


def put_channel(conn: Connection, *, channel: ChannelSpec, source: str, now: datetime) -> bool:
    """Create or replace a channel; True if it was new."""
    return _upsert(
        conn, channels, name=channel.name, spec=channel.model_dump(), source=source, now=now
    )


def policy_sources(conn: Connection) -> dict[str, str]:
    """Where each stored policy came from (api, file, local), by name."""
    return {r.name: r.source for r in conn.execute(select(policies.c.name, policies.c.source))}


def delete_channel(conn: Connection, *, name: str) -> None:
    """Delete channel ``name`` (NotFound if absent)."""
    _delete(conn, channels, name=name, what="channel")


def sync_from_file(
    conn: Connection,
    *,
    policy_specs: Sequence[PolicySpec],
    channel_specs: Sequence[ChannelSpec],
    now: datetime,
) -> None:
    """Make the file-sourced policies and channels exactly those of the config file."""
    for table, specs in ((channels, channel_specs), (policies, policy_specs)):
        names = [s.name for s in specs]
        conn.execute(
            delete(table).where(table.c.source == "file", table.c.name.not_in(names or [""]))
        )
        for s in specs:
            doc = s.document() if isinstance(s, PolicySpec) else s.model_dump()
            _upsert(conn, table, name=s.name, spec=doc, source="file", now=now)
