"""API tokens: created once and shown once, stored only as a SHA-256 hash."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, func, insert, select, update

from service.db.schema import api_tokens
from service.errors import NotFound, ValidationFailed
from service.roles import JobScope, Person
from service.roles import Role as Role  # where callers have always found it

TOKEN_PREFIX = "gw_"


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A stored token, without its secret."""

    id: int
    name: str | None
    role: Role
    node: str | None
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None
    # Set for a person signed in through the identity provider (no stored token: id 0).
    person: Person | None = None

    @property
    def scope(self) -> JobScope | None:
        """The jobs this caller may see: a person's, or None (every job) for a token."""
        return None if self.person is None else self.person.scope

    @property
    def actor(self) -> str:
        """Who acts, for the audit: ``person:alice`` or ``token:<name or prefix>``."""
        if self.person is not None:
            return f"person:{self.person.user}"
        return f"token:{self.name or self.prefix}"


def person_info(person: Person, *, now: datetime) -> TokenInfo:
    """The caller record of a signed-in ``person``: no stored token stands behind it."""
    return TokenInfo(0, f"person {person.user}", person.role, None, "person", now, None, None,
                     person)  # fmt: skip


def hash_token(token: str) -> str:
    """The hex SHA-256 of ``token``; tokens carry 256 random bits, so no slow hash is needed."""
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(
    conn: Connection,
    *,
    role: Role,
    node: str | None,
    name: str | None,
    now: datetime,
    person: Person | None = None,
) -> tuple[str, TokenInfo]:
    """Create a token and return (the secret, shown only now; its stored record); with
    ``person``, a personal token that sees what that person sees."""
    if role is Role.AGENT and not node:
        raise ValidationFailed("node", "an agent token must name the node it writes for")
    if role is not Role.AGENT and node:
        raise ValidationFailed("node", "only agent tokens are tied to a node")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    prefix = secret[: len(TOKEN_PREFIX) + 6]
    token_id = conn.execute(
        insert(api_tokens)
        .values(
            name=name,
            role=role.value,
            node=node,
            token_hash=hash_token(secret),
            prefix=prefix,
            created_at=now,
            person=None if person is None else _person_json(person),
        )
        .returning(api_tokens.c.id)
    ).scalar_one()
    info = TokenInfo(token_id, name, role, node, prefix, now, None, None, person)
    return secret, info


def _person_json(person: Person) -> dict[str, object]:
    return {"user": person.user, "teams": list(person.teams), "fleet": person.fleet,
            "email": person.email}  # fmt: skip


def _info(row: object) -> TokenInfo:
    r = row._mapping  # type: ignore[attr-defined]
    p = r["person"]
    person = (
        None
        if p is None
        else Person(
            user=str(p["user"]), teams=tuple(str(t) for t in p["teams"]), role=Role(r["role"]),
            fleet=bool(p["fleet"]), email=p.get("email"),
        )
    )  # fmt: skip
    return TokenInfo(
        r["id"],
        r["name"],
        Role(r["role"]),
        r["node"],
        r["prefix"],
        r["created_at"],
        r["last_used_at"],
        r["revoked_at"],
        person,
    )


def authenticate(conn: Connection, *, token: str) -> TokenInfo | None:
    """The live token matching ``token``, or None; the hash comparison is constant-time."""
    digest = hash_token(token)
    row = conn.execute(
        select(api_tokens).where(
            api_tokens.c.token_hash == digest, api_tokens.c.revoked_at.is_(None)
        )
    ).first()
    if row is None or not hmac.compare_digest(row.token_hash, digest):
        return None
    return _info(row)


def revoked_count(conn: Connection) -> int:
    """How many tokens have been revoked (tokens are never deleted, so it only grows)."""
    query = select(func.count()).select_from(api_tokens).where(api_tokens.c.revoked_at.is_not(None))
    return int(conn.execute(query).scalar_one())


def live_token_by_id(conn: Connection, *, token_id: int) -> tuple[TokenInfo, str] | None:
    """The live (unrevoked) token with ``token_id`` and its stored hash, or None."""
    row = conn.execute(
        select(api_tokens).where(api_tokens.c.id == token_id, api_tokens.c.revoked_at.is_(None))
    ).first()
    return None if row is None else (_info(row), str(row.token_hash))


def list_tokens(conn: Connection) -> list[TokenInfo]:
    """Every token, revoked ones included, oldest first."""
    return [_info(r) for r in conn.execute(select(api_tokens).order_by(api_tokens.c.id))]


def revoke_token(conn: Connection, *, token_id: int, now: datetime) -> TokenInfo:
    """Revoke the token with ``token_id`` (idempotent) and return it."""
    row = conn.execute(select(api_tokens).where(api_tokens.c.id == token_id)).first()
    if row is None:
        raise NotFound(f"no token with id {token_id}")
    if row.revoked_at is None:
        conn.execute(update(api_tokens).where(api_tokens.c.id == token_id).values(revoked_at=now))
    return _info(conn.execute(select(api_tokens).where(api_tokens.c.id == token_id)).one())
