"""Policies, channels, silences and alerts over real HTTP on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timedelta

import httpx
import pytest
from sqlalchemy import Connection, Engine, select
from standardwebhooks.webhooks import Webhook

from service.db.schema import outbox
from service.thresholds.policy import parse_policy
from service.usecases.evaluation import evaluate_once
from service.usecases.outbox import Dispatcher
from tests.alerting_support import SECRET, add_job, add_price, auth, ingest, low_sm_policy
from tests.receivers import Receiver
from tests.support import FakeClock, iso


def test_policy_crud_with_the_yaml_messages(http: httpx.Client, tokens) -> None:
    admin, reader = auth(tokens["admin"]), auth(tokens["reader"])
    policy = low_sm_policy([])
    r = http.post("/api/v1/policies", json=policy, headers=admin)
    assert r.status_code == 201, r.text
    assert r.json()["for"] == "0s"
    assert http.post("/api/v1/policies", json=policy, headers=admin).status_code == 409
    assert http.post("/api/v1/policies", json=policy, headers=reader).status_code == 403

    bad = policy | {"name": "x", "metric": "sm_util"}
    r = http.post("/api/v1/policies", json=bad, headers=admin)
    assert r.status_code == 422
    (detail,) = r.json()["detail"]
    assert detail["loc"] == ["body", "metric"]
    try:
        parse_policy(bad)
    except Exception as exc:
        assert detail["msg"] == exc.message  # type: ignore[attr-defined]
    r = http.post("/api/v1/policies", json=policy | {"name": "y", "for": "soon"}, headers=admin)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "for"]
    r = http.post(
        "/api/v1/policies", json=policy | {"name": "z", "channels": ["nope"]}, headers=admin
    )
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "channels", 0]

    listed = http.get("/api/v1/policies", headers=reader).json()
    assert [p["name"] for p in listed] == ["low-sm-activity"]
    r = http.put(
        "/api/v1/policies/low-sm-activity", json=policy | {"threshold": 0.2}, headers=admin
    )
    assert r.status_code == 200 and r.json()["threshold"] == 0.2
    r = http.put("/api/v1/policies/other", json=policy, headers=admin)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "name"]
    assert http.get("/api/v1/policies/low-sm-activity", headers=reader).json()["threshold"] == 0.2
    assert http.delete("/api/v1/policies/low-sm-activity", headers=admin).status_code == 204
    assert http.get("/api/v1/policies/low-sm-activity", headers=reader).status_code == 404


def test_channels_hide_secrets_and_refuse_private_urls(app, http: httpx.Client, tokens) -> None:
    admin = auth(tokens["admin"])
    hook = {"name": "hook", "type": "webhook", "url": "http://127.0.0.1:9/x", "secret": SECRET}
    r = http.post("/api/v1/channels", json=hook, headers=admin)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "url"]
    assert "loopback" in r.json()["detail"][0]["msg"]
    app.state.ctx.settings.webhook_allow_nets = "127.0.0.0/8"
    r = http.post("/api/v1/channels", json=hook, headers=admin)
    assert r.status_code == 201, r.text
    meta = {"name": "meta", "type": "webhook", "url": "http://169.254.169.254/latest"}
    r = http.post("/api/v1/channels", json=meta, headers=admin)
    assert r.status_code == 422 and "link-local" in r.text
    slack = {"name": "slack", "type": "slack", "url": "http://127.0.0.1:9/services/T0/B0/sEcReT"}
    assert http.post("/api/v1/channels", json=slack, headers=admin).status_code == 201
    listing = http.get("/api/v1/channels", headers=auth(tokens["reader"]))
    assert SECRET not in listing.text and "sEcReT" not in listing.text
    assert {c["name"]: c["has_secret"] for c in listing.json()} == {"hook": True, "slack": False}
    r = http.post("/api/v1/channels/slack/test", headers=admin)  # nothing listens on port 9
    assert r.status_code == 502 and r.json()["delivered"] is False
    assert "sEcReT" not in r.text and "network error" in r.json()["error"]


def test_silences(http: httpx.Client, tokens, clock: FakeClock) -> None:
    admin = auth(tokens["admin"])
    body = {
        "matchers": {"policy": "low-sm-activity", "job": "slurm:*"},
        "ends_at": iso(clock() + timedelta(hours=2)),
        "comment": "maintenance",
    }
    r = http.post("/api/v1/silences", json=body, headers=admin)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    assert r.json()["status"] == "active"
    # The earlier label name is read as the one vocabulary's.
    assert r.json()["matchers"] == {"policy": "low-sm-activity", "job_id": "slurm:*"}
    r = http.post(
        "/api/v1/silences",
        json=body | {"ends_at": iso(clock() - timedelta(hours=1))},
        headers=admin,
    )
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "ends_at"]
    assert (
        http.post("/api/v1/silences", json=body | {"matchers": {}}, headers=admin).status_code
        == 422
    )
    assert http.delete(f"/api/v1/silences/{sid}", headers=admin).status_code == 204
    (s,) = http.get("/api/v1/silences", headers=auth(tokens["reader"])).json()
    assert s["status"] == "expired"
    assert http.delete("/api/v1/silences/999", headers=admin).status_code == 404


def _low_sm_job(
    http: httpx.Client,
    engine: Engine,
    tokens: dict[str, str],
    start: datetime,
    hook: dict[str, str],
    job_id: str,
    metrics: dict[str, float],
) -> datetime:
    """Channel ``hook`` and the low-SM policy sending to it; job ``job_id`` on GPU-a0 and GPU-a1
    with ``metrics`` for 4 minutes from ``start``; returns ``start``."""
    admin = auth(tokens["admin"])
    assert http.post("/api/v1/channels", json=hook, headers=admin).status_code == 201
    policy = low_sm_policy(["hook"])
    assert http.post("/api/v1/policies", json=policy, headers=admin).status_code == 201
    ingest(http, tokens["agent"], start=start, count=24, metrics=metrics,
           gpu_uuids=("GPU-a0", "GPU-a1"))  # fmt: skip
    add_job(engine, job_id, ("GPU-a0", "GPU-a1"), started_at=start)
    return start


def test_job_alert_fires_notifies_signed_and_resolves(
    app, http: httpx.Client, tokens, engine, clock: FakeClock
) -> None:
    ctx = app.state.ctx
    ctx.settings.webhook_allow_nets = "127.0.0.0/8"
    ctx.settings.public_url = "https://warden.example"
    agent = tokens["agent"]
    receiver = Receiver()
    try:
        hook = {"name": "hook", "type": "webhook", "url": receiver.url + "/in", "secret": SECRET}
        low = {"sm_active": 0.1, "gpu_util": 0.3, "fb_used_bytes": 2**34}
        start = _low_sm_job(http, engine, tokens, clock() - timedelta(minutes=4), hook,
                            "slurm:42", low)  # fmt: skip
        add_price(engine, "*H100*", 4.0, start)
        from service.usecases.upkeep import rollup_once

        rollup_once(ctx)
        first = evaluate_once(ctx)
        assert first.notifications == 1 and first.by_kind == {"firing": 1}
        dispatcher = Dispatcher(ctx)
        assert dispatcher.drain() == 1
        (got,) = receiver.wait_for(1)
        payload = Webhook(SECRET).verify(got.body, got.headers)["data"]
        assert got.path == "/in"
        assert payload["policy"] == "low-sm-activity" and payload["state"] == "firing"
        assert payload["labels"]["job_id"] == "slurm:42" and payload["labels"]["user"] == "alice"
        assert payload["value"] == pytest.approx(0.1) and payload["threshold"] == 0.3
        # 2 GPUs x ~4 min launch-bound (kernels 30% of the time, SMs 10% full) at $4/h: the
        # alert says the job's waste as its page does, nearly all of it fixable (CUDA graphs).
        job = http.get("/api/v1/jobs/slurm:42", headers=auth(tokens["reader"])).json()
        assert payload["waste_usd"] == pytest.approx(job["summary"]["waste_usd"], abs=0.01)
        assert payload["fixable_usd"] == pytest.approx(job["summary"]["fixable_usd"], abs=0.01)
        assert 0.2 < payload["waste_usd"] < 0.6
        assert payload["fixable_usd"] == pytest.approx(payload["waste_usd"], abs=0.02)
        assert payload["top_cause"] == "launch_bound" and payload["fix_saving_usd"] > 0
        assert "wasted_usd" not in payload and "dominant_cause" not in payload
        assert payload["report_url"] == "https://warden.example/jobs/slurm%3A42"

        # Another round within repeat_interval: nothing new.
        clock.advance(30)
        assert evaluate_once(ctx).notifications == 0
        alerts = http.get(
            "/api/v1/alerts",
            params={"state": "firing", "job": "slurm:42"},
            headers=auth(tokens["reader"]),
        ).json()
        assert len(alerts) == 1 and alerts[0]["labels"]["team"] == "ml"
        assert [(h["from_state"], h["to_state"]) for h in alerts[0]["history"]] == [
            ("inactive", "pending"),
            ("pending", "firing"),
        ]
        # The job gets busy: the alert resolves and says so.
        ingest(
            http,
            agent,
            start=clock() - timedelta(seconds=5),
            count=1,
            metrics={"sm_active": 0.95},
            gpu_uuids=("GPU-a0", "GPU-a1"),
        )
        clock.advance(300)
        ingest(
            http,
            agent,
            start=clock() - timedelta(seconds=60),
            count=6,
            metrics={"sm_active": 0.95},
            gpu_uuids=("GPU-a0", "GPU-a1"),
        )
        assert evaluate_once(ctx).by_kind == {"resolved": 1}
        dispatcher.drain()
        got = receiver.wait_for(2)[1]
        assert Webhook(SECRET).verify(got.body, got.headers)["data"]["state"] == "resolved"
        assert got.headers["webhook-id"] != receiver.received[0].headers["webhook-id"]
        (a,) = http.get(
            "/api/v1/alerts", params={"policy": "low-sm-activity"}, headers=auth(tokens["reader"])
        ).json()
        assert a["state"] == "resolved" and a["history"][-1]["to_state"] == "resolved"
        metrics = http.get("/metrics").text
        assert 'gpuwarden_notifications_total{channel="hook",outcome="sent"} 2.0' in metrics
    finally:
        receiver.close()


def test_hardware_fault_inhibits_low_use_and_silence_shows_silenced(
    app, http: httpx.Client, tokens, engine, clock: FakeClock
) -> None:
    ctx = app.state.ctx
    ctx.settings.webhook_allow_nets = "127.0.0.0/8"
    admin, agent = auth(tokens["admin"]), tokens["agent"]
    receiver = Receiver()
    try:
        hook = {"name": "hook", "type": "webhook", "url": receiver.url, "secret": SECRET}
        assert http.post("/api/v1/channels", json=hook, headers=admin).status_code == 201
        low = low_sm_policy(["hook"], scope="gpu")
        hw = {
            "name": "hw",
            "metric": "hardware_fault",
            "aggregate": "max",
            "window": "5m",
            "op": ">=",
            "threshold": 1,
            "for": "0s",
            "severity": "critical",
            "channels": ["hook"],
        }
        hot = {
            "name": "hot",
            "metric": "temperature_celsius",
            "window": "1m",
            "op": ">",
            "threshold": 85,
            "channels": ["hook"],
        }
        for p in (low, hw, hot):
            assert http.post("/api/v1/policies", json=p, headers=admin).status_code == 201, p
        ingest(
            http,
            agent,
            start=clock() - timedelta(minutes=2),
            count=10,
            metrics={"sm_active": 0.0, "temperature_celsius": 90.0},
            gpu_uuids=("GPU-a0", "GPU-a1"),
        )
        ingest(
            http,
            agent,
            start=clock() - timedelta(seconds=1),
            count=1,
            metrics={"sm_active": 0.0, "xid_last": 79, "temperature_celsius": 90.0},
        )
        r = http.post(
            "/api/v1/silences",
            headers=admin,
            json={
                "matchers": {"policy": "hot", "gpu_uuid": "GPU-a1"},
                "ends_at": iso(clock() + timedelta(hours=1)),
                "comment": "known hot slot",
            },
        )
        assert r.status_code == 201
        evaluate_once(ctx)
        assert Dispatcher(ctx).drain() == 3  # synchronous: everything due is sent on return
        assert len(receiver.received) == 3
        got = sorted(
            (p["policy"], p["labels"]["gpu_uuid"])
            for p in (x.json()["data"] for x in receiver.wait_for(3))
        )
        assert got == [("hot", "GPU-a0"), ("hw", "GPU-a0"), ("low-sm-activity", "GPU-a1")]
        alerts = http.get("/api/v1/alerts", params={"state": "firing"}, headers=admin).json()
        flags = {
            (a["policy"], a["labels"]["gpu_uuid"]): (a["suppressed"], a["silenced"]) for a in alerts
        }
        assert flags[("low-sm-activity", "GPU-a0")] == (True, False)
        assert flags[("hot", "GPU-a1")] == (False, True)
        assert len(alerts) == 5
        assert 'gpuwarden_alerts_firing{severity="critical"} 1.0' in http.get("/metrics").text
    finally:
        receiver.close()


def test_config_file_policies_load_at_start_and_resync(engine, tmp_path, monkeypatch) -> None:
    from pathlib import Path

    from service.api.app import create_app
    from service.settings import Settings
    from tests.conftest import make_token
    from tests.support import live_server

    example = Path(__file__).parents[2] / "deploy" / "examples" / "gpuwarden.yaml"
    monkeypatch.setenv("SLACK_WEBHOOK_URL", "https://hooks.slack.com/services/T/B/secretpart")
    monkeypatch.setenv("GPUWARDEN_WEBHOOK_SECRET", SECRET)
    settings = Settings(
        database_url=str(engine.url.render_as_string(hide_password=False)),
        run_scheduler=False,
        config=example,
    )
    reader = auth(make_token(engine, "reader"))
    admin = auth(make_token(engine, "admin"))
    with (
        live_server(create_app(settings, engine=engine)) as url,
        httpx.Client(base_url=url) as http,
    ):
        names = [p["name"] for p in http.get("/api/v1/policies", headers=reader).json()]
        assert names == [
            "allocated-idle-gpu",
            "gpu-hardware-fault",
            "hot-gpu",
            "hung-gpu",
            "idle-held-gpu",
            "low-sm-activity",
            "node-silent",
            "sham-gpu",
        ]
        channels = http.get("/api/v1/channels", headers=reader)
        assert "secretpart" not in channels.text and SECRET not in channels.text
        mine = low_sm_policy([], name="api-made")
        assert http.post("/api/v1/policies", json=mine, headers=admin).status_code == 201
    smaller = tmp_path / "smaller.yaml"
    smaller.write_text(
        "policies:\n  - {name: hot-gpu, metric: temperature_celsius, op: '>', threshold: 80}\n"
    )
    settings.config = smaller
    with (
        live_server(create_app(settings, engine=engine)) as url,
        httpx.Client(base_url=url) as http,
    ):
        got = {
            p["name"]: p["threshold"] for p in http.get("/api/v1/policies", headers=reader).json()
        }
        assert got == {"hot-gpu": 80.0, "api-made": 0.3}  # file ones re-synced, API ones kept
        assert http.get("/api/v1/channels", headers=reader).json() == []


def test_long_windows_read_minute_rollups(
    app, http: httpx.Client, tokens, clock: FakeClock
) -> None:
    from service.usecases.upkeep import rollup_once

    ctx = app.state.ctx
    admin = auth(tokens["admin"])
    start = clock() - timedelta(hours=2)
    # 2 h at 60 s: the first hour idle-held (0.0, 20 GiB), the second busy (0.8) -> avg 0.4
    ingest(
        http,
        tokens["agent"],
        start=start,
        count=60,
        metrics={"sm_active": 0.0, "fb_used_bytes": 20 * 2**30},
    )
    ingest(
        http,
        tokens["agent"],
        start=start + timedelta(hours=1),
        count=60,
        metrics={"sm_active": 0.8, "fb_used_bytes": 20 * 2**30},
    )
    rollup_once(ctx)
    for name, metric, agg, op, threshold in [
        ("avg2h", "sm_active", "avg", "<", 0.5),
        ("min2h", "sm_active", "min", "<=", 0.0),
        ("held2h", "idle_held", "avg", ">=", 0.45),
    ]:
        policy = {
            "name": name,
            "metric": metric,
            "aggregate": agg,
            "window": "2h",
            "op": op,
            "threshold": threshold,
        }
        assert http.post("/api/v1/policies", json=policy, headers=admin).status_code == 201
    evaluate_once(ctx)
    alerts = {a["policy"]: a["value"] for a in http.get("/api/v1/alerts", headers=admin).json()}
    assert alerts["avg2h"] == pytest.approx(0.4, abs=0.01)
    assert alerts["min2h"] == 0.0
    assert alerts["held2h"] == pytest.approx(0.5, abs=0.02)  # idle-held seconds / covered seconds


def test_a_failing_dollar_query_leaves_the_job_alert_to_go_out_without_dollars(
    app, http: httpx.Client, tokens, engine, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dollars are read apart from the round's write transaction: a statement that fails
    there (on PostgreSQL it would abort the whole transaction) costs the figure, not the alert."""
    from service.usecases.evaluation import notes as evaluation

    ctx = app.state.ctx
    ctx.settings.webhook_allow_nets = "127.0.0.0/8"
    hook = {"name": "hook", "type": "webhook", "url": "http://127.0.0.1:9/in"}  # never drained
    _low_sm_job(http, engine, tokens, clock() - timedelta(minutes=4), hook, "slurm:43",
                {"sm_active": 0.1})  # fmt: skip
    asked: list[str] = []

    def broken_dollars(conn: Connection, *, job_id: str, **_: object) -> dict[str, object]:
        asked.append(job_id)
        conn.exec_driver_sql("SELECT no_such_column FROM no_such_table")
        raise AssertionError("unreachable")

    monkeypatch.setattr(evaluation, "job_verdict", broken_dollars)
    result = evaluate_once(ctx)
    assert asked == ["slurm:43"]
    assert result.by_kind == {"firing": 1} and result.notifications == 1
    with engine.connect() as conn:
        (payload,) = conn.execute(select(outbox.c.payload)).scalars()
    assert payload["labels"]["job_id"] == "slurm:43" and payload["waste_usd"] is None


