"""``/api/v1/policies``: threshold policies, validated exactly like the YAML file."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Body, Response, status

from service.api.deps import Admin, Ctx, ReadConn, Reader, WriteConn
from service.api.schemas.alerting import PolicyPublic
from service.db import changes_repo, policies_repo
from service.errors import NotFound, ValidationFailed
from service.thresholds.policy import PolicySpec, check_policy_channels, parse_policy

router = APIRouter(prefix="/policies", tags=["alerting"])

_BODY = Body(
    description="a policy: name, metric, aggregate, window, op, threshold, for, scope, match, "
    "severity, channels, repeat_interval, send_resolved",
    examples=[
        {
            "name": "low-sm-activity",
            "metric": "sm_active",
            "aggregate": "avg",
            "window": "10m",
            "op": "<",
            "threshold": 0.3,
            "for": "15m",
            "scope": "job",
            "severity": "warning",
            "channels": ["slack-gpu"],
        }
    ],
)


def _public(p: PolicySpec) -> PolicyPublic:
    return PolicyPublic.model_validate(p.model_dump())


def _validated(conn: WriteConn, doc: Any) -> PolicySpec:
    policy = parse_policy(doc)  # ValidationFailed names the field, as for the YAML file
    check_policy_channels(policy, {c.name for c in policies_repo.list_channels(conn)})
    return policy


@router.get("", response_model=list[PolicyPublic], response_model_by_alias=True)
def list_policies(conn: ReadConn, _: Reader) -> list[PolicyPublic]:
    """Every policy."""
    return [_public(p) for p in policies_repo.list_policies(conn)]


@router.post(
    "",
    response_model=PolicyPublic,
    response_model_by_alias=True,
    status_code=status.HTTP_201_CREATED,
)
def create_policy(
    ctx: Ctx, conn: WriteConn, token: Admin, doc: dict[str, Any] = _BODY
) -> PolicyPublic:
    """Create a policy (409 if the name exists)."""
    policy = _validated(conn, doc)
    policies_repo.create_policy(conn, policy=policy, source="api", now=ctx.clock())
    _record(conn, token.actor, None, policy, ctx.clock())
    return _public(policy)


def _record(
    conn: WriteConn, actor: str, before: PolicySpec | None, after: PolicySpec | None, now: datetime
) -> None:
    """Log the policy's change by ``actor``, and its ladder's where the ladder changed."""
    either = after or before
    name = "" if either is None else either.name
    action = "create" if before is None else "delete" if after is None else "update"
    changes_repo.record(conn, actor=actor, kind="policy", name=name, action=action, now=now)
    old, new = (p.ladder if p is not None else None for p in (before, after))
    if old != new:
        how = "create" if old is None else "delete" if new is None else "update"
        changes_repo.record(conn, actor=actor, kind="ladder", name=name, action=how, now=now)


def _stored(conn: WriteConn, name: str) -> PolicySpec | None:
    try:
        return policies_repo.get_policy(conn, name=name)
    except NotFound:
        return None


@router.get("/{name}", response_model=PolicyPublic, response_model_by_alias=True)
def get_policy(name: str, conn: ReadConn, _: Reader) -> PolicyPublic:
    """One policy."""
    return _public(policies_repo.get_policy(conn, name=name))


@router.put("/{name}", response_model=PolicyPublic, response_model_by_alias=True)
def put_policy(
    name: str,
    ctx: Ctx,
    conn: WriteConn,
    response: Response,
    token: Admin,
    doc: dict[str, Any] = _BODY,
) -> PolicyPublic:
    """Create or replace policy ``name`` (the body's name, if given, must match)."""
    if isinstance(doc, dict):
        doc = {"name": name, **doc}
        if doc["name"] != name:
            raise ValidationFailed("name", f"must match the path ({name!r})")
    policy = _validated(conn, doc)
    before = _stored(conn, name)
    if policies_repo.put_policy(conn, policy=policy, source="api", now=ctx.clock()):
        response.status_code = status.HTTP_201_CREATED
    _record(conn, token.actor, before, policy, ctx.clock())
    return _public(policy)


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT)
def delete_policy(name: str, ctx: Ctx, conn: WriteConn, token: Admin) -> None:
    """Delete a policy; its open alerts resolve quietly at the next round."""
    before = _stored(conn, name)
    policies_repo.delete_policy(conn, name=name)
    _record(conn, token.actor, before, None, ctx.clock())
