"""``/api/v1/owners``: the owner directory (users, teams, the admins and how to reach them).

Admins only: the directory holds people's addresses. Entries from the config file, the API
and cached answers of the lookup command show side by side, each with its ``source``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Response, status

from service.api.deps import Admin, Ctx, ReadConn, WriteConn
from service.api.schemas.owners import OwnerCreate, OwnerPublic, OwnerUpdate
from service.db import changes_repo, owners_repo
from service.thresholds.owners import OWNER_NAME_PATTERN, parse_owner

router = APIRouter(prefix="/owners", tags=["owners"])
Kind = Literal["user", "team", "admins"]
Name = Annotated[
    str, Path(pattern=OWNER_NAME_PATTERN, description="the user's or team's name; admins: admins")
]


@router.get("", response_model=list[OwnerPublic])
def list_owners(conn: ReadConn, _: Admin, kind: Kind | None = None) -> list[OwnerPublic]:
    """Every directory entry (of ``kind``), by kind and name."""
    return [OwnerPublic.of(s) for s in owners_repo.list_owners(conn, kind=kind)]


@router.post("", response_model=OwnerPublic, status_code=status.HTTP_201_CREATED)
def create_owner(body: OwnerCreate, ctx: Ctx, conn: WriteConn, token: Admin) -> OwnerPublic:
    """Add a user, team or the admins; 409 if the directory already has it."""
    entry = parse_owner(body.model_dump())
    owners_repo.create_owner(conn, entry=entry, now=ctx.clock())
    changes_repo.record(conn, actor=token.actor, kind="owner", name=f"{entry.kind}/{entry.name}",
                        action="create", now=ctx.clock())  # fmt: skip
    return OwnerPublic.of(owners_repo.get_owner(conn, kind=entry.kind, name=entry.name))


@router.get("/{kind}/{name}", response_model=OwnerPublic)
def get_owner(kind: Kind, name: Name, conn: ReadConn, _: Admin) -> OwnerPublic:
    """One directory entry."""
    return OwnerPublic.of(owners_repo.get_owner(conn, kind=kind, name=name))


@router.put(
    "/{kind}/{name}",
    response_model=OwnerPublic,
    responses={201: {"model": OwnerPublic, "description": "a new entry"}},
)
def put_owner(
    kind: Kind, name: Name, body: OwnerUpdate, ctx: Ctx, conn: WriteConn, token: Admin,
    response: Response,
) -> OwnerPublic:  # fmt: skip
    """Set how to reach ``kind``/``name`` (201 when new); it wins over the config file."""
    entry = parse_owner(body.model_dump() | {"kind": kind, "name": name})
    new = owners_repo.put_owner(conn, entry=entry, source="api", now=ctx.clock())
    if new:
        response.status_code = status.HTTP_201_CREATED
    changes_repo.record(conn, actor=token.actor, kind="owner", name=f"{kind}/{name}",
                        action="create" if new else "update", now=ctx.clock())  # fmt: skip
    return OwnerPublic.of(owners_repo.get_owner(conn, kind=kind, name=name))


@router.delete("/{kind}/{name}", status_code=status.HTTP_204_NO_CONTENT)
def delete_owner(kind: Kind, name: Name, ctx: Ctx, conn: WriteConn, token: Admin) -> None:
    """Remove an entry (a config-file entry comes back at the next start)."""
    owners_repo.delete_owner(conn, kind=kind, name=name)
    changes_repo.record(conn, actor=token.actor, kind="owner", name=f"{kind}/{name}",
                        action="delete", now=ctx.clock())  # fmt: skip
