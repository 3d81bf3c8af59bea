"""The console's login, session cookie, CSRF check, page headers and offline /docs and /redoc.

Real uvicorn on loopback, real SQLite and PostgreSQL: a token becomes an HttpOnly,
SameSite=Strict cookie signed with a key kept in the database, so another replica accepts it;
revoking the token ends the session; writes with the cookie need the CSRF header while bearer
clients go on as before.
"""

from __future__ import annotations

import base64
import hashlib
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import Engine, select

from service.api import deps
from service.api.app import create_app
from service.db import tokens_repo
from service.db.schema import service_secrets
from service.settings import Settings
from tests.support import FakeClock, live_server

SILENCE = {"matchers": {"node": "n1"}, "comment": "maintenance"}


def _silence(clock: FakeClock) -> dict[str, object]:
    return {**SILENCE, "ends_at": (clock() + timedelta(hours=1)).isoformat()}


@contextmanager
def _login(base: str, token: str) -> Iterator[tuple[httpx.Client, dict[str, object]]]:
    with httpx.Client(base_url=base, timeout=30) as client:
        r = client.post("/api/v1/session", json={"token": token})
        assert r.status_code == 200, r.text
        yield client, r.json()


def test_login_sets_an_httponly_strict_cookie_that_reads_the_api(
    server: str, tokens: dict[str, str]
) -> None:
    with httpx.Client(base_url=server) as anonymous:
        assert anonymous.get("/api/v1/gpus").status_code == 401
        r = anonymous.post("/api/v1/session", json={"token": tokens["reader"]})
    assert r.status_code == 200
    cookie = r.headers["set-cookie"]
    assert cookie.startswith("gw_session=")
    for attribute in ("HttpOnly", "SameSite=strict", "Path=/", "Max-Age=43200"):
        assert attribute.lower() in cookie.lower(), cookie
    assert tokens["reader"] not in cookie  # the cookie names the token, never carries it
    assert r.json()["role"] == "reader" and r.json()["csrf_token"]

    with _login(server, tokens["reader"]) as (client, _):
        assert client.get("/api/v1/gpus").status_code == 200
        who = client.get("/api/v1/session").json()
        assert who["role"] == "reader" and who["csrf_token"]


def test_agent_and_unknown_tokens_cannot_log_in(server: str, tokens: dict[str, str]) -> None:
    with httpx.Client(base_url=server) as client:
        assert client.post("/api/v1/session", json={"token": tokens["agent"]}).status_code == 403
        assert client.post("/api/v1/session", json={"token": "gw_nope"}).status_code == 401
        r = client.post("/api/v1/session", json={"tokn": tokens["admin"]})
        assert r.status_code == 422 and "token" in r.text
        # A login posted from another site's page is refused even with a good token.
        r = client.post(
            "/api/v1/session",
            json={"token": tokens["admin"]},
            headers={"Origin": "https://evil.example"},
        )
        assert r.status_code == 403


def test_writes_with_the_cookie_need_the_csrf_token_and_bearer_clients_do_not(
    server: str, tokens: dict[str, str], clock: FakeClock
) -> None:
    with _login(server, tokens["admin"]) as (client, who):
        r = client.post("/api/v1/silences", json=_silence(clock))
        assert r.status_code == 403 and "X-CSRF-Token" in r.text
        r = client.post(
            "/api/v1/silences", json=_silence(clock), headers={"X-CSRF-Token": "forged"}
        )
        assert r.status_code == 403
        r = client.post(
            "/api/v1/silences",
            json=_silence(clock),
            headers={"X-CSRF-Token": str(who["csrf_token"])},
        )
        assert r.status_code == 201, r.text
        silence_id = r.json()["id"]
        assert client.delete(f"/api/v1/silences/{silence_id}").status_code == 403
        r = client.delete(
            f"/api/v1/silences/{silence_id}", headers={"X-CSRF-Token": str(who["csrf_token"])}
        )
        assert r.status_code == 204
    with httpx.Client(base_url=server) as bearer:
        r = bearer.post(
            "/api/v1/silences",
            json=_silence(clock),
            headers={"Authorization": f"Bearer {tokens['admin']}"},
        )
        assert r.status_code == 201


