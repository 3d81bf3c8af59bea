"""Single sign-on through a real OpenID provider on loopback (node-oidc-provider), on SQLite and
PostgreSQL: people sign in by the authorization code flow with PKCE and each sees exactly what the
rules allow (job list, search, a job page, the CSV report); bad ID tokens are refused."""

from __future__ import annotations

import asyncio
import base64
import csv
import io
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from service.api.app import create_app
from service.api.oidc import OidcClient, OidcConfig, SignInRefused
from service.settings import Settings
from tests.integration.browser_support import expect
from tests.oidc_support import (
    CLIENT_ID,
    CLIENT_SECRET,
    OTHER_CLIENT_ID,
    OTHER_CLIENT_SECRET,
    Provider,
    id_token_for,
    oidc_provider,
    sign_in,
)
from tests.support import FakeClock, free_port, iso, live_server, make_batch

# Who runs what: alice's and bob's vision jobs, alice's own job in nlp, dave's nlp job.
JOBS = {
    "slurm:10": ("alice", "vision", "GPU-a0"),
    "slurm:11": ("bob", "vision", "GPU-a1"),
    "slurm:12": ("alice", "nlp", "GPU-a2"),
    "slurm:13": ("dave", "nlp", "GPU-a3"),
}
# What each person may see: a researcher her own and her team's jobs, the team's lead the team's,
# an admin and a fleet reader everything.
SEES = {
    "alice": {"slurm:10", "slurm:11", "slurm:12"},
    "bob": {"slurm:10", "slurm:11"},
    "carol": set(JOBS),
    "frank": set(JOBS),
}


@pytest.fixture(scope="module")
def idp() -> Iterator[tuple[int, Provider]]:
    """The provider, running for the module, with the app's port its clients redirect to."""
    port = free_port()
    with oidc_provider(f"http://127.0.0.1:{port}") as provider:
        yield port, provider


def _settings(engine: Engine, provider: Provider, url: str) -> Settings:
    return Settings(
        database_url=engine.url.render_as_string(hide_password=False),
        run_scheduler=False,
        public_url=url,
        oidc_issuer=provider.issuer,
        oidc_client_id=CLIENT_ID,
        oidc_client_secret=CLIENT_SECRET,
    )


@pytest.fixture
def site(
    engine: Engine, clock: FakeClock, idp: tuple[int, Provider], tokens: dict[str, str]
) -> Iterator[str]:
    """The app with single sign-on on the provider, four GPUs and the jobs of JOBS on them."""
    port, provider = idp
    url = f"http://127.0.0.1:{port}"
    app = create_app(_settings(engine, provider, url), engine=engine, clock=clock)
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    with live_server(app, port), httpx.Client(base_url=url, timeout=30) as http:
        start = clock() - timedelta(hours=1)
        batch = make_batch(gpu_uuids=tuple(g for _, _, g in JOBS.values()), start=start, count=360)
        assert http.post("/api/v1/ingest", json=batch, headers=admin).status_code == 200
        for job_id, (user, team, gpu) in JOBS.items():
            body = {"id": job_id, "user": user, "team": team, "gpus": [gpu],
                    "started_at": iso(start)}  # fmt: skip
            r = http.post("/api/v1/jobs", json=body, headers=admin)
            assert r.status_code == 201, r.text
        yield url


def _ids(rows: list[dict[str, Any]]) -> set[str]:
    return {row["id"] for row in rows}


