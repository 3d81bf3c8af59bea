"""Console sessions: a signed cookie that names a token, and the CSRF token bound to it.

The cookie holds ``payload.signature`` (URL-safe base64, no padding). The payload names the
token (its id and the first characters of its stored hash) rather than carrying it, so every
request re-checks the token: revoking it ends the session within the token cache time. A person
signed in through the identity provider (OpenID Connect) has a session that names them instead
(user, teams, role), signed the same way; logging out ends either kind on every replica. The
signing key is kept in the database, so every replica accepts every replica's cookies.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass

from starlette.responses import Response

from service.roles import Person, Role

COOKIE_NAME = "gw_session"
CSRF_HEADER = "X-CSRF-Token"
SECRET_NAME = "console_session_key"
# Methods that change nothing; any other method made with the cookie needs the CSRF header.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_HASH_CHARS = 16


@dataclass(frozen=True, slots=True)
class Session:
    """What a valid cookie says: which token (or person), until when (Unix seconds), and its
    CSRF nonce."""

    token_id: int
    token_hash_prefix: str
    expires_at: float
    nonce: str
    person: Person | None = None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: str, label: bytes, data: bytes) -> bytes:
    return hmac.new(key.encode(), label + b"|" + data, hashlib.sha256).digest()


def new_session(*, token_id: int, token_hash: str, now: float, lifetime_seconds: float) -> Session:
    """A fresh session for the token ``token_id`` (stored hash ``token_hash``), expiring later."""
    return Session(
        token_id=token_id,
        token_hash_prefix=token_hash[:_HASH_CHARS],
        expires_at=now + lifetime_seconds,
        nonce=secrets.token_urlsafe(16),
    )


def person_session(*, person: Person, now: float, lifetime_seconds: float) -> Session:
    """A fresh session for ``person``, signed in through the identity provider."""
    return Session(
        token_id=0,
        token_hash_prefix="",
        expires_at=now + lifetime_seconds,
        nonce=secrets.token_urlsafe(16),
        person=person,
    )


def encode(session: Session, *, key: str) -> str:
    """The cookie value of ``session``, signed with ``key``."""
    data: dict[str, object] = {
        "t": session.token_id,
        "h": session.token_hash_prefix,
        "e": session.expires_at,
        "n": session.nonce,
    }
    if session.person is not None:
        p = session.person
        data["p"] = {"u": p.user, "g": list(p.teams), "r": p.role.value, "f": p.fleet,
                     "m": p.email}  # fmt: skip
    payload = json.dumps(data, separators=(",", ":")).encode()
    return _b64(payload) + "." + _b64(_mac(key, b"session", payload))


def set_cookie(
    response: Response, session: Session, *, key: str, lifetime_seconds: float, secure: bool
) -> None:
    """Give ``response`` the session cookie: signed, HttpOnly, SameSite=Strict, site-wide."""
    response.set_cookie(
        COOKIE_NAME,
        encode(session, key=key),
        max_age=int(lifetime_seconds),
        path="/",
        httponly=True,
        samesite="strict",
        secure=secure,
    )


def decode(value: str, *, key: str, now: float) -> Session | None:
    """The session of cookie ``value``, or None when it is malformed, forged or expired."""
    body, _, signature = value.partition(".")
    try:
        payload = _unb64(body)
        if not hmac.compare_digest(_unb64(signature), _mac(key, b"session", payload)):
            return None
        data = json.loads(payload)
        p = data.get("p")
        person = (
            None
            if p is None
            else Person(
                user=str(p["u"]),
                teams=tuple(str(t) for t in p["g"]),
                role=Role(p["r"]),
                fleet=bool(p["f"]),
                email=None if p.get("m") is None else str(p["m"]),
            )
        )
        session = Session(
            token_id=int(data["t"]),
            token_hash_prefix=str(data["h"]),
            expires_at=float(data["e"]),
            nonce=str(data["n"]),
            person=person,
        )
    except (ValueError, KeyError, TypeError):
        return None
    return session if session.expires_at > now else None


def matches_token(session: Session, token_hash: str) -> bool:
    """Whether ``session`` was made for the token whose stored hash is ``token_hash``."""
    return hmac.compare_digest(session.token_hash_prefix, token_hash[:_HASH_CHARS])


def csrf_token(session: Session, *, key: str) -> str:
    """The CSRF token of ``session``: only a page that read it from the API can send it."""
    return _b64(_mac(key, b"csrf", session.nonce.encode()))


def csrf_ok(session: Session, sent: str | None, *, key: str) -> bool:
    """Whether ``sent`` (the request's CSRF header) is the CSRF token of ``session``."""
    return sent is not None and hmac.compare_digest(sent, csrf_token(session, key=key))
