"""``/api/v1/session``: the console's login (a token for a session cookie; people sign in through
``/api/v1/auth/oidc``), who is in, logout."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal
from urllib.parse import urlsplit

import anyio
from fastapi import APIRouter, HTTPException, Request, Response, status
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Connection

from service.api import sessions
from service.api.deps import (
    Admin,
    AppState,
    Ctx,
    ScopedReader,
    check_token,
    session_key,
    signing_key,
)
from service.api.gate import monotonic
from service.db import changes_repo, owners_repo, sessions_repo, tokens_repo
from service.db.tokens_repo import Role, TokenInfo
from service.errors import ValidationFailed
from service.roles import Person
from service.thresholds.owners import OwnerEntry, parse_owner

router = APIRouter(prefix="/session", tags=["session"])


class SessionCreate(BaseModel):
    """``POST /session``: the reader or admin token to log in with (sent once, never stored)."""

    model_config = ConfigDict(extra="forbid")

    token: str = Field(min_length=1, max_length=512)


class SessionPublic(BaseModel):
    """Who the caller is; with a session cookie also when it ends and its CSRF token."""

    role: str
    token_id: int
    token_name: str | None
    token_prefix: str
    expires_at: datetime | None = None
    # Send it as the X-CSRF-Token header on every write made with the session cookie.
    csrf_token: str | None = None
    # A person signed in through the identity provider: the user jobs carry, their teams, and
    # whether they see the whole fleet (fleet-reader or admin) or only their and their teams' jobs.
    user: str | None = None
    teams: list[str] | None = None
    fleet: bool | None = None


def _public(info: TokenInfo, session: sessions.Session | None, key: str) -> SessionPublic:
    return SessionPublic(
        role=info.role.value,
        token_id=info.id,
        token_name=info.name,
        token_prefix=info.prefix,
        expires_at=None if session is None else datetime.fromtimestamp(session.expires_at, tz=UTC),
        csrf_token=None if session is None else sessions.csrf_token(session, key=key),
        user=None if info.person is None else info.person.user,
        teams=None if info.person is None else list(info.person.teams),
        fleet=None if info.person is None else info.scope is None,
    )


def _same_origin(request: Request) -> bool:
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc == request.headers.get("host", "")


@router.post("", response_model=SessionPublic)
async def login(
    body: SessionCreate, request: Request, response: Response, ctx: Ctx, app_state: AppState
) -> SessionPublic:
    """Exchange a reader or admin token for an HttpOnly, SameSite=Strict session cookie.

    The token is checked like a bearer token, failures counted against the client alike.
    """
    if not _same_origin(request):
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail="origin: log in from this site")
    try:
        info = await check_token(request, ctx, body.token.strip())
    except HTTPException as exc:
        if exc.status_code == status.HTTP_401_UNAUTHORIZED:
            exc.detail = "token: unknown or revoked"
        raise
    if info.role is Role.AGENT:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, detail="token: agent tokens may not log in to the console"
        )
    key = await signing_key(ctx)
    lifetime = ctx.settings.console_session_seconds
    session = sessions.new_session(
        token_id=info.id,
        token_hash=tokens_repo.hash_token(body.token.strip()),
        now=ctx.clock().timestamp(),
        lifetime_seconds=lifetime,
    )
    secure = app_state.gate.https(request)
    sessions.set_cookie(response, session, key=key, lifetime_seconds=lifetime, secure=secure)
    response.headers["Cache-Control"] = "no-store"
    return _public(info, session, key)


@router.get("", response_model=SessionPublic)
def whoami(request: Request, response: Response, ctx: Ctx, info: ScopedReader) -> SessionPublic:
    """The caller's role and token; with the session cookie also its expiry and CSRF token."""
    response.headers["Cache-Control"] = "no-store"
    return _public(info, getattr(request.state, "session", None), session_key(ctx))


