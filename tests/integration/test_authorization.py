"""Every route of the API against every kind of caller, on SQLite and PostgreSQL.

Callers: no token, a wrong token, the agent of another node (node-b), the agent of the node the
data belongs to (node-a), a reader and an admin; and three people signed in to the console
(session cookie and CSRF token as the console sends them): a researcher (alice, team nlp: her own
job slurm:1, not bob's slurm:2 of team vision), a fleet reader and an admin. Each case names the
status each caller gets (a person's default: a fleet reader as a reader token, an admin person as
an admin token, the researcher 403 outside the routes that narrow to her scope); a route the app
serves but no case covers fails the coverage test, so a new route needs a row.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import Engine

from service.api import sessions
from service.api.deps import session_key
from service.roles import Person, Role
from tests.alerting_support import SECRET, low_sm_policy
from tests.conftest import make_token
from tests.support import FakeClock, iso, make_batch

TOKEN_CALLERS = ("none", "wrong", "other_agent", "agent", "reader", "admin")
PEOPLE = ("researcher", "fleet_reader", "person_admin")
CALLERS = TOKEN_CALLERS + PEOPLE
OPEN = dict.fromkeys(CALLERS, 200)
# The people of the matrix: (user, teams, role, sees the whole fleet).
PERSONS = {
    "researcher": Person(user="alice", teams=("nlp",), role=Role.READER, fleet=False),
    "fleet_reader": Person(user="frank", teams=(), role=Role.READER, fleet=True),
    "person_admin": Person(user="carol", teams=(), role=Role.ADMIN, fleet=True),
}


PERSON_HEADERS: dict[str, dict[str, str]] = {}


def with_people(expect: dict[str, int]) -> dict[str, int]:
    """``expect`` with each person's default filled in where the case names none."""
    researcher = (
        expect["none"] if expect["none"] != 401 else 401 if expect["reader"] == 401 else 403
    )
    defaults = {"researcher": researcher, "fleet_reader": expect["reader"],
                "person_admin": expect["admin"]}  # fmt: skip
    return {**defaults, **expect}


def reads(ok: int = 200) -> dict[str, int]:
    return {"none": 401, "wrong": 401, "other_agent": 403, "agent": 403, "reader": ok, "admin": ok}


def admin_only(ok: int) -> dict[str, int]:
    return {**reads(403), "admin": ok}


@dataclass(frozen=True)
class Case:
    """One request: ``body(caller, now)`` builds its JSON, ``path`` may name the caller."""

    name: str
    method: str
    route: str  # the OpenAPI path template it covers
    path: str
    expect: dict[str, int]
    body: Callable[[str, Any], Any] | None = None
    params: dict[str, str] = field(default_factory=dict)
    setup: Callable[[FastAPI], None] | None = None


def _job(caller: str, now: Any) -> dict[str, Any]:
    return {"id": f"new-{caller}", "user": "alice", "gpus": ["GPU-a0"], "started_at": iso(now)}


def _hijack_without_gpus(_: str, now: Any) -> dict[str, Any]:
    return {"id": "slurm:2", "user": "mallory", "team": "hijacked", "gpus": [],
            "started_at": "2000-01-01T00:00:00Z"}  # fmt: skip


def _hijack_with_own_gpu(_: str, now: Any) -> dict[str, Any]:
    return {"id": "slurm:2", "user": "mallory", "team": "hijacked", "gpus": ["GPU-a0"],
            "started_at": iso(now)}  # fmt: skip


def _protect_metrics(app: FastAPI) -> None:
    app.state.ctx.settings.metrics_token_required = True


LADDER = {"steps": [{"action": "notify_owner", "after": "60m"},
                    {"action": "reclaim", "after": "120m"}]}  # fmt: skip

AGENT_WRITES = {"none": 401, "wrong": 401, "reader": 403}

