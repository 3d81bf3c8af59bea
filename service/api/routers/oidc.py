"""``/api/v1/auth/oidc``: single sign-on for the console through the site's OpenID provider.

``login`` sends the browser to the provider (authorization code with PKCE); ``callback`` takes
the code back, checks the ID token and gives the person the same session cookie a token login
gives (HttpOnly, SameSite=Strict, Secure behind TLS, CSRF token, ended by logging out).
"""

from __future__ import annotations

import hmac
import time

import httpx
from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.responses import RedirectResponse

from service.api import oidc, sessions
from service.api.deps import AppState, Ctx, signing_key
from service.api.oidc import OidcClient, SignInRefused

router = APIRouter(prefix="/auth/oidc", tags=["session"])
_COOKIE_PATH = "/api/v1/auth/oidc"


def _client(app_state: AppState) -> OidcClient:
    if app_state.oidc is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            detail="single sign-on is not set up (GPUWARDEN_OIDC_ISSUER); log in with a token",
        )
    return app_state.oidc


@router.get("/login", status_code=status.HTTP_302_FOUND, response_class=RedirectResponse)
async def oidc_login(
    request: Request,
    ctx: Ctx,
    app_state: AppState,
    next: str = Query("/", max_length=2048, description="the console path to open after"),
) -> RedirectResponse:
    """Send the browser to the identity provider to sign in; it comes back to the callback."""
    client = _client(app_state)
    login = oidc.new_login(next_path=next, now=ctx.clock().timestamp())
    try:
        url = await client.authorization_url(login)
    except (SignInRefused, httpx.HTTPError, OSError, ValueError) as exc:
        raise HTTPException(
            status.HTTP_502_BAD_GATEWAY, detail=f"the identity provider is unreachable: {exc}"
        ) from exc
    response = RedirectResponse(url, status_code=status.HTTP_302_FOUND)
    response.set_cookie(
        oidc.LOGIN_COOKIE,
        oidc.encode_login(login, key=await signing_key(ctx)),
        max_age=oidc.LOGIN_SECONDS,
        path=_COOKIE_PATH,
        httponly=True,
        # Lax, not Strict: the provider's redirect back is a cross-site navigation.
        samesite="lax",
        secure=app_state.gate.https(request),
    )
    response.headers["Cache-Control"] = "no-store"
    return response


@router.get("/callback", status_code=status.HTTP_303_SEE_OTHER, response_class=RedirectResponse)
async def oidc_callback(
    request: Request,
    ctx: Ctx,
    app_state: AppState,
    code: str | None = Query(None, max_length=4096),
    state: str | None = Query(None, max_length=512),
    iss: str | None = Query(None, max_length=2048, description="RFC 9207: the issuer"),
    session_state: str | None = Query(None, max_length=512),
    error: str | None = Query(None, max_length=256),
    error_description: str | None = Query(None, max_length=1024),
    error_uri: str | None = Query(None, max_length=2048),
) -> RedirectResponse:
    """Finish a sign-in: check the state, exchange the code, check the ID token (signature,
    issuer, audience, expiry, nonce), then set the console's session cookie naming the person."""
    client = _client(app_state)
    key = await signing_key(ctx)
    now = ctx.clock().timestamp()
    login = oidc.decode_login(request.cookies.get(oidc.LOGIN_COOKIE, ""), key=key, now=now)
    if login is None:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST,
            detail="state: no sign-in in progress, or it lapsed; start at /api/v1/auth/oidc/login",
        )
    if state is None or not hmac.compare_digest(state, login.state):
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, detail="state: does not match this sign-in"
        )
    if error is not None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail=f"error: the identity provider said {error}: {error_description or ''}".strip(),
        )
    if iss is not None and iss.rstrip("/") != client.config.issuer:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, detail="iss: another issuer answered")
    if code is None:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, detail="code: missing")
    try:
        # The ID token's times are the provider's wall clock, whatever clock the service runs.
        person = await client.sign_in(code=code, login=login, now=time.time())
    except SignInRefused as exc:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, detail=str(exc)) from exc
    except (httpx.HTTPError, OSError, ValueError) as exc:
        raise HTTPException(
            status.HTTP_502_BAD_GATEWAY, detail=f"the identity provider is unreachable: {exc}"
        ) from exc
    lifetime = ctx.settings.console_session_seconds
    session = sessions.person_session(person=person, now=now, lifetime_seconds=lifetime)
    secure = app_state.gate.https(request)
    response = RedirectResponse(login.next_path, status_code=status.HTTP_303_SEE_OTHER)
    sessions.set_cookie(response, session, key=key, lifetime_seconds=lifetime, secure=secure)
    response.delete_cookie(
        oidc.LOGIN_COOKIE, path=_COOKIE_PATH, httponly=True, samesite="lax", secure=secure
    )
    response.headers["Cache-Control"] = "no-store"
    return response