@pytest.mark.parametrize("login", sorted(SEES))
def test_each_person_signs_in_and_sees_what_the_rules_allow(site: str, login: str) -> None:
    with httpx.Client(base_url=site, timeout=30) as browser:
        landed = sign_in(browser, login)
        assert landed.status_code == 200 and landed.url.path == "/", landed.text
        cookie = next(c for c in browser.cookies.jar if c.name == "gw_session")
        assert cookie.has_nonstandard_attr("HttpOnly")
        me = browser.get("/api/v1/session").json()
        assert me["user"] == login and me["role"] == ("admin" if login == "carol" else "reader")
        assert me["fleet"] is (login in ("carol", "frank"))
        seen = SEES[login]
        assert _ids(browser.get("/api/v1/jobs").json()) == seen
        # The search (filters of the job list) stays inside the scope.
        assert _ids(browser.get("/api/v1/jobs", params={"team": "nlp"}).json()) == seen & {
            "slurm:12",
            "slurm:13",
        }
        assert _ids(browser.get("/api/v1/jobs", params={"user": "dave"}).json()) == seen & {
            "slurm:13"
        }
        for job_id in JOBS:
            page = browser.get(f"/api/v1/jobs/{job_id}")
            assert page.status_code == (200 if job_id in seen else 404), (job_id, page.text)
        report = browser.get("/api/v1/reports/cost", params={"format": "csv", "group_by": "job"})
        assert report.status_code == 200, report.text
        rows = list(csv.DictReader(io.StringIO(report.text)))
        assert {r["job"] for r in rows if r["job"] != "__total__"} == seen
        total = next(r for r in rows if r["job"] == "__total__")
        # The totals are the scope's: one GPU-hour per job seen, not the fleet's four.
        assert float(total["allocated_seconds"]) == pytest.approx(3600 * len(seen), rel=0.01)
        by_team = browser.get("/api/v1/reports/cost", params={"group_by": "team"}).json()
        teams = {r["key"] for r in by_team["rows"]}
        assert teams == {JOBS[j][1] for j in seen}
        # Fleet views: the whole fleet for a fleet reader and an admin, refused to the others.
        assert browser.get("/api/v1/fleet").status_code == (
            200 if login in ("carol", "frank") else 403
        )
        # Writes: the admin only, with the session's CSRF token.
        prices = [{"model_pattern": "*H100*", "usd_per_gpu_hour": 4.0,
                   "effective_from": "2026-01-01T00:00:00Z"}]  # fmt: skip
        put = browser.put("/api/v1/prices", json=prices, headers={"X-CSRF-Token": me["csrf_token"]})
        assert put.status_code == (200 if login == "carol" else 403), put.text
        # Logging out ends the session on the server.
        assert (
            browser.delete(
                "/api/v1/session", headers={"X-CSRF-Token": me["csrf_token"]}
            ).status_code
            == 204
        )
        browser.cookies.set("gw_session", cookie.value or "", domain=cookie.domain)
        assert browser.get("/api/v1/jobs").status_code == 401


def test_a_wrong_password_at_the_provider_signs_nobody_in(site: str) -> None:
    with httpx.Client(base_url=site, timeout=30) as browser:
        r = sign_in(browser, "alice", pw="guess")
        assert r.status_code == 401
        assert browser.get("/api/v1/session").status_code == 401


def test_a_callback_with_another_state_is_refused(site: str) -> None:
    with httpx.Client(base_url=site, timeout=30) as browser:
        r = browser.get("/api/v1/auth/oidc/login")
        assert r.status_code == 302 and "code_challenge_method=S256" in r.headers["location"]
        r = browser.get("/api/v1/auth/oidc/callback", params={"code": "x", "state": "forged"})
        assert r.status_code == 400 and "state" in r.json()["detail"]
    with httpx.Client(base_url=site, timeout=30) as stranger:  # no login cookie at all
        r = stranger.get("/api/v1/auth/oidc/callback", params={"code": "x", "state": "s"})
        assert r.status_code == 400


def _tampered(token: str) -> str:
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["preferred_username"] = "carol"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{header}.{forged}.{signature}"


def test_real_id_tokens_that_are_tampered_expired_or_for_another_client_are_refused(
    idp: tuple[int, Provider],
) -> None:
    port, provider = idp
    settings = Settings(
        oidc_issuer=provider.issuer, oidc_client_id=CLIENT_ID, oidc_client_secret=CLIENT_SECRET,
        public_url=f"http://127.0.0.1:{port}",
    )  # fmt: skip
    config = OidcConfig.from_settings(settings)
    assert config is not None
    client = OidcClient(config)
    good = id_token_for(provider, "alice", client_id=CLIENT_ID, secret=CLIENT_SECRET, nonce="n1")
    person = asyncio.run(client.person_from_id_token(good, nonce="n1", now=time.time()))
    assert (person.user, person.teams, person.fleet) == ("alice", ("vision",), False)
    other = id_token_for(
        provider, "carol", client_id=OTHER_CLIENT_ID, secret=OTHER_CLIENT_SECRET, nonce="n1"
    )
    refusals = {
        "tampered": (_tampered(good), "n1", time.time()),
        "expired": (good, "n1", time.time() + 3600),
        "wrong nonce": (good, "n2", time.time()),
        "wrong audience": (other, "n1", time.time()),
    }
    for why, (token, nonce, now) in refusals.items():
        with pytest.raises(SignInRefused) as refused:
            asyncio.run(client.person_from_id_token(token, nonce=nonce, now=now))
        said = str(refused.value)
        expected = {"tampered": "signed", "expired": "expired", "wrong nonce": "nonce",
                    "wrong audience": "aud"}[why]  # fmt: skip
        assert expected in said, (why, said)


