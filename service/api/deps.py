"""FastAPI dependencies: the service context, database connections and token checks."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from sqlalchemy import Connection

from service.context import ServiceContext
from service.db import tokens_repo
from service.db.tokens_repo import Role, TokenInfo


def get_ctx(request: Request) -> ServiceContext:
    """The ServiceContext the app factory stored on the app."""
    ctx: ServiceContext = request.app.state.ctx
    return ctx


Ctx = Annotated[ServiceContext, Depends(get_ctx)]


def read_conn(ctx: Ctx) -> Iterator[Connection]:
    """A connection for reading, closed after the request."""
    with ctx.engine.connect() as conn:
        yield conn


def write_conn(ctx: Ctx) -> Iterator[Connection]:
    """A connection in a transaction that commits when the request succeeds."""
    with ctx.engine.begin() as conn:
        yield conn


ReadConn = Annotated[Connection, Depends(read_conn)]
# scope="function": commit before the response is sent, so a 2xx means the write is visible.
WriteConn = Annotated[Connection, Depends(write_conn, scope="function")]

# A revoked token stops working within this many seconds; agents otherwise cost a query per batch.
TOKEN_CACHE_SECONDS = 5.0

_UNAUTHORIZED = HTTPException(
    status.HTTP_401_UNAUTHORIZED,
    detail="missing or invalid bearer token",
    headers={"WWW-Authenticate": "Bearer"},
)


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer`` header, or None."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def authenticate(ctx: ServiceContext, request: Request) -> TokenInfo:
    """The caller's token, or 401."""
    token = bearer_token(request)
    if token is None:
        raise _UNAUTHORIZED
    digest = tokens_repo.hash_token(token)
    cached = ctx.token_cache.get(digest)
    if cached is not None and time.monotonic() - cached[1] < TOKEN_CACHE_SECONDS:
        return cached[0]
    with ctx.engine.connect() as conn:
        info = tokens_repo.authenticate(conn, token=token)
    if info is None:
        ctx.token_cache.pop(digest, None)
        raise _UNAUTHORIZED
    ctx.token_cache[digest] = (info, time.monotonic())
    return info


def require(*roles: Role) -> Callable[[Request, ServiceContext], TokenInfo]:
    """A dependency that lets through tokens of ``roles`` (admin always) and answers 403 else."""
    allowed = {*roles, Role.ADMIN}

    def check(request: Request, ctx: Ctx) -> TokenInfo:
        info = authenticate(ctx, request)
        if info.role not in allowed:
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                detail=f"a token with role {info.role.value!r} may not do this; "
                f"needs one of {sorted(r.value for r in allowed)}",
            )
        return info

    return check


Reader = Annotated[TokenInfo, Depends(require(Role.READER))]
Agent = Annotated[TokenInfo, Depends(require(Role.AGENT))]
Admin = Annotated[TokenInfo, Depends(require())]
