"""Job ids of any printable character (Kubernetes ``k8s:<namespace>/<pod>``; under a prefix of
no scheduler GPU Warden drives, ``|``, ``?``, ``#``, ``%``, spaces, unicode) through REST, the
CLI, the console's job route and every alert link."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import quote, unquote, urlsplit

import httpx
import pytest

from service.cli.main import main
from service.notify import alertmanager, slack
from service.notify.base import Notification
from service.usecases.evaluation import evaluate_once
from service.usecases.outbox import Dispatcher
from service.usecases.upkeep import rollup_once
from tests.alerting_support import SECRET, add_price, auth, ingest, low_sm_policy
from tests.receivers import Receiver
from tests.support import FakeClock, iso

ODD_IDS = [
    "k8s:default/cuda-75454ffb9f-8ljq7",
    "ray:ml team/train?x=1#frag",
    "a|b%2Fc%d",
    "lsf:42 ü/λ",
]


def _path(job_id: str) -> str:
    return "/api/v1/jobs/" + quote(job_id, safe="")


@pytest.mark.parametrize("job_id", ODD_IDS)
def test_rest_cli_and_console_take_any_job_id(
    capsys, http: httpx.Client, server: str, tokens, clock: FakeClock, job_id: str
) -> None:
    start = clock() - timedelta(minutes=5)
    ingest(http, tokens["agent"], start=start, count=10, metrics={"sm_active": 0.5})
    # An agent registers its jobs from the moment its GPUs are known.
    body = {"id": job_id, "user": "alice", "gpus": ["GPU-a0"], "started_at": iso(clock())}
    r = http.post("/api/v1/jobs", json=body, headers=auth(tokens["agent"]))
    assert r.status_code == 201, r.text

    got = http.get(_path(job_id), headers=auth(tokens["reader"]))
    assert got.status_code == 200, got.text
    assert got.json()["id"] == job_id
    clock.advance(60)
    ended = http.patch(
        _path(job_id), json={"ended_at": iso(clock())}, headers=auth(tokens["agent"])
    )
    assert ended.status_code == 200, ended.text
    assert ended.json()["ended_at"] is not None
    missing = http.get(_path(job_id + "/x"), headers=auth(tokens["reader"]))
    assert missing.status_code == 404 and job_id + "/x" in missing.json()["detail"]

    assert main(["job", job_id, "--url", server, "--token", tokens["reader"]]) == 0
    assert capsys.readouterr().out.startswith(f"Job {job_id} (user alice)")

    page = http.get("/jobs/" + quote(job_id, safe=""))
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]


def test_alert_links_are_encoded_and_open_the_console_pages(
    app, http: httpx.Client, server: str, tokens, engine, clock: FakeClock
) -> None:
    job_id = "ray:default/cuda-75454ffb9f|x?y#z"
    ctx = app.state.ctx
    ctx.settings.webhook_allow_nets = "127.0.0.0/8"
    ctx.settings.public_url = server
    admin = auth(tokens["admin"])
    receiver = Receiver()
    try:
        hook = {"name": "hook", "type": "webhook", "url": receiver.url + "/in", "secret": SECRET}
        assert http.post("/api/v1/channels", json=hook, headers=admin).status_code == 201
        policy = low_sm_policy(["hook"])
        assert http.post("/api/v1/policies", json=policy, headers=admin).status_code == 201
        start = clock() - timedelta(minutes=4)
        ingest(http, tokens["agent"], start=start, count=24, metrics={"sm_active": 0.1})
        body = {"id": job_id, "user": "alice", "gpus": ["GPU-a0"], "started_at": iso(start)}
        assert http.post("/api/v1/jobs", json=body, headers=admin).status_code == 201
        add_price(engine, "*H100*", 4.0, start)
        rollup_once(ctx)
        assert evaluate_once(ctx).notifications == 1
        assert Dispatcher(ctx).drain() == 1
        (got,) = receiver.wait_for(1)
    finally:
        receiver.close()
    payload = got.json()["data"]
    report, alert = payload["report_url"], payload["alert_url"]
    note = Notification(
        delivery_id="d1", kind="firing", status="firing", policy="low-sm-activity",
        severity="warning", metric="sm_active", aggregate="avg", window="5m", op="<",
        threshold=0.3, value=0.1, scope="job", scope_key=job_id, labels=payload["labels"],
        active_since=start, report_url=report, alert_url=alert,
    )  # fmt: skip
    # The job page of the console, its id one percent-encoded path segment.
    parts = urlsplit(report)
    assert parts.path == "/jobs/" + quote(job_id, safe="") and not parts.query
    assert not parts.fragment and unquote(parts.path.removeprefix("/jobs/")) == job_id
    assert "/api/" not in report and "/api/" not in alert
    for url in (report, alert):
        page = http.get(url)
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert urlsplit(alert).path == "/alerts"
    (fired,) = http.get("/api/v1/alerts", headers=admin).json()
    assert urlsplit(alert).fragment == f"alert-{fired['id']}"
    # Slack's link syntax <url|label> breaks on a raw '|'; Alertmanager gets the same links.
    links = slack.render(note)["blocks"][-1]["elements"][0]["text"]
    assert links == f"<{report}|Job report> · <{alert}|Alert>"
    (am,) = alertmanager.render(note)
    assert am["annotations"]["report_url"] == report and am["generatorURL"] == alert