CASES = [
    Case("healthz", "GET", "/healthz", "/healthz", OPEN),
    Case("readyz", "GET", "/readyz", "/readyz", OPEN),
    Case("metrics-open", "GET", "/metrics", "/metrics", OPEN),
    Case("metrics-protected", "GET", "/metrics", "/metrics", reads(), setup=_protect_metrics),
    Case(
        "ingest",
        "POST",
        "/api/v1/ingest",
        "/api/v1/ingest",
        {**AGENT_WRITES, "other_agent": 403, "agent": 200, "admin": 200},
        body=lambda _, now: make_batch(start=now),
    ),
    Case("gpus", "GET", "/api/v1/gpus", "/api/v1/gpus", reads()),
    Case(
        "series",
        "GET",
        "/api/v1/gpus/{uuid}/series",
        "/api/v1/gpus/GPU-a0/series",
        # alice's slurm:1 held GPU-a0: its series are hers to read.
        {**reads(), "researcher": 200},
        params={"metric": "sm_active"},
    ),
    Case(
        "series-other-team",
        "GET",
        "/api/v1/gpus/{uuid}/series",
        "/api/v1/gpus/GPU-b0/series",
        {**reads(), "researcher": 404},
        params={"metric": "sm_active"},
    ),
    Case(
        "series-batch",
        "GET",
        "/api/v1/gpus/series",
        "/api/v1/gpus/series",
        {**reads(), "researcher": 200},
        params={"gpu": "GPU-a0", "metric": "sm_active"},
    ),
    Case(
        "series-batch-other-team-job",
        "GET",
        "/api/v1/gpus/series",
        "/api/v1/gpus/series",
        {**reads(), "researcher": 404},
        params={"job": "slurm:2", "metric": "sm_active"},
    ),
    Case("gpu-moves", "GET", "/api/v1/gpus/{uuid}/moves", "/api/v1/gpus/GPU-a0/moves", reads()),
    Case("policies", "GET", "/api/v1/policies", "/api/v1/policies", reads()),
    Case(
        "policy-create",
        "POST",
        "/api/v1/policies",
        "/api/v1/policies",
        admin_only(201),
        body=lambda c, _: low_sm_policy([], name=f"p-{c}"),
    ),
    Case("policy", "GET", "/api/v1/policies/{name}", "/api/v1/policies/kept", reads()),
    Case(
        "policy-put",
        "PUT",
        "/api/v1/policies/{name}",
        "/api/v1/policies/kept",
        admin_only(200),
        body=lambda _, __: low_sm_policy([], name="kept", threshold=0.2),
    ),
    # A ladder (warn, then reclaim) changes only with an admin token, like the rest of a policy.
    Case(
        "policy-put-ladder",
        "PUT",
        "/api/v1/policies/{name}",
        "/api/v1/policies/kept",
        admin_only(200),
        body=lambda _, __: low_sm_policy([], name="kept", ladder=LADDER),
    ),
    Case(
        "policy-delete",
        "DELETE",
        "/api/v1/policies/{name}",
        "/api/v1/policies/doomed",
        # The admin token deleted it first: 404 shows the admin person got past the check.
        {**admin_only(204), "person_admin": 404},
    ),
    Case("channels", "GET", "/api/v1/channels", "/api/v1/channels", reads()),
    Case(
        "channel-create",
        "POST",
        "/api/v1/channels",
        "/api/v1/channels",
        admin_only(201),
        body=lambda c, _: {
            "name": f"c-{c}",
            "type": "webhook",
            "url": "http://127.0.0.1:9/x",
            "secret": SECRET,
        },
    ),
    Case(
        "channel-delete",
        "DELETE",
        "/api/v1/channels/{name}",
        "/api/v1/channels/doomed",
        # The admin token deleted it first: 404 shows the admin person got past the check.
        {**admin_only(204), "person_admin": 404},
    ),
    Case(
        "channel-test",
        "POST",
        "/api/v1/channels/{name}/test",
        "/api/v1/channels/probe/test",
        admin_only(502),  # nothing listens on port 9: the send was tried
    ),
    Case("owners", "GET", "/api/v1/owners", "/api/v1/owners", admin_only(200)),
    Case(
        "owner-create",
        "POST",
        "/api/v1/owners",
        "/api/v1/owners",
        admin_only(201),
        body=lambda c, _: {"kind": "user", "name": f"u-{c}", "email": "u@example.org"},
    ),
    Case(
        "owner",
        "GET",
        "/api/v1/owners/{kind}/{name}",
        "/api/v1/owners/team/vision",
        admin_only(200),
    ),
    Case(
        "owner-put",
        "PUT",
        "/api/v1/owners/{kind}/{name}",
        "/api/v1/owners/team/vision",
        admin_only(200),
        body=lambda _, __: {"email": "vision-leads@example.org"},
    ),
    Case(
        "owner-delete",
        "DELETE",
        "/api/v1/owners/{kind}/{name}",
        "/api/v1/owners/user/doomed",
        # The admin token deleted it first: 404 shows the admin person got past the check.
        {**admin_only(204), "person_admin": 404},
    ),
    Case("notices", "GET", "/api/v1/notices", "/api/v1/notices", reads()),
    Case("silences", "GET", "/api/v1/silences", "/api/v1/silences", reads()),
    Case(
        "silence-create",
        "POST",
        "/api/v1/silences",
        "/api/v1/silences",
        admin_only(201),
        body=lambda _, now: {
            "matchers": {"policy": "kept"},
            "comment": "c",
            "ends_at": iso(now + timedelta(1)),
        },
    ),
    Case(
        "silence-delete",
        "DELETE",
        "/api/v1/silences/{silence_id}",
        "/api/v1/silences/1",
        admin_only(204),
    ),
    Case("alerts", "GET", "/api/v1/alerts", "/api/v1/alerts", reads()),
    # A person lists alerts, ladder steps and notices of one job in their scope (job=).
    Case(
        "alerts-own-job",
        "GET",
        "/api/v1/alerts",
        "/api/v1/alerts",
        {**reads(), "researcher": 200},
        params={"job": "slurm:1"},
    ),
    Case(
        "alerts-other-team-job",
        "GET",
        "/api/v1/alerts",
        "/api/v1/alerts",
        {**reads(), "researcher": 404},
        params={"job": "slurm:2"},
    ),
    Case(
        "notices-own",
        "GET",
        "/api/v1/notices",
        "/api/v1/notices",
        {**reads(), "researcher": 200},
        params={"user": "alice"},
    ),
    Case(
        "notices-other-user",
        "GET",
        "/api/v1/notices",
        "/api/v1/notices",
        {**reads(), "researcher": 403},
        params={"user": "bob"},
    ),
    Case(
        "notices-own-job",
        "GET",
        "/api/v1/notices",
        "/api/v1/notices",
        {**reads(), "researcher": 200},
        params={"job": "slurm:1"},
    ),
    # No alert exists: 404 shows the caller got past the role check.
    Case("alert", "GET", "/api/v1/alerts/{alert_id}", "/api/v1/alerts/1", reads(404)),
    Case("jobs", "GET", "/api/v1/jobs", "/api/v1/jobs", {**reads(), "researcher": 200}),
    # Another team's job is 404 to a person, as a job that does not exist.
    Case(
        "job",
        "GET",
        "/api/v1/jobs/{job_id}",
        "/api/v1/jobs/slurm:2",
        {**reads(), "researcher": 404},
    ),
    Case(
        "job-own",
        "GET",
        "/api/v1/jobs/{job_id}",
        "/api/v1/jobs/slurm:1",
        {**reads(), "researcher": 200},
    ),
    # A job's verdict (for Slurm's AdminComment): readers, and the agent whose node registered it.
    Case(
        "verdict-own",
        "GET",
        "/api/v1/verdicts/{job_id}",
        "/api/v1/verdicts/slurm:1",
        {**reads(), "agent": 200, "researcher": 200},
    ),
    Case(
        "verdict-other-node",
        "GET",
        "/api/v1/verdicts/{job_id}",
        "/api/v1/verdicts/slurm:2",
        {**reads(), "other_agent": 200, "researcher": 404},
    ),
    Case(
        "job-create",
        "POST",
        "/api/v1/jobs",
        "/api/v1/jobs",
        {**AGENT_WRITES, "other_agent": 403, "agent": 201, "admin": 201},
        body=_job,
    ),
    Case(
        "job-hijack-without-gpus",
        "POST",
        "/api/v1/jobs",
        "/api/v1/jobs",
        {**AGENT_WRITES, "other_agent": 403, "agent": 403, "admin": 200},
        body=_hijack_without_gpus,
    ),
    Case(
        "job-hijack-with-own-gpu",
        "POST",
        "/api/v1/jobs",
        "/api/v1/jobs",
        {**AGENT_WRITES, "other_agent": 403, "agent": 409, "admin": 200},
        body=_hijack_with_own_gpu,
    ),
    Case(
        "job-patch-metadata",
        "PATCH",
        "/api/v1/jobs/{job_id}",
        "/api/v1/jobs/slurm:2",
        # Its own node's job: a change is a conflict; another node's: not its to change at all.
        {**AGENT_WRITES, "other_agent": 409, "agent": 403, "admin": 200},
        body=lambda _, __: {"team": "hijacked"},
    ),
    Case(
        "job-end-own",
        "PATCH",
        "/api/v1/jobs/{job_id}",
        "/api/v1/jobs/slurm:1",
        {**AGENT_WRITES, "other_agent": 403, "agent": 200, "admin": 200},
        body=lambda _, now: {"ended_at": iso(now)},
    ),
    # A job's progress: written like the job itself (its node's agent, or an admin).
    Case(
        "progress-post",
        "POST",
        "/api/v1/jobs/{job_id}/progress",
        "/api/v1/jobs/slurm:1/progress",
        {**AGENT_WRITES, "other_agent": 403, "agent": 201, "admin": 201},
        body=lambda caller, now: {
            "unit": "steps",
            "value": CALLERS.index(caller),
            "at": iso(now),
        },
    ),
    Case(
        "progress",
        "GET",
        "/api/v1/jobs/{job_id}/progress",
        "/api/v1/jobs/slurm:2/progress",
        {**reads(), "researcher": 404},
    ),
    Case(
        "progress-own",
        "GET",
        "/api/v1/jobs/{job_id}/progress",
        "/api/v1/jobs/slurm:1/progress",
        {**reads(), "researcher": 200},
    ),
    Case("prices", "GET", "/api/v1/prices", "/api/v1/prices", reads()),
    Case(
        "prices-put",
        "PUT",
        "/api/v1/prices",
        "/api/v1/prices",
        admin_only(200),
        body=lambda _, __: [
            {
                "model_pattern": "*H100*",
                "usd_per_gpu_hour": 4.0,
                "effective_from": "2026-01-01T00:00:00Z",
            }
        ],
    ),
    Case(
        "cost-report",
        "GET",
        "/api/v1/reports/cost",
        "/api/v1/reports/cost",
        {**reads(), "researcher": 200},
    ),
    Case(
        "cost-report-csv",
        "GET",
        "/api/v1/reports/cost",
        "/api/v1/reports/cost",
        {**reads(), "researcher": 200},
        params={"format": "csv", "group_by": "team"},
    ),
    # Hardware views show the whole fleet: not a person's report.
    Case(
        "cost-report-by-node",
        "GET",
        "/api/v1/reports/cost",
        "/api/v1/reports/cost",
        {**reads(), "researcher": 422},
        params={"group_by": "node"},
    ),
    # The savings ledger: a person's own and their teams' jobs only.
    Case(
        "savings-ledger",
        "GET",
        "/api/v1/reports/savings",
        "/api/v1/reports/savings",
        {**reads(), "researcher": 200},
    ),
    # The admins' report of the week just ended: no job ran in it, an empty report still is.
    Case("periodic-report", "GET", "/api/v1/reports/periodic", "/api/v1/reports/periodic", reads()),
    Case("report-sends", "GET", "/api/v1/reports/sends", "/api/v1/reports/sends", reads()),
    # A person sees only their own and their teams' opt-outs.
    Case(
        "opt-outs",
        "GET",
        "/api/v1/reports/opt-outs",
        "/api/v1/reports/opt-outs",
        {**reads(), "researcher": 200},
    ),
    Case(
        "opt-out",
        "PUT",
        "/api/v1/reports/opt-outs/{kind}/{name}",
        "/api/v1/reports/opt-outs/user/alice",
        # alice, signed in, stops her own report (self-service).
        {**admin_only(200), "researcher": 200},
    ),
    # Nobody opted out: 404 shows the caller got past the role check.
    Case(
        "opt-in",
        "DELETE",
        "/api/v1/reports/opt-outs/{kind}/{name}",
        "/api/v1/reports/opt-outs/user/nobody",
        admin_only(404),
    ),
    # The console's login reads the token of the body, whatever the header says.
    Case(
        "session-login",
        "POST",
        "/api/v1/session",
        "/api/v1/session",
        dict.fromkeys(CALLERS, 401),
        body=lambda _, __: {"token": "gw_not-a-token"},
    ),
    Case("fleet", "GET", "/api/v1/fleet", "/api/v1/fleet", reads()),
    Case("changes", "GET", "/api/v1/changes", "/api/v1/changes", reads()),
    # The ladders' audit log: readers see it (filtered, to show the filter passes the check).
    Case("actions", "GET", "/api/v1/actions", "/api/v1/actions", reads()),
    Case(
        "actions-filtered",
        "GET",
        "/api/v1/actions",
        "/api/v1/actions",
        {**reads(), "researcher": 200},
        params={"job": "slurm:1", "outcome": "reclaimed", "format": "csv"},
    ),
    Case(
        "session-whoami",
        "GET",
        "/api/v1/session",
        "/api/v1/session",
        {**reads(), "researcher": 200},
    ),
    Case(
        "session-logout",
        "DELETE",
        "/api/v1/session",
        "/api/v1/session",
        {**reads(204), "researcher": 204},
    ),
    # Personal tokens: minted, listed and revoked by a person signed in, never by a token.
    Case(
        "personal-token-mint",
        "POST",
        "/api/v1/session/tokens",
        "/api/v1/session/tokens",
        {**reads(403), "researcher": 201, "fleet_reader": 201, "person_admin": 201},
        body=lambda _, __: {"name": "cli"},
    ),
    Case(
        "personal-tokens",
        "GET",
        "/api/v1/session/tokens",
        "/api/v1/session/tokens",
        {**reads(403), "researcher": 200, "fleet_reader": 200, "person_admin": 200},
    ),
    Case(
        "personal-token-revoke",
        "DELETE",
        "/api/v1/session/tokens/{token_id}",
        "/api/v1/session/tokens/1",
        # Token 1 is the agent's, not a person's: 404 shows the person got past the check.
        {**reads(403), "researcher": 404, "fleet_reader": 404, "person_admin": 404},
    ),
    # A person's own channel (mail or a Slack DM); tokens change the owner directory instead.
    Case(
        "channel",
        "GET",
        "/api/v1/session/channel",
        "/api/v1/session/channel",
        {**reads(403), "researcher": 200, "fleet_reader": 200, "person_admin": 200},
    ),
    Case(
        "channel-put",
        "PUT",
        "/api/v1/session/channel",
        "/api/v1/session/channel",
        {**reads(403), "researcher": 200, "fleet_reader": 200, "person_admin": 200},
        body=lambda _, __: {"channel": "slack", "slack": "U0ALICE"},
    ),
    # An admin signs a person out everywhere.
    Case(
        "sign-person-out",
        "DELETE",
        "/api/v1/session/people/{user}",
        "/api/v1/session/people/nobody",
        admin_only(204),
    ),
    # Single sign-on is not set up in this app: 404 names the setting, whoever asks.
    Case(
        "oidc-login",
        "GET",
        "/api/v1/auth/oidc/login",
        "/api/v1/auth/oidc/login",
        dict.fromkeys(CALLERS, 404),
    ),
    Case(
        "oidc-callback",
        "GET",
        "/api/v1/auth/oidc/callback",
        "/api/v1/auth/oidc/callback",
        dict.fromkeys(CALLERS, 404),
    ),
]