def test_a_reader_session_has_the_readers_rights_only(
    server: str, tokens: dict[str, str], clock: FakeClock
) -> None:
    with _login(server, tokens["reader"]) as (client, who):
        r = client.post(
            "/api/v1/silences",
            json=_silence(clock),
            headers={"X-CSRF-Token": str(who["csrf_token"])},
        )
        assert r.status_code == 403 and "reader" in r.text


def test_revoking_the_token_ends_the_session(
    server: str, tokens: dict[str, str], engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deps, "TOKEN_CACHE_SECONDS", 0.2)
    with _login(server, tokens["reader"]) as (client, who):
        assert client.get("/api/v1/gpus").status_code == 200
        with engine.begin() as conn:
            tokens_repo.revoke_token(conn, token_id=int(str(who["token_id"])), now=FakeClock()())
        time.sleep(0.3)
        r = client.get("/api/v1/gpus")
        assert r.status_code == 401 and "log in again" in r.text


def test_the_session_expires_and_a_forged_cookie_is_refused(
    engine: Engine, tokens: dict[str, str]
) -> None:
    clock = FakeClock()
    settings = Settings(
        database_url=engine.url.render_as_string(hide_password=False),
        run_scheduler=False,
        console_session_seconds=600,
    )
    with (
        live_server(create_app(settings, engine=engine, clock=clock)) as base,
        _login(base, tokens["reader"]) as (client, _),
    ):
        cookie = client.cookies["gw_session"]
        body, _, signature = cookie.partition(".")
        forged = body[:-2] + ("AA" if body[-2:] != "AA" else "BB") + "." + signature
        with httpx.Client(base_url=base, cookies={"gw_session": forged}) as other:
            assert other.get("/api/v1/gpus").status_code == 401
        assert client.get("/api/v1/gpus").status_code == 200
        clock.advance(601)
        assert client.get("/api/v1/gpus").status_code == 401


def test_another_replica_on_the_same_database_accepts_the_session(
    engine: Engine, settings: Settings, tokens: dict[str, str]
) -> None:
    with (
        live_server(create_app(settings, engine=engine)) as first,
        _login(first, tokens["reader"]) as (client, _),
    ):
        cookie = client.cookies["gw_session"]
    with engine.connect() as conn:
        keys = conn.execute(select(service_secrets.c.name)).scalars().all()
    assert keys == ["console_session_key"]
    with (
        live_server(create_app(settings, engine=engine)) as second,
        httpx.Client(base_url=second, cookies={"gw_session": cookie}) as other,
    ):
        assert other.get("/api/v1/gpus").status_code == 200


@pytest.mark.parametrize(
    "path", ["/", "/jobs", "/jobs/slurm:42", "/costs", "/alerts", "/actions", "/login"]
)
def test_console_pages_carry_a_strict_csp_and_security_headers(
    http: httpx.Client, path: str
) -> None:
    r = http.get(path, params={"next": "/jobs"} if path == "/login" else None)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    script_src = re.search(r"script-src ([^;]*)", csp).group(1)  # type: ignore[union-attr]
    assert script_src.strip() == "'self'"
    assert "frame-ancestors 'none'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["x-frame-options"] == "DENY"
    assert "<script>" not in r.text  # no inline script at all
    for src in re.findall(r"(?:src|href)=\"([^\"]+)\"", r.text):
        assert src.startswith("/"), src  # nothing from another host
        assert http.get(src).status_code == 200, src


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_api_docs_load_only_local_files_and_allow_their_bootstrap_by_hash(
    http: httpx.Client, path: str
) -> None:
    r = http.get(path)
    assert r.status_code == 200
    assert "cdn" not in r.text and "https://" not in r.text
    (inline,) = re.findall(r"<script>(.*?)</script>", r.text, re.S)
    digest = base64.b64encode(hashlib.sha256(inline.encode()).digest()).decode()
    script_src = re.search(
        r"script-src ([^;]*)",
        r.headers["content-security-policy"],
    ).group(1)  # type: ignore[union-attr]
    assert script_src.split() == ["'self'", f"'sha256-{digest}'"]
    for src in re.findall(r"(?:src|href)='([^']+)'", r.text):
        asset = http.get(src)
        assert asset.status_code == 200 and asset.content, src