def test_configuration_changes_name_the_person_who_made_them(
    site: str, tokens: dict[str, str]
) -> None:
    ladder = {"steps": [{"action": "notify_owner", "after": "60m"}]}
    policy = {"name": "idle", "metric": "activity", "aggregate": "avg", "window": "10m",
              "op": "<", "threshold": 0.05, "for": "30m", "scope": "job"}  # fmt: skip
    with httpx.Client(base_url=site, timeout=30) as browser:
        sign_in(browser, "carol")
        csrf = {"X-CSRF-Token": browser.get("/api/v1/session").json()["csrf_token"]}
        writes = [
            ("POST", "/api/v1/policies", policy),
            ("PUT", "/api/v1/policies/idle", {**policy, "ladder": ladder}),
            ("POST", "/api/v1/silences", {"matchers": {"policy": "idle"}, "comment": "upgrade",
                                          "ends_at": "2030-01-01T00:00:00Z"}),
            ("PUT", "/api/v1/owners/team/vision", {"email": "vision@example.org"}),
            ("PUT", "/api/v1/prices", [{"model_pattern": "*H100*", "usd_per_gpu_hour": 3.5,
                                        "effective_from": "2026-01-01T00:00:00Z"}]),
            ("DELETE", "/api/v1/policies/idle", None),
        ]  # fmt: skip
        for method, path, body in writes:
            r = browser.request(method, path, json=body, headers=csrf)
            assert r.status_code in (200, 201, 204), (path, r.text)
        silences = browser.get("/api/v1/silences").json()
        assert silences[0]["created_by"] == "person:carol"
    with httpx.Client(base_url=site, timeout=30) as script:
        admin = {"Authorization": f"Bearer {tokens['admin']}"}
        assert script.delete("/api/v1/owners/team/vision", headers=admin).status_code == 204
        changes = script.get("/api/v1/changes", headers=admin).json()
    got = [(c["actor"].split(":")[0], c["kind"], c["name"], c["action"]) for c in changes]
    assert got == [
        ("token", "owner", "team/vision", "delete"),
        ("person", "ladder", "idle", "delete"),
        ("person", "policy", "idle", "delete"),
        ("person", "prices", "price table", "update"),
        ("person", "owner", "team/vision", "create"),
        ("person", "silence", "1", "create"),
        ("person", "ladder", "idle", "create"),
        ("person", "policy", "idle", "update"),
        ("person", "policy", "idle", "create"),
    ]
    assert {c["actor"] for c in changes if c["actor"].startswith("person")} == {"person:carol"}
    # The console's actions page shows them, to carol signed in through the provider.
    with chromium_page() as page:
        chromium_sign_in(page, site, "carol")
        page.wait_for_url(site + "/")
        page.goto(site + "/actions")
        page.wait_for_selector("body[data-ready]", timeout=60_000)
        rows = page.locator("#changes tbody tr")
        assert rows.count() == len(changes)
        assert "person:carol" in rows.nth(1).inner_text()


def test_a_person_stops_and_restarts_their_own_report_but_nobody_elses(
    site: str, tokens: dict[str, str]
) -> None:
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    with httpx.Client(base_url=site, timeout=30) as browser:
        assert browser.put("/api/v1/reports/opt-outs/user/dave", headers=admin).status_code == 200
        sign_in(browser, "alice")
        csrf = {"X-CSRF-Token": browser.get("/api/v1/session").json()["csrf_token"]}
        own = browser.put("/api/v1/reports/opt-outs/user/alice", headers=csrf)
        assert own.status_code == 200 and own.json()["by"] == "person:alice"
        # She sees her own opt-out, not dave's.
        listed = browser.get("/api/v1/reports/opt-outs").json()
        assert [r["recipient"] for r in listed] == ["user:alice"]
        assert browser.put("/api/v1/reports/opt-outs/user/bob", headers=csrf).status_code == 403
        assert browser.put("/api/v1/reports/opt-outs/team/vision", headers=csrf).status_code == 403
        assert (
            browser.delete("/api/v1/reports/opt-outs/user/alice", headers=csrf).status_code == 204
        )