def test_notification_and_policy_counters_start_at_zero(app, http: httpx.Client, tokens) -> None:
    # Before any delivery or failure: increase() over these then sees the first one.
    ctx = app.state.ctx
    ctx.settings.webhook_allow_nets = "127.0.0.0/8"
    admin = auth(tokens["admin"])
    hook = {"name": "hook", "type": "webhook", "url": "http://127.0.0.1:9/in"}
    assert http.post("/api/v1/channels", json=hook, headers=admin).status_code == 201
    policy = low_sm_policy(["hook"])
    assert http.post("/api/v1/policies", json=policy, headers=admin).status_code == 201
    evaluate_once(ctx)
    text = http.get("/metrics").text
    for outcome in ("sent", "retry", "failed"):
        assert f'gpuwarden_notifications_total{{channel="hook",outcome="{outcome}"}} 0.0' in text
    line = f'gpuwarden_policy_evaluation_failures_total{{policy="{policy["name"]}"}} 0.0'
    assert line in text


def test_a_new_silence_marks_open_alerts_silenced_before_the_next_evaluation(
    app, http: httpx.Client, tokens, clock: FakeClock
) -> None:
    admin = auth(tokens["admin"])
    hot = {"name": "hot", "metric": "temperature_celsius", "window": "1m", "op": ">",
           "threshold": 85, "channels": []}  # fmt: skip
    assert http.post("/api/v1/policies", json=hot, headers=admin).status_code == 201
    ingest(http, tokens["agent"], start=clock() - timedelta(minutes=2), count=10,
           metrics={"temperature_celsius": 90.0}, gpu_uuids=("GPU-a0", "GPU-a1"))  # fmt: skip
    evaluate_once(app.state.ctx)

    def flags() -> dict[str, bool]:
        alerts = http.get("/api/v1/alerts", params={"policy": "hot"}, headers=admin).json()
        return {a["labels"]["gpu_uuid"]: a["silenced"] for a in alerts}

    assert flags() == {"GPU-a0": False, "GPU-a1": False}
    r = http.post(
        "/api/v1/silences",
        headers=admin,
        json={"matchers": {"policy": "h*", "gpu_uuid": "GPU-a1"},
              "ends_at": iso(clock() + timedelta(hours=1)), "comment": "known hot slot"},
    )  # fmt: skip
    assert r.status_code == 201, r.text
    # No evaluation ran since: the alerts read shows the silence already.
    assert flags() == {"GPU-a0": False, "GPU-a1": True}
    (one,) = [a for a in http.get("/api/v1/alerts", headers=admin).json()
              if a["labels"]["gpu_uuid"] == "GPU-a1"]  # fmt: skip
    assert http.get(f"/api/v1/alerts/{one['id']}", headers=admin).json()["silenced"] is True
    assert http.delete(f"/api/v1/silences/{r.json()['id']}", headers=admin).status_code == 204
    assert flags() == {"GPU-a0": False, "GPU-a1": False}


