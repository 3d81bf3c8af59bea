"""``gpuwarden_actions_total`` on /metrics: the audit log's steps by policy, action and outcome,
the same on every replica (it is read from the stored log), from 0 for each laddered policy."""

from __future__ import annotations

import httpx
from sqlalchemy import Engine

from service.api.app import create_app
from tests.alerting_support import auth, low_sm_policy
from tests.integration.actions_metrics_support import actions
from tests.integration.actions_support import record_steps
from tests.support import FakeClock, live_server

LADDER = {"steps": [{"action": "notify_owner", "after": "60m"},
                    {"action": "reclaim", "after": "120m"}]}  # fmt: skip


def test_steps_are_counted_from_the_log_alike_on_every_replica(
    app, http: httpx.Client, tokens, engine: Engine, settings, clock: FakeClock
) -> None:
    body = low_sm_policy([], name="gpu-idle", ladder=LADDER)
    r = http.post("/api/v1/policies", json=body, headers=auth(tokens["admin"]))
    assert r.status_code == 201, r.text
    before = actions(http)
    # A laddered policy's series exist at 0 before its first step; none for other policies.
    assert before[("gpu-idle", "reclaim", "reclaimed")] == 0
    assert before[("gpu-idle", "notify_owner", "warned")] == 0
    assert {p for p, _, _ in before} == {"gpu-idle"}
    record_steps(engine, clock())
    counted = actions(http)
    assert counted[("gpu-idle", "notify_owner", "warned")] == 2
    assert counted[("gpu-idle", "reclaim", "reclaimed")] == 1
    assert counted[("gpu-idle", "reclaim", "failed")] == 1
    assert counted[("gpu-idle", "reclaim", "gone")] == 0
    # The dry-run policy has no ladder stored here, yet its logged steps are counted.
    assert counted[("held-dry", "reclaim", "would")] == 1
    assert counted[("held-dry", "notify_owner", "skipped")] == 1
    assert sum(counted.values()) == 6
    # Another replica on the same database, which never acted, says the same.
    with (
        live_server(create_app(settings, engine=engine, clock=clock)) as other,
        httpx.Client(base_url=other, timeout=30) as second,
    ):
        assert actions(second) == counted