def test_every_route_has_a_row(app: FastAPI) -> None:
    served = {
        (method.upper(), path) for path, ops in app.openapi()["paths"].items() for method in ops
    }
    covered = {(c.method, c.route) for c in CASES}
    assert served == covered


@pytest.fixture
def world(
    app: FastAPI, http: httpx.Client, engine: Engine, clock: FakeClock, tokens: dict[str, str]
) -> dict[str, str]:
    """GPU-a0 on node-a holding job slurm:1, GPU-b0 on node-b holding slurm:2 (bob, vision),
    and one policy, channel and silence of each kind to read, change or delete."""
    app.state.ctx.settings.webhook_allow_nets = "127.0.0.0/8"
    key = session_key(app.state.ctx)
    for name, person in PERSONS.items():
        session = sessions.person_session(
            person=person, now=clock().timestamp(), lifetime_seconds=3600
        )
        cookie = sessions.encode(session, key=key)
        PERSON_HEADERS[name] = {"Cookie": f"{sessions.COOKIE_NAME}={cookie}",
                                sessions.CSRF_HEADER: sessions.csrf_token(session, key=key)}  # fmt: skip
    callers = {
        "wrong": "gw_" + "x" * 43,
        "other_agent": make_token(engine, "agent", "node-b"),
        **tokens,
    }
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    now = clock()
    for token, node, uuid in ((tokens["agent"], "node-a", "GPU-a0"),
                              (callers["other_agent"], "node-b", "GPU-b0")):  # fmt: skip
        batch = make_batch(hostname=node, gpu_uuids=(uuid,), start=now - timedelta(minutes=1))
        r = http.post("/api/v1/ingest", json=batch, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
    setup: list[tuple[str, str, Any]] = [
        ("POST", "/api/v1/jobs", {"id": "slurm:1", "user": "alice", "gpus": ["GPU-a0"],
                                  "started_at": iso(now)}),
        ("POST", "/api/v1/jobs", {"id": "slurm:2", "user": "bob", "team": "vision",
                                  "gpus": ["GPU-b0"], "started_at": iso(now)}),
        ("POST", "/api/v1/policies", low_sm_policy([], name="kept")),
        ("POST", "/api/v1/policies", low_sm_policy([], name="doomed")),
        ("POST", "/api/v1/channels", {"name": "doomed", "type": "slack",
                                      "url": "http://127.0.0.1:9/s"}),
        ("POST", "/api/v1/channels", {"name": "probe", "type": "slack",
                                      "url": "http://127.0.0.1:9/s"}),
        ("POST", "/api/v1/owners", {"kind": "team", "name": "vision",
                                    "email": "vision@example.org"}),
        ("POST", "/api/v1/owners", {"kind": "user", "name": "doomed", "slack": "U0DOOMED"}),
        ("POST", "/api/v1/silences", {"matchers": {"policy": "kept"}, "comment": "c",
                                      "ends_at": iso(now + timedelta(hours=1))}),
    ]  # fmt: skip
    for method, path, body in setup:
        r = http.request(method, path, json=body, headers=admin)
        assert r.status_code == 201, r.text
    return callers


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_role_matrix(
    case: Case, app: FastAPI, http: httpx.Client, world: dict[str, str], clock: FakeClock
) -> None:
    if case.setup is not None:
        case.setup(app)
    got = {}
    for caller in CALLERS:
        if caller in PERSONS:
            headers = PERSON_HEADERS[caller]
        else:
            headers = {} if caller == "none" else {"Authorization": f"Bearer {world[caller]}"}
        body = case.body(caller, clock()) if case.body is not None else None
        r = http.request(case.method, case.path, json=body, params=case.params, headers=headers)
        got[caller] = r.status_code
    assert got == with_people(case.expect)


def test_the_reported_hijack_leaves_the_victims_job_alone(
    http: httpx.Client, world: dict[str, str], clock: FakeClock
) -> None:
    attacker = {"Authorization": f"Bearer {world['agent']}"}  # node-a; slurm:2 runs on node-b
    steps = [
        ("POST", "/api/v1/jobs", _hijack_without_gpus("", clock())),
        ("POST", "/api/v1/jobs", _hijack_with_own_gpu("", clock())),
        ("PATCH", "/api/v1/jobs/slurm:2", {"user": "mallory", "team": "hijacked"}),
        ("PATCH", "/api/v1/jobs/slurm:2", {"project": "stolen", "labels": {"x": "y"}}),
        ("PATCH", "/api/v1/jobs/slurm:2", {"ended_at": iso(clock())}),
        ("POST", "/api/v1/jobs", {"id": "slurm:2", "gpus": ["GPU-b0"], "started_at": iso(clock()),
                                  "ended_at": iso(clock())}),
    ]  # fmt: skip
    for method, path, body in steps:
        r = http.request(method, path, json=body, headers=attacker)
        assert r.status_code in (403, 409), (body, r.status_code, r.text)
    job = http.get("/api/v1/jobs/slurm:2", headers={"Authorization": f"Bearer {world['reader']}"})
    j = job.json()
    assert (j["user"], j["team"], j["project"], j["labels"]) == ("bob", "vision", None, {})
    assert j["ended_at"] is None and j["started_at"] == iso(clock())
    assert [g["gpu_uuid"] for g in j["gpus"]] == ["GPU-b0"]


def test_agent_start_window(http: httpx.Client, world: dict[str, str], clock: FakeClock) -> None:
    agent = {"Authorization": f"Bearer {world['agent']}"}

    def post(job_id: str, started_at: Any) -> httpx.Response:
        body = {"id": job_id, "gpus": ["GPU-a0"], "started_at": iso(started_at)}
        return http.post("/api/v1/jobs", json=body, headers=agent)

    clock.advance(7200)  # GPU-a0 was first seen two hours ago
    r = post("old", clock() - timedelta(minutes=61))
    assert r.status_code == 403 and "started_at" in r.text
    assert post("recent", clock() - timedelta(minutes=59)).status_code == 201
    r = post("future", clock() + timedelta(minutes=10))
    assert r.status_code == 403 and "future" in r.text
    clock.advance(-7200 + 60)  # two minutes after GPU-a0 was first seen (its first sample)
    r = post("before-first-seen", clock() - timedelta(minutes=3))
    assert r.status_code == 403 and "first seen" in r.text
    # The same start on the node's second prolog run is no change; a new label is one.
    r = http.post(
        "/api/v1/jobs",
        json={"id": "slurm:1", "user": "alice", "gpus": ["GPU-a0"], "started_at": iso(clock())},
        headers=agent,
    )
    assert r.status_code == 200, r.text
    r = http.post(
        "/api/v1/jobs",
        json={"id": "slurm:1", "labels": {"k": "v"}, "gpus": ["GPU-a0"],
              "started_at": iso(clock())},
        headers=agent,
    )  # fmt: skip
    assert r.status_code == 409 and "labels.k" in r.text


def test_each_nodes_prolog_at_the_same_moment_joins_one_job(
    server: str, world: dict[str, str], clock: FakeClock
) -> None:
    # Every node of a multi-node job runs its prolog at once: whichever creates the job, the
    # other merges its GPUs into it (never a 500 from the race on the job's id).
    barrier = threading.Barrier(2)
    codes: list[int] = []

    def prolog(token: str, gpu: str, job_id: str) -> None:
        body = {"id": job_id, "user": "alice", "team": "vision", "gpus": [gpu],
                "started_at": iso(clock())}  # fmt: skip
        with httpx.Client(base_url=server, timeout=30) as client:
            barrier.wait()
            r = client.post("/api/v1/jobs", json=body, headers={"Authorization": f"Bearer {token}"})
            codes.append(r.status_code)

    for i in range(10):
        threads = [
            threading.Thread(target=prolog, args=(world["agent"], "GPU-a0", f"mn:{i}")),
            threading.Thread(target=prolog, args=(world["other_agent"], "GPU-b0", f"mn:{i}")),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(codes) == [200] * 10 + [201] * 10, codes
    reader = {"Authorization": f"Bearer {world['reader']}"}
    with httpx.Client(base_url=server, timeout=30) as client:
        for i in range(10):
            job = client.get(f"/api/v1/jobs/mn:{i}", headers=reader).json()
            assert sorted(g["gpu_uuid"] for g in job["gpus"]) == ["GPU-a0", "GPU-b0"]
            assert (job["user"], job["team"]) == ("alice", "vision")


def test_an_agent_fills_what_an_observed_job_lacks_but_changes_nothing_set(
    http: httpx.Client, world: dict[str, str], clock: FakeClock
) -> None:
    agent = {"Authorization": f"Bearer {world['agent']}"}
    # The job is first known from a process hint on node-a: user only, no team.
    batch = make_batch(start=clock())
    batch["processes"] = [
        {"gpu_uuid": "GPU-a0", "ts": iso(clock()), "pid": 7, "job_id": "slurm:9", "user": "carol"}
    ]
    assert http.post("/api/v1/ingest", json=batch, headers=agent).status_code == 200
    body = {"id": "slurm:9", "user": "carol", "team": "vision", "labels": {"partition": "gpu"},
            "gpus": ["GPU-a0"], "started_at": iso(clock())}  # fmt: skip
    r = http.post("/api/v1/jobs", json=body, headers=agent)
    assert r.status_code == 200, r.text
    assert (r.json()["team"], r.json()["labels"]) == ("vision", {"partition": "gpu"})
    for change in ({"user": "mallory"}, {"team": "hijacked"}):
        r = http.post("/api/v1/jobs", json=body | change, headers=agent)
        assert r.status_code == 409, r.text