def test_logout_ends_the_session_on_every_replica(
    engine: Engine, settings: Settings, tokens: dict[str, str]
) -> None:
    with (
        live_server(create_app(settings, engine=engine)) as first,
        live_server(create_app(settings, engine=engine)) as second,
    ):
        with _login(first, tokens["reader"]) as (client, who):
            copied = client.cookies["gw_session"]
            with httpx.Client(base_url=second, cookies={"gw_session": copied}) as thief:
                assert thief.get("/api/v1/gpus").status_code == 200
            r = client.delete("/api/v1/session", headers={"X-CSRF-Token": str(who["csrf_token"])})
            assert r.status_code == 204
        # The copied cookie stops working at once on the replica that logged out, and on the
        # other once its cache time has passed.
        with httpx.Client(base_url=first, cookies={"gw_session": copied}) as thief:
            r = thief.get("/api/v1/gpus")
            assert r.status_code == 401 and "log in again" in r.text
        with httpx.Client(base_url=second, cookies={"gw_session": copied}) as thief:
            deadline = time.monotonic() + 30
            while thief.get("/api/v1/gpus").status_code == 200:
                assert time.monotonic() < deadline, "the other replica still accepts the cookie"
                time.sleep(0.5)
        # Another session of the same token goes on.
        with _login(first, tokens["reader"]) as (client, _):
            assert client.get("/api/v1/gpus").status_code == 200


@pytest.mark.parametrize(
    ("trusted", "proto", "secure"),
    [("127.0.0.1/32", "https", True), ("127.0.0.1/32", None, False), ("", "https", False)],
)
def test_the_cookie_is_secure_behind_a_trusted_tls_proxy(
    engine: Engine,
    settings: Settings,
    tokens: dict[str, str],
    trusted: str,
    proto: str | None,
    secure: bool,
) -> None:
    settings = settings.model_copy(update={"trusted_proxies": trusted})
    headers = {"X-Forwarded-Proto": proto} if proto else {}
    with (
        live_server(create_app(settings, engine=engine)) as base,
        httpx.Client(base_url=base, headers=headers) as client,
    ):
        r = client.post("/api/v1/session", json={"token": tokens["reader"]})
        assert r.status_code == 200
        attributes = [a.strip().lower() for a in r.headers["set-cookie"].split(";")]
        assert ("secure" in attributes) is secure, attributes
        # Logging out clears the cookie with the same attributes.
        csrf = {"X-CSRF-Token": r.json()["csrf_token"]}
        cookie = r.headers["set-cookie"].split(";")[0].partition("=")[2]
        with httpx.Client(
            base_url=base, headers=headers, cookies={"gw_session": cookie}
        ) as browser:
            out = browser.delete("/api/v1/session", headers=csrf)
        assert out.status_code == 204
        cleared = [a.strip().lower() for a in out.headers["set-cookie"].split(";")]
        assert ("secure" in cleared) is secure, cleared


@pytest.mark.parametrize("path", ["/nosuch", "/jobsx", "/costs/extra", "/alerts/1/x"])
def test_an_unknown_console_path_answers_the_consoles_404_page(
    http: httpx.Client, path: str
) -> None:
    r = http.get(path)
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html"), r.text
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert "/static/console/console.js" in r.text  # the shell: the script draws the 404


@pytest.mark.parametrize("path", ["/api/v1/nosuch", "/api/v2/jobs", "/static/nosuch.js"])
def test_an_unknown_api_or_file_path_keeps_its_json_404(http: httpx.Client, path: str) -> None:
    r = http.get(path)
    assert r.status_code == 404 and r.headers["content-type"].startswith("application/json")


def test_console_pages_take_their_filters_in_the_query(http: httpx.Client) -> None:
    for path, params in (("/costs", {"group_by": "node", "start": "-24h", "end": "now"}),
                         ("/jobs", {"since": "30d"})):  # fmt: skip
        r = http.get(path, params=params)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), r.text
    assert http.get("/costs", params={"group-by": "node"}).status_code == 422