def test_a_gpu_alert_links_the_report_of_the_one_job_holding_its_gpu(
    app, http: httpx.Client, tokens, engine, clock: FakeClock
) -> None:
    ctx = app.state.ctx
    ctx.settings.webhook_allow_nets = "127.0.0.0/8"
    ctx.settings.public_url = "https://warden.example"
    admin = auth(tokens["admin"])
    hook = {"name": "hook", "type": "webhook", "url": "http://127.0.0.1:9/in"}  # never drained
    assert http.post("/api/v1/channels", json=hook, headers=admin).status_code == 201
    policy = low_sm_policy(["hook"], name="low-sm-gpu", scope="gpu")
    assert http.post("/api/v1/policies", json=policy, headers=admin).status_code == 201
    start = clock() - timedelta(minutes=4)
    held = ("GPU-a0", "GPU-a1", "GPU-a2")
    ingest(http, tokens["agent"], start=start, count=24, metrics={"sm_active": 0.1},
           gpu_uuids=held)  # fmt: skip
    add_job(engine, "k8s:ml/train-1", ("GPU-a0",), started_at=start)
    add_job(engine, "slurm:45", ("GPU-a1",), started_at=start)
    add_job(engine, "slurm:46", ("GPU-a1",), started_at=start, user="bob")
    assert evaluate_once(ctx).by_kind == {"firing": 3}
    with engine.connect() as conn:
        payloads = conn.execute(select(outbox.c.payload)).scalars().all()
    links = {p["labels"]["gpu_uuid"]: p["report_url"] for p in payloads}
    # One holder: its report, as a job alert links it; two holders or none: no one report.
    assert links == {
        "GPU-a0": "https://warden.example/jobs/k8s%3Aml%2Ftrain-1",
        "GPU-a1": None,
        "GPU-a2": None,
    }
