"""Single sign-on: the OpenID provider's discovery and keys, the authorization request with PKCE
and the code exchange (Authlib's client, run off the event loop), the ID token's checks
(joserfc) and the person its claims name.

The browser's round trip carries its state, nonce and PKCE verifier in a short-lived signed,
HttpOnly cookie, so any replica can finish a sign-in another replica began.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from authlib.integrations.requests_client import OAuth2Session
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from service.roles import Person, Role
from service.settings import Settings

CALLBACK_PATH = "/api/v1/auth/oidc/callback"
LOGIN_COOKIE = "gw_oidc"
LOGIN_SECONDS = 600  # how long a sign-in may take at the provider
# Asymmetric algorithms only: an HS256 ID token would be signed with the client secret.
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512",
              "EdDSA")  # fmt: skip
LEEWAY_SECONDS = 60  # clock skew allowed on exp, iat and nbf
METADATA_SECONDS = 3600.0  # how long discovery and keys are kept before they are read again


class SignInRefused(Exception):
    """Why a sign-in is refused: a bad callback, or an ID token that fails a check."""


def _csv(text: str) -> frozenset[str]:
    return frozenset(p.strip() for p in text.split(",") if p.strip())


@dataclass(frozen=True, slots=True)
class OidcConfig:
    """The identity provider and the claims to read, from the GPUWARDEN_OIDC_* settings."""

    issuer: str
    client_id: str
    client_secret: str | None
    scopes: str
    user_claim: str
    groups_claim: str
    reader_groups: frozenset[str]
    admin_groups: frozenset[str]
    team_prefix: str
    redirect_uri: str

    @classmethod
    def from_settings(cls, settings: Settings) -> OidcConfig | None:
        """The configuration, or None while GPUWARDEN_OIDC_ISSUER is unset (tokens only)."""
        if not settings.oidc_issuer:
            return None
        redirect = settings.oidc_redirect_url or settings.public_url.rstrip("/") + CALLBACK_PATH
        return cls(
            issuer=settings.oidc_issuer.rstrip("/"),
            client_id=settings.oidc_client_id,
            client_secret=settings.oidc_client_secret or None,
            scopes=settings.oidc_scopes,
            user_claim=settings.oidc_user_claim,
            groups_claim=settings.oidc_groups_claim,
            reader_groups=_csv(settings.oidc_reader_groups),
            admin_groups=_csv(settings.oidc_admin_groups),
            team_prefix=settings.oidc_team_prefix,
            redirect_uri=redirect,
        )


@dataclass(frozen=True, slots=True)
class LoginState:
    """One sign-in in flight: its state, nonce, PKCE verifier, the console path to open after,
    and when it lapses (Unix seconds)."""

    state: str
    nonce: str
    verifier: str
    next_path: str
    expires_at: float


# A console path to return to: one leading slash, plain characters; no backslash, no "//", no
# dot segments and no encoded slash, so a browser cannot read it as another origin.
_SAFE_NEXT = re.compile(r"/[A-Za-z0-9_\-./:%?=&]*")


def safe_next(path: str) -> str:
    """``path`` when it is a plain path of this site, else ``/``."""
    lowered = path.lower()
    if (
        not _SAFE_NEXT.fullmatch(path)
        or "//" in path
        or ".." in path
        or "%2f" in lowered
        or "%5c" in lowered
    ):
        return "/"
    return path


def new_login(*, next_path: str, now: float) -> LoginState:
    """A fresh sign-in that returns to ``next_path`` (a path of this site, else ``/``)."""
    safe = safe_next(next_path)
    return LoginState(
        state=secrets.token_urlsafe(24),
        nonce=secrets.token_urlsafe(24),
        verifier=secrets.token_urlsafe(48),
        next_path=safe,
        expires_at=now + LOGIN_SECONDS,
    )


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _mac(key: str, data: bytes) -> bytes:
    return hmac.new(key.encode(), b"oidc-login|" + data, hashlib.sha256).digest()


def encode_login(login: LoginState, *, key: str) -> str:
    """The login cookie's value: the sign-in's state, signed with the session key."""
    payload = json.dumps(
        [login.state, login.nonce, login.verifier, login.next_path, login.expires_at],
        separators=(",", ":"),
    ).encode()
    return _b64(payload) + "." + _b64(_mac(key, payload))


def decode_login(value: str, *, key: str, now: float) -> LoginState | None:
    """The sign-in of login cookie ``value``, or None when it is missing, forged or lapsed."""
    body, _, signature = value.partition(".")
    try:
        payload = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        sent = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
        if not hmac.compare_digest(sent, _mac(key, payload)):
            return None
        state, nonce, verifier, next_path, expires_at = json.loads(payload)
        login = LoginState(str(state), str(nonce), str(verifier), str(next_path), float(expires_at))
    except (ValueError, TypeError):
        return None
    return login if login.expires_at > now else None


def validate_id_token(
    id_token: str, *, keys: KeySet, issuer: str, client_id: str, nonce: str, now: float
) -> dict[str, Any]:
    """The claims of ``id_token`` once its signature (by one of ``keys``), issuer, audience,
    expiry, issue time and nonce pass OpenID Connect Core 3.1.3.7; SignInRefused else."""
    try:
        token = jwt.decode(id_token, keys, algorithms=list(ALGORITHMS))
    except (JoseError, ValueError) as exc:
        raise SignInRefused(f"id_token: not signed by the provider's keys ({exc})") from exc
    claims = dict(token.claims)
    registry = jwt.JWTClaimsRegistry(
        now=int(now),
        leeway=LEEWAY_SECONDS,
        iss={"essential": True, "value": issuer},
        aud={"essential": True, "value": client_id},
        sub={"essential": True},
        exp={"essential": True},
        iat={"essential": True},
        nonce={"essential": True, "value": nonce},
    )
    try:
        registry.validate(claims)
    except JoseError as exc:
        raise SignInRefused(f"id_token: {exc.description or exc.error}") from exc
    audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
    if len(audiences) > 1 and claims.get("azp") != client_id:
        raise SignInRefused("id_token: azp: the token was issued to another client")
    return claims


def person_of(claims: Mapping[str, Any], config: OidcConfig) -> Person:
    """The person an ID token's claims name: the user claim, and teams and role from the groups
    claim (admin and fleet-reader groups are roles, the other groups teams); SignInRefused
    when the user claim is missing."""
    user = claims.get(config.user_claim)
    if not isinstance(user, str) or not user.strip():
        raise SignInRefused(
            f"id_token: no {config.user_claim!r} claim names the user (GPUWARDEN_OIDC_USER_CLAIM)"
        )
    raw = claims.get(config.groups_claim) or []
    groups = [raw] if isinstance(raw, str) else [str(g) for g in raw if isinstance(g, str)]
    admin = any(g in config.admin_groups for g in groups)
    fleet = admin or any(g in config.reader_groups for g in groups)
    roles = config.admin_groups | config.reader_groups
    prefix = config.team_prefix
    teams = sorted(
        {
            g[len(prefix) :]
            for g in groups
            if g not in roles and g.startswith(prefix) and g != prefix
        }
    )
    email = claims.get("email")
    verified = claims.get("email_verified", True) is not False
    return Person(
        user=user.strip(), teams=tuple(teams), role=Role.ADMIN if admin else Role.READER,
        fleet=fleet, email=email if isinstance(email, str) and verified else None,
    )  # fmt: skip


class OidcClient:
    """The relying party: discovery and keys read once an hour (keys again at once when a token
    names an unknown one), the authorization URL and the code exchange."""

    def __init__(self, config: OidcConfig, *, timeout_seconds: float = 10.0) -> None:
        self.config = config
        self.timeout_seconds = timeout_seconds
        self._metadata: tuple[dict[str, Any], float] | None = None
        self._keys: tuple[KeySet, float] | None = None
        self._lock = asyncio.Lock()

    async def metadata(self) -> dict[str, Any]:
        """The provider's discovery document, its issuer checked against the setting."""
        if self._metadata is not None and time.monotonic() - self._metadata[1] < METADATA_SECONDS:
            return self._metadata[0]
        url = self.config.issuer + "/.well-known/openid-configuration"
        async with httpx.AsyncClient(timeout=self.timeout_seconds) as http:
            response = await http.get(url)
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        if str(data.get("issuer", "")).rstrip("/") != self.config.issuer:
            raise SignInRefused(
                f"the provider at {url} says its issuer is {data.get('issuer')!r}, not "
                f"{self.config.issuer!r} (GPUWARDEN_OIDC_ISSUER)"
            )
        self._metadata = (data, time.monotonic())
        return data

    async def keys(self, *, fresh: bool = False) -> KeySet:
        """The provider's signing keys (its JWKS), read again when ``fresh`` or an hour old."""
        async with self._lock:
            cached = self._keys
            if not fresh and cached is not None and time.monotonic() - cached[1] < METADATA_SECONDS:
                return cached[0]
            uri = (await self.metadata())["jwks_uri"]
            async with httpx.AsyncClient(timeout=self.timeout_seconds) as http:
                response = await http.get(uri)
            response.raise_for_status()
            keys = KeySet.import_key_set(response.json())
            self._keys = (keys, time.monotonic())
            return keys

    def _client(self) -> OAuth2Session:
        return OAuth2Session(
            client_id=self.config.client_id,
            client_secret=self.config.client_secret,
            scope=self.config.scopes,
            redirect_uri=self.config.redirect_uri,
            code_challenge_method="S256",
            token_endpoint_auth_method=(
                "client_secret_basic" if self.config.client_secret else "none"
            ),
        )

    async def authorization_url(self, login: LoginState) -> str:
        """Where to send the browser: the provider's authorization endpoint with the state,
        nonce and PKCE challenge of ``login``."""
        endpoint = (await self.metadata())["authorization_endpoint"]
        with self._client() as client:
            url, _ = client.create_authorization_url(
                endpoint, state=login.state, code_verifier=login.verifier, nonce=login.nonce
            )
        return str(url)

    async def sign_in(self, *, code: str, login: LoginState, now: float) -> Person:
        """Exchange ``code`` (with the PKCE verifier) for tokens, check the ID token and return
        the person it names; SignInRefused when the provider or a check says no."""
        endpoint = (await self.metadata())["token_endpoint"]

        def exchange() -> dict[str, Any]:
            with self._client() as client:
                token: dict[str, Any] = client.fetch_token(
                    endpoint, grant_type="authorization_code", code=code,
                    code_verifier=login.verifier, timeout=self.timeout_seconds,
                )  # fmt: skip
                return token

        try:
            tokens = await anyio.to_thread.run_sync(exchange)
        except Exception as exc:  # Authlib raises its OAuthError, requests its own errors
            raise SignInRefused(f"code: the provider refused the code ({exc})") from exc
        id_token = tokens.get("id_token")
        if not isinstance(id_token, str):
            raise SignInRefused("the provider's answer carries no id_token (scope openid?)")
        return await self.person_from_id_token(id_token, nonce=login.nonce, now=now)

    async def person_from_id_token(self, id_token: str, *, nonce: str, now: float) -> Person:
        """The person ``id_token`` names once it passes every check; keys read again once if
        the signature fails (the provider may have rotated them)."""
        check = {"issuer": self.config.issuer, "client_id": self.config.client_id}
        try:
            claims = validate_id_token(
                id_token, keys=await self.keys(), nonce=nonce, now=now, **check
            )
        except SignInRefused as exc:
            if "not signed" not in str(exc):
                raise
            claims = validate_id_token(
                id_token, keys=await self.keys(fresh=True), nonce=nonce, now=now, **check
            )
        return person_of(claims, self.config)