@contextmanager
def chromium_page() -> Iterator[Any]:
    """A page of Debian's Chromium (Playwright), closed after."""
    from tests.integration.browser_support import ARGS, CHROMIUM, _need_browser

    _need_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield browser.new_context().new_page()
        finally:
            browser.close()


def chromium_sign_in(page: Any, site: str, login: str) -> None:
    """Sign ``login`` in from the console's login page through the provider's own form."""
    page.goto(site + "/")
    page.wait_for_url("**/login?next=%2F")
    page.click("#sso")
    page.fill("#login", login)
    page.fill("#password", f"pw-{login}")
    page.click("#sign-in")


def test_chromium_signs_alice_in_and_shows_her_jobs_only(site: str) -> None:
    with chromium_page() as page:
        chromium_sign_in(page, site, "alice")
        # Back in the console, signed in: a researcher starts at her jobs, not the fleet.
        page.wait_for_url(site + "/jobs")
        page.wait_for_selector("body[data-ready]", timeout=60_000)
        assert page.get_attribute("body", "data-ready") == "1", page.inner_text("main")
        assert page.inner_text("#who").startswith("alice (vision)")
        rows = page.locator("#jobs tbody tr")
        shown = {rows.nth(i).get_attribute("data-job") for i in range(rows.count())}
        assert shown == SEES["alice"]
        # Her job's page (charts, alerts, steps, notices) and her own page read in scope.
        for path in ("/jobs/slurm:11", "/users/alice", "/teams/vision"):
            page.goto(site + path)
            page.wait_for_selector("body[data-ready]", timeout=60_000)
            assert page.get_attribute("body", "data-ready") == "1", (
                path,
                page.inner_text("main"),
            )
        # On her own page she picks mail for her notices and stops her report herself.
        page.goto(site + "/users/alice")
        page.wait_for_selector("body[data-ready]", timeout=60_000)
        page.click("#channel-mail")
        expect(page.locator("#channel-state")).to_have_text(
            "Your notices go to: mail (alice@example.org)", timeout=30_000
        )
        page.click("#owner-opt")
        expect(page.locator("#owner-report")).to_have_attribute("data-opted-out", "1")
        page.goto(site + "/jobs/slurm:13")  # dave's nlp job: not hers, as if it did not exist
        page.wait_for_selector("body[data-ready]", timeout=60_000)
        assert "does not exist" in page.inner_text("main")


def test_a_personal_token_sees_what_its_person_sees(site: str) -> None:
    with httpx.Client(base_url=site, timeout=30) as browser:
        sign_in(browser, "bob")
        csrf = {"X-CSRF-Token": browser.get("/api/v1/session").json()["csrf_token"]}
        minted = browser.post("/api/v1/session/tokens", json={"name": "laptop"}, headers=csrf)
        assert minted.status_code == 201, minted.text
        secret = minted.json()["token"]
        listed = browser.get("/api/v1/session/tokens").json()
        assert [(t["name"], t["token"]) for t in listed] == [("bob: laptop", None)]
    with httpx.Client(base_url=site, timeout=30) as cli:
        bearer = {"Authorization": f"Bearer {secret}"}
        assert _ids(cli.get("/api/v1/jobs", headers=bearer).json()) == SEES["bob"]
        assert cli.get("/api/v1/jobs/slurm:12", headers=bearer).status_code == 404
        assert cli.get("/api/v1/fleet", headers=bearer).status_code == 403
        # A personal token mints no more tokens.
        assert cli.post("/api/v1/session/tokens", json={}, headers=bearer).status_code == 403
    with httpx.Client(base_url=site, timeout=30) as browser:
        sign_in(browser, "alice")
        csrf = {"X-CSRF-Token": browser.get("/api/v1/session").json()["csrf_token"]}
        # Bob's token is not alice's to revoke.
        other = browser.delete(f"/api/v1/session/tokens/{minted.json()['id']}", headers=csrf)
        assert other.status_code == 404