@router.delete("", status_code=status.HTTP_204_NO_CONTENT)
async def logout(
    request: Request, response: Response, ctx: Ctx, app_state: AppState, _: ScopedReader
) -> None:
    """End the session server-side (a copy of its cookie stops working on every replica) and
    drop the cookie; the token itself stays valid (revoke it to end every session)."""
    key = await signing_key(ctx)
    session = getattr(request.state, "session", None) or sessions.decode(
        request.cookies.get(sessions.COOKIE_NAME, ""), key=key, now=ctx.clock().timestamp()
    )
    if session is not None:
        nonce, expires_at = session.nonce, datetime.fromtimestamp(session.expires_at, tz=UTC)

        def end() -> None:
            with ctx.engine.begin() as conn:
                sessions_repo.end_session(conn, nonce=nonce, expires_at=expires_at, now=ctx.clock())

        await anyio.to_thread.run_sync(end)
        ctx.session_ended[nonce] = (True, monotonic())
    response.delete_cookie(
        sessions.COOKIE_NAME,
        path="/",
        httponly=True,
        samesite="strict",
        secure=app_state.gate.https(request),
    )


class PersonalTokenCreate(BaseModel):
    """``POST /session/tokens``: a name for the new personal token (for the CLI, a script)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("cli", min_length=1, max_length=100)


class PersonalTokenPublic(BaseModel):
    """A personal token: the secret only in the answer that made it."""

    id: int
    name: str | None
    prefix: str
    role: str
    created_at: datetime
    last_used_at: datetime | None = None
    token: str | None = None


def _signed_in_person(info: TokenInfo) -> str:
    """The user of a person signed in through single sign-on; 403 for tokens (a personal token
    cannot mint or list more)."""
    if info.person is None or info.id != 0:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail="personal tokens are minted by a person signed in through single sign-on",
        )
    return info.person.user


def _own_tokens(conn: Connection, user: str) -> list[TokenInfo]:
    return [
        t
        for t in tokens_repo.list_tokens(conn)
        if t.person is not None and t.person.user == user and t.revoked_at is None
    ]


@router.post("/tokens", response_model=PersonalTokenPublic, status_code=status.HTTP_201_CREATED)
def mint_personal_token(
    body: PersonalTokenCreate, ctx: Ctx, info: ScopedReader
) -> PersonalTokenPublic:
    """A token for the CLI and scripts that sees exactly what the signed-in person sees (their
    teams as they are now); shown once, revocable here or with ``gpuwarden token revoke``."""
    user = _signed_in_person(info)
    assert info.person is not None
    with ctx.engine.begin() as conn:
        secret, token = tokens_repo.create_token(
            conn, role=info.person.role, node=None, name=f"{user}: {body.name}",
            now=ctx.clock(), person=info.person,
        )  # fmt: skip
    return PersonalTokenPublic(
        id=token.id, name=token.name, prefix=token.prefix, role=token.role.value,
        created_at=token.created_at, token=secret,
    )  # fmt: skip


@router.get("/tokens", response_model=list[PersonalTokenPublic])
def list_personal_tokens(ctx: Ctx, info: ScopedReader) -> list[PersonalTokenPublic]:
    """The signed-in person's live personal tokens (never their secrets)."""
    user = _signed_in_person(info)
    with ctx.engine.connect() as conn:
        own = _own_tokens(conn, user)
    return [
        PersonalTokenPublic(
            id=t.id,
            name=t.name,
            prefix=t.prefix,
            role=t.role.value,
            created_at=t.created_at,
            last_used_at=t.last_used_at,
        )
        for t in own
    ]


@router.delete("/tokens/{token_id}", status_code=status.HTTP_204_NO_CONTENT)
def revoke_personal_token(token_id: int, ctx: Ctx, info: ScopedReader) -> None:
    """Revoke one of the signed-in person's personal tokens (404 for anyone else's)."""
    user = _signed_in_person(info)
    with ctx.engine.begin() as conn:
        if token_id not in {t.id for t in _own_tokens(conn, user)}:
            raise HTTPException(
                status.HTTP_404_NOT_FOUND, detail=f"token_id: no personal token {token_id} of yours"
            )
        tokens_repo.revoke_token(conn, token_id=token_id, now=ctx.clock())


