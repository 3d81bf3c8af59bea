"""Storage of the owner directory: entries from the config file, the API and cached lookups."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, and_, delete, insert, select, tuple_, update

from service.db.schema import owners
from service.errors import Conflict, NotFound
from service.thresholds.owners import OwnerEntry, OwnerKind

_FIELDS = ("email", "slack", "cc_email", "cc_slack", "team")


@dataclass(frozen=True, slots=True)
class StoredOwner:
    """A directory entry with where it came from and, for a cached lookup, until when."""

    entry: OwnerEntry
    source: str  # file | api | lookup
    expires_at: datetime | None
    updated_at: datetime


def _stored(row: object) -> StoredOwner:
    entry = OwnerEntry.model_construct(
        kind=row.kind,  # type: ignore[attr-defined]
        name=row.name,  # type: ignore[attr-defined]
        **{f: getattr(row, f) for f in _FIELDS},
    )
    return StoredOwner(entry, row.source, row.expires_at, row.updated_at)  # type: ignore[attr-defined]


def list_owners(conn: Connection, *, kind: OwnerKind | None = None) -> list[StoredOwner]:
    """Every entry (of ``kind``), by kind and name."""
    q = select(owners).order_by(owners.c.kind, owners.c.name)
    if kind is not None:
        q = q.where(owners.c.kind == kind)
    return [_stored(r) for r in conn.execute(q)]


def get_owners(conn: Connection, *, keys: Sequence[tuple[str, str]]) -> list[StoredOwner]:
    """The entries of the (kind, name) ``keys`` that exist."""
    if not keys:
        return []
    q = select(owners).where(tuple_(owners.c.kind, owners.c.name).in_(list(keys)))
    return [_stored(r) for r in conn.execute(q)]


def get_owner(conn: Connection, *, kind: OwnerKind, name: str) -> StoredOwner:
    """One entry, or NotFound."""
    found = get_owners(conn, keys=[(kind, name)])
    if not found:
        raise NotFound(f"no {kind} named {name!r} in the owner directory")
    return found[0]


def put_owner(
    conn: Connection,
    *,
    entry: OwnerEntry,
    source: str,
    now: datetime,
    expires_at: datetime | None = None,
) -> bool:
    """Insert or replace ``entry``; True if it was new."""
    key = and_(owners.c.kind == entry.kind, owners.c.name == entry.name)
    values = {f: getattr(entry, f) for f in _FIELDS} | {
        "source": source,
        "expires_at": expires_at,
        "updated_at": now,
    }
    if conn.execute(select(owners.c.name).where(key)).first() is not None:
        conn.execute(update(owners).where(key).values(**values))
        return False
    conn.execute(insert(owners).values(kind=entry.kind, name=entry.name, created_at=now, **values))
    return True


def create_owner(conn: Connection, *, entry: OwnerEntry, now: datetime) -> None:
    """Store a new entry made through the API; Conflict if one of that kind and name exists
    (a cached lookup answer is replaced: the admin's word wins)."""
    try:
        existing = get_owner(conn, kind=entry.kind, name=entry.name)
    except NotFound:
        existing = None
    if existing is not None and existing.source != "lookup":
        raise Conflict(f"{entry.kind} {entry.name!r} is already in the owner directory")
    put_owner(conn, entry=entry, source="api", now=now)


def delete_owner(conn: Connection, *, kind: OwnerKind, name: str) -> None:
    """Remove an entry, or NotFound."""
    key = and_(owners.c.kind == kind, owners.c.name == name)
    if not conn.execute(delete(owners).where(key)).rowcount:
        raise NotFound(f"no {kind} named {name!r} in the owner directory")


def sync_from_file(conn: Connection, *, entries: Sequence[OwnerEntry], now: datetime) -> None:
    """Make the file-sourced entries exactly those of the config file (API entries and cached
    lookups of other names stay; a file entry replaces a cached lookup of the same name)."""
    keys = [(e.kind, e.name) for e in entries]
    stale = owners.c.source == "file"
    if keys:
        stale = and_(stale, tuple_(owners.c.kind, owners.c.name).not_in(keys))
    conn.execute(delete(owners).where(stale))
    api = {(s.entry.kind, s.entry.name) for s in get_owners(conn, keys=keys) if s.source == "api"}
    for e in entries:
        if (e.kind, e.name) not in api:  # an admin's change through the API wins
            put_owner(conn, entry=e, source="file", now=now)