def test_an_unreachable_provider_is_a_502_naming_it(engine: Engine, clock: FakeClock) -> None:
    port = free_port()
    dead = Provider(issuer=f"http://127.0.0.1:{free_port()}", redirect_uri="")
    app = create_app(
        _settings(engine, dead, f"http://127.0.0.1:{port}"), engine=engine, clock=clock
    )
    with live_server(app, port) as url, httpx.Client(base_url=url, timeout=30) as browser:
        r = browser.get("/api/v1/auth/oidc/login")
        assert r.status_code == 502 and "identity provider" in r.json()["detail"]


def test_a_person_picks_mail_or_a_slack_dm_for_their_own_notices(
    site: str, tokens: dict[str, str]
) -> None:
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    with httpx.Client(base_url=site, timeout=30) as browser:
        # An admin set alice's team copy before; her choice keeps it.
        r = browser.put("/api/v1/owners/user/alice", json={"email": "old@example.org",
                        "cc_email": "vision-leads@example.org", "team": "vision"}, headers=admin)  # fmt: skip
        assert r.status_code == 201, r.text
        sign_in(browser, "alice")
        csrf = {"X-CSRF-Token": browser.get("/api/v1/session").json()["csrf_token"]}
        slack = browser.put("/api/v1/session/channel", json={"channel": "slack", "slack": "U0ALICE"},
                            headers=csrf)  # fmt: skip
        assert slack.json() == {"channel": "slack", "email": None, "slack": "U0ALICE"}
        entry = browser.get("/api/v1/owners/user/alice", headers=admin).json()
        assert (entry["email"], entry["slack"], entry["cc_email"], entry["team"]) == (
            None, "U0ALICE", "vision-leads@example.org", "vision",
        )  # fmt: skip
        # Mail goes to the address the provider vouches for, not one she types.
        mail = browser.put("/api/v1/session/channel", json={"channel": "mail"}, headers=csrf)
        assert mail.json() == {"channel": "mail", "email": "alice@example.org", "slack": None}
        bad = browser.put("/api/v1/session/channel", json={"channel": "slack", "slack": "C0TEAM"},
                          headers=csrf)  # fmt: skip
        assert bad.status_code == 422 and "slack" in bad.text
        typed = browser.put("/api/v1/session/channel",
                            json={"channel": "mail", "email": "x@evil.example"}, headers=csrf)  # fmt: skip
        assert typed.status_code == 422
        assert browser.get("/api/v1/session/channel").json()["email"] == "alice@example.org"


def test_an_admin_signs_a_person_out_everywhere(site: str, clock: FakeClock) -> None:
    with (
        httpx.Client(base_url=site, timeout=30) as alice,
        httpx.Client(base_url=site, timeout=30) as carol,
    ):
        sign_in(alice, "alice")  # lands on the console's shell: no API call made yet
        sign_in(carol, "carol")
        csrf = {"X-CSRF-Token": carol.get("/api/v1/session").json()["csrf_token"]}
        r = carol.delete("/api/v1/session/people/alice", headers=csrf)
        assert r.status_code == 204, r.text
        assert alice.get("/api/v1/session").status_code == 401
        assert carol.get("/api/v1/session").status_code == 200  # nobody else is signed out
        # Her next sign-in, a moment later, is the provider's to decide, and passes.
        clock.advance(1)
        sign_in(alice, "alice")
        assert alice.get("/api/v1/session").json()["user"] == "alice"
        changes = carol.get("/api/v1/changes", params={"kind": "sessions"}).json()
        assert [(c["actor"], c["name"]) for c in changes] == [("person:carol", "user/alice")]


@pytest.mark.parametrize("login", ["bob", "carol"])
def test_chromium_signs_the_team_lead_and_the_admin_in_to_what_they_may_see(
    site: str, login: str
) -> None:
    # With alice above: a researcher, a team lead and an admin through the provider's own form.
    with chromium_page() as page:
        chromium_sign_in(page, site, login)
        page.wait_for_selector("body[data-ready]", timeout=60_000)
        page.goto(site + "/jobs")
        page.wait_for_selector("body[data-ready]", timeout=60_000)
        assert page.get_attribute("body", "data-ready") == "1", page.inner_text("main")
        assert page.inner_text("#who").startswith(login)
        rows = page.locator("#jobs tbody tr")
        shown = {rows.nth(i).get_attribute("data-job") for i in range(rows.count())}
        assert shown == SEES[login]