class ChannelChoice(BaseModel):
    """``PUT /session/channel``: how a person gets their own notices and periodic report."""

    model_config = ConfigDict(extra="forbid")

    channel: Literal["mail", "slack"]
    # With "slack": the person's Slack member id (U...), for a direct message.
    slack: str | None = Field(None, min_length=2, max_length=32)


class ChannelPublic(BaseModel):
    """Where a person's notices go: mail (the address the identity provider vouches for) or a
    Slack direct message; None while the directory has no address of theirs."""

    channel: Literal["mail", "slack"] | None
    email: str | None
    slack: str | None


def _person(info: TokenInfo) -> Person:
    if info.person is None:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail="a person signed in through single sign-on chooses their own channel; "
            "tokens change the owner directory (PUT /api/v1/owners/user/NAME)",
        )
    return info.person


def _channel_of(entry: OwnerEntry | None) -> ChannelPublic:
    if entry is None:
        return ChannelPublic(channel=None, email=None, slack=None)
    channel = "slack" if entry.slack and not entry.email else "mail" if entry.email else None
    return ChannelPublic(channel=channel, email=entry.email, slack=entry.slack)


def _own_entry(conn: Connection, user: str) -> OwnerEntry | None:
    found = owners_repo.get_owners(conn, keys=[("user", user)])
    return found[0].entry if found else None


@router.get("/channel", response_model=ChannelPublic)
def get_channel(ctx: Ctx, info: ScopedReader) -> ChannelPublic:
    """The signed-in person's channel for their own notices and periodic report."""
    person = _person(info)
    with ctx.engine.connect() as conn:
        return _channel_of(_own_entry(conn, person.user))


@router.put("/channel", response_model=ChannelPublic)
def put_channel(body: ChannelChoice, ctx: Ctx, info: ScopedReader) -> ChannelPublic:
    """Choose mail (to the address the identity provider vouches for) or a Slack direct message
    (to the member id given) for one's own notices and report; copies and team stay as set."""
    person = _person(info)
    if body.channel == "mail" and not person.email:
        raise ValidationFailed(
            "channel", "the identity provider gave no verified e-mail address for mail"
        )
    if body.channel == "slack" and not (body.slack or "").startswith(("U", "W")):
        raise ValidationFailed("slack", "a Slack member id (U...) for a direct message")
    with ctx.engine.begin() as conn:
        old = _own_entry(conn, person.user)
        kept = {} if old is None else old.model_dump(include={"cc_email", "cc_slack", "team"})
        entry = parse_owner(
            {"kind": "user", "name": person.user, **kept,
             **({"email": person.email} if body.channel == "mail" else {"slack": body.slack})},
        )  # fmt: skip
        owners_repo.put_owner(conn, entry=entry, source="api", now=ctx.clock())
        changes_repo.record(
            conn, actor=info.actor, kind="owner", name=f"user/{person.user}",
            action="create" if old is None else "update", now=ctx.clock(),
        )  # fmt: skip
        return _channel_of(entry)


@router.delete("/people/{user}", status_code=status.HTTP_204_NO_CONTENT)
def sign_person_out(
    ctx: Ctx, token: Admin, user: str = PathParam(min_length=1, max_length=255)
) -> None:
    """End every console session of the person ``user`` (within the token cache time, on every
    replica): for someone who left a team or the site; their next sign-in is decided anew by
    the identity provider. Their personal tokens are revoked with them."""
    now = ctx.clock()
    with ctx.engine.begin() as conn:
        until = now + timedelta(seconds=ctx.settings.console_session_seconds)
        sessions_repo.end_person_sessions(conn, user=user, until=until, now=now)
        for t in _own_tokens(conn, user):
            tokens_repo.revoke_token(conn, token_id=t.id, now=now)
        changes_repo.record(
            conn, actor=token.actor, kind="sessions", name=f"user/{user}", action="delete", now=now
        )
