"""A real OpenID provider on loopback (node-oidc-provider, tests/js/oidc_provider.mjs) and the
sign-in a person's browser makes through it, for the single sign-on tests."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx
import pytest

from tests.support import free_port

JS = Path(__file__).resolve().parent / "js"
SCRIPT = JS / "oidc_provider.mjs"
CALLBACK_PATH = "/api/v1/auth/oidc/callback"
CLIENT_ID = "gpuwarden"
CLIENT_SECRET = "gpuwarden-secret"
OTHER_CLIENT_ID = "other-app"
OTHER_CLIENT_SECRET = "other-secret"
# The groups the provider's people carry that mean fleet-reader and admin.
READER_GROUP = "gpuwarden-readers"
ADMIN_GROUP = "gpuwarden-admins"


@dataclass(frozen=True, slots=True)
class Provider:
    """A running provider: its issuer URL and the redirect URI its clients are registered with."""

    issuer: str
    redirect_uri: str


def password(login: str) -> str:
    """The provider's password of ``login`` (the script's rule)."""
    return f"pw-{login}"


@contextmanager
def oidc_provider(app_url: str) -> Iterator[Provider]:
    """Run tests/js/oidc_provider.mjs on a free loopback port for the app at ``app_url``; stopped
    after. Missing node or oidc-provider fails under CI and skips elsewhere."""
    node = shutil.which("node")
    if node is None or not (JS / "node_modules" / "oidc-provider").is_dir():
        why = "node and tests/js/node_modules/oidc-provider are needed (scripts/test-services.sh)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    port = free_port()
    redirect_uri = app_url + CALLBACK_PATH
    proc = subprocess.Popen(
        [node, str(SCRIPT), str(port), redirect_uri],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("ready "):
            proc.kill()
            _, err = proc.communicate(timeout=10)
            raise RuntimeError(f"the OpenID provider did not start: {line!r} {err[-2000:]}")
        yield Provider(issuer=line.split()[1], redirect_uri=redirect_uri)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


_FORM_ACTION = re.compile(r'<form method="post" action="([^"]+)"')


def sign_in(client: httpx.Client, login: str, *, pw: str | None = None) -> httpx.Response:
    """Sign ``login`` in to the app behind ``client`` (base URL set) as a browser would: the
    app's login redirect, the provider's form, the code back to the app's callback, each redirect
    followed; returns the last response (the console after a sign-in). Someone still signed
    in at the provider comes straight back, as in a browser."""
    page = client.get("/api/v1/auth/oidc/login", follow_redirects=True)
    assert page.status_code == 200, page.text
    action = _FORM_ACTION.search(page.text)
    if action is None and "/interaction/" not in str(page.url):
        return page  # still signed in at the provider: it sent the code back at once
    assert action is not None, page.text
    return client.post(
        urljoin(str(page.url), action.group(1)),
        data={"login": login, "password": password(login) if pw is None else pw},
        follow_redirects=True,
    )


def id_token_for(provider: Provider, login: str, *, client_id: str, secret: str, nonce: str) -> str:
    """A real ID token the provider issues to ``client_id`` for ``login``: the authorization
    code flow with PKCE driven by hand, the code taken from the redirect instead of the app."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=")
    params = {
        "client_id": client_id, "response_type": "code", "scope": "openid profile email groups",
        "redirect_uri": provider.redirect_uri, "state": "s", "nonce": nonce,
        "code_challenge": challenge.decode(), "code_challenge_method": "S256",
    }  # fmt: skip
    with httpx.Client(base_url=provider.issuer, timeout=30) as idp:
        page = idp.get("/auth", params=params, follow_redirects=True)
        action = _FORM_ACTION.search(page.text)
        assert action is not None, page.text
        r = idp.post(action.group(1), data={"login": login, "password": password(login)})
        while r.is_redirect and not r.headers["location"].startswith(provider.redirect_uri):
            r = idp.get(urljoin(str(r.url), r.headers["location"]))
        assert r.is_redirect, r.text
        code = parse_qs(urlsplit(r.headers["location"]).query)["code"][0]
        tokens = idp.post(
            "/token",
            data={"grant_type": "authorization_code", "code": code, "code_verifier": verifier,
                  "redirect_uri": provider.redirect_uri},
            auth=(client_id, secret),
        )  # fmt: skip
        assert tokens.status_code == 200, tokens.text
        return str(tokens.json()["id_token"])
