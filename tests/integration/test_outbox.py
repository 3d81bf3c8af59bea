"""The durable outbox against a real loopback receiver: the delivery table for notifications."""

from __future__ import annotations

import itertools
import random
import re
import ssl
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import select, text

from service.db import outbox_repo, policies_repo
from service.db.schema import outbox
from service.errors import ValidationFailed
from service.notify import Notification
from service.notify.egress import egress_from
from service.notify.pinned import PinnedTransport
from service.thresholds.policy import ChannelSpec
from service.usecases.outbox import Dispatcher
from tests.alerting_support import running_service
from tests.receivers import ForwardProxy, Receiver
from tests.support import FakeClock, self_signed_cert

PAYLOAD = {
    "kind": "firing",
    "status": "firing",
    "policy": "p",
    "severity": "warning",
    "metric": "sm_active",
    "aggregate": "avg",
    "window": "5m",
    "op": "<",
    "threshold": 0.3,
    "value": 0.1,
    "scope": "gpu",
    "scope_key": "gpu:GPU-a0",
    "labels": {"gpu_uuid": "GPU-a0", "node": "node-a"},
    "active_since": "2026-12-02T08:00:00+00:00",
}


@pytest.fixture
def ctx(app):
    ctx = app.state.ctx
    ctx.settings.webhook_allow_nets = "127.0.0.0/8"
    return ctx


def setup_channel(ctx, url: str, ctype: str = "webhook", rate: float | None = None) -> None:
    with ctx.engine.begin() as conn:
        policies_repo.create_channel(
            conn,
            channel=ChannelSpec(name="c", type=ctype, url=url, rate_limit_per_second=rate),
            source="api",
            now=ctx.clock(),
        )


def queue(ctx, n: int = 1) -> list[str]:
    ids = [f"msg_{uuid.uuid4().hex}" for _ in range(n)]
    with ctx.engine.begin() as conn:
        outbox_repo.enqueue(
            conn,
            [
                {
                    "delivery_id": i,
                    "channel": "c",
                    "alert_id": None,
                    "payload": PAYLOAD | {"delivery_id": i},
                }
                for i in ids
            ],
            now=ctx.clock(),
        )
    return ids


def rows(ctx):
    with ctx.engine.connect() as conn:
        return list(conn.execute(select(outbox).order_by(outbox.c.id)))


def test_retries_5xx_and_429_with_retry_after_then_delivers_with_same_id(
    ctx, receiver: Receiver, clock: FakeClock
) -> None:
    receiver.script = [(503, {}), (429, {"Retry-After": "120"})]
    setup_channel(ctx, receiver.url)
    (mid,) = queue(ctx)
    d = Dispatcher(ctx, rng=random.Random(0))
    assert d.drain() == 0
    (r,) = rows(ctx)
    assert (r.status, r.attempts, r.last_error) == ("pending", 1, "webhook channel c: HTTP 503")
    first_delay = (r.next_attempt_at - clock()).total_seconds()
    assert 1.0 <= first_delay <= 2.0
    assert d.drain() == 0  # not due yet: nothing sent
    assert len(receiver.received) == 1
    clock.advance(first_delay)
    assert d.drain() == 0
    (r,) = rows(ctx)
    assert r.attempts == 2 and "429" in r.last_error
    assert (r.next_attempt_at - clock()).total_seconds() >= 120  # Retry-After honoured
    clock.advance(119)
    assert d.drain() == 0 and len(receiver.received) == 2
    clock.advance(1)
    assert d.drain() == 1
    (r,) = rows(ctx)
    assert (r.status, r.attempts) == ("sent", 3)
    assert [x.headers["webhook-id"] for x in receiver.received] == [mid] * 3
    tel = ctx.telemetry.notifications
    assert tel.labels("c", "retry")._value.get() == 2
    assert tel.labels("c", "sent")._value.get() == 1


@pytest.mark.parametrize("status", [400, 404, 410])
def test_other_4xx_are_failed_at_once_never_retried(
    ctx, receiver: Receiver, clock: FakeClock, status: int
) -> None:
    receiver.script = [(status, {"Location": "http://169.254.169.254/"})]
    setup_channel(ctx, receiver.url)
    queue(ctx)
    Dispatcher(ctx).drain()
    (r,) = rows(ctx)
    assert (r.status, r.attempts) == ("failed", 1)
    assert str(status) in r.last_error
    clock.advance(3600)
    Dispatcher(ctx).drain()
    assert len(receiver.received) == 1  # and the redirect was not followed
    assert ctx.telemetry.notifications.labels("c", "failed")._value.get() == 1


def test_network_errors_are_retried_without_limit(ctx, clock: FakeClock) -> None:
    from tests.support import free_port

    setup_channel(ctx, f"http://127.0.0.1:{free_port()}/")
    queue(ctx)
    d = Dispatcher(ctx)
    for _ in range(20):  # days of a receiver that is down: never given up
        d.drain()
        clock.advance(3600)
    (r,) = rows(ctx)
    assert (r.status, r.attempts) == ("pending", 20)
    assert "network error" in r.last_error


@pytest.mark.parametrize(("status", "headers"), [(401, {}), (403, {}), (302, {"Location": "x"})])
def test_refused_credentials_and_redirects_keep_the_notification_until_fixed(
    ctx, receiver: Receiver, clock: FakeClock, status: int, headers: dict[str, str], caplog
) -> None:
    receiver.script = [(status, headers)] * 5
    setup_channel(ctx, receiver.url)
    (mid,) = queue(ctx)
    d = Dispatcher(ctx, rng=random.Random(0))
    for _ in range(5):
        d.drain()
        clock.advance(3600)
    (r,) = rows(ctx)
    assert (r.status, r.attempts) == ("pending", 5)  # never failed: the operator fixes it
    said = [m for m in caplog.messages if "refused GPU Warden's credentials" in m]
    assert len(said) == 1  # once a minute, not once per attempt
    assert d.drain() == 1  # fixed: the receiver takes it now
    assert [x.headers["webhook-id"] for x in receiver.received] == [mid] * 6


def test_repeated_server_errors_set_a_notification_aside_and_newer_ones_go_first(
    ctx, receiver: Receiver, clock: FakeClock
) -> None:
    receiver.script = [(500, {})] * 3
    setup_channel(ctx, receiver.url)
    (old,) = queue(ctx)
    d = Dispatcher(ctx, rng=random.Random(0))
    waits: list[float] = []
    for _ in range(3):
        clock.advance(waits[-1] if waits else 0)
        d.drain()
        (r,) = rows(ctx)
        waits.append((r.next_attempt_at - clock()).total_seconds())
    assert waits[0] <= 2 and waits[1] <= 4  # backoff, then set aside for a minute or so
    assert 30 <= waits[2] <= 60
    (new,) = queue(ctx)
    assert d.drain() == 1  # the newer notification goes while the old one waits
    clock.advance(waits[2])
    assert d.drain() == 1  # and the old one is delivered later, never dropped
    ids = [x.headers["webhook-id"] for x in receiver.received]
    assert ids == [old, old, old, new, old]
    assert {r.status for r in rows(ctx)} == {"sent"}


def test_queued_deliveries_survive_a_restart(ctx, receiver: Receiver, clock: FakeClock) -> None:
    receiver.script = [(500, {})]
    setup_channel(ctx, receiver.url)
    ids = queue(ctx, 2)
    Dispatcher(ctx).drain(limit=1)  # the "old process" fails once, then dies
    clock.advance(3600)
    fresh = Dispatcher(ctx)  # a new process: only the database carries over
    assert fresh.drain() == 2
    assert sorted({x.headers["webhook-id"] for x in receiver.received}) == sorted(ids)
    assert all(r.status == "sent" for r in rows(ctx))


def test_rate_limit_spaces_messages_per_channel(
    ctx, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup_channel(ctx, receiver.url, ctype="webhook", rate=5.0)
    queue(ctx, 4)
    dispatcher = Dispatcher(ctx)
    # Timed where the dispatcher starts each send: arrival times also carry each request's
    # latency, and the first request pays for its connection (resolved and checked first).
    starts: list[float] = []
    send_now = dispatcher.send_now

    def timed_send(channel: ChannelSpec, note: Notification) -> None:
        starts.append(time.monotonic())
        send_now(channel, note)

    monkeypatch.setattr(dispatcher, "send_now", timed_send)
    assert dispatcher.drain() == 4
    assert len(receiver.wait_for(4)) == 4
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(g >= 0.19 for g in gaps), gaps  # 5/s -> 0.2 s apart


class ScriptedTime:
    """A monotonic clock that moves only when the code under test sleeps on it: what a drain
    does within its budget is then decided by its own arithmetic, never by the machine's load."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_rate_limited_rows_wait_for_the_next_drain(ctx, receiver: Receiver, monkeypatch) -> None:
    setup_channel(ctx, receiver.url, ctype="slack")  # about one message a second
    queue(ctx, 3)
    t = ScriptedTime()
    d = Dispatcher(ctx, monotonic=t, sleep=t.sleep)
    starts: list[float] = []
    send_now = d.send_now

    def timed_send(channel: ChannelSpec, note: Notification) -> None:
        starts.append(t())
        send_now(channel, note)

    monkeypatch.setattr(d, "send_now", timed_send)
    assert d.drain(budget_seconds=0.5) == 1  # the next one is a second away: past the budget
    assert sum(r.status == "pending" for r in rows(ctx)) == 2
    assert d.drain(budget_seconds=5.0) == 2
    assert len(receiver.wait_for(3)) == 3
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(gaps) == 2 and all(g >= 0.99 for g in gaps), gaps


def test_deleted_channel_fails_its_deliveries(ctx, receiver: Receiver) -> None:
    setup_channel(ctx, receiver.url)
    queue(ctx)
    with ctx.engine.begin() as conn:
        policies_repo.delete_channel(conn, name="c")
    Dispatcher(ctx).drain()
    (r,) = rows(ctx)
    assert r.status == "failed" and "no longer exists" in r.last_error


def test_old_finished_deliveries_are_pruned(ctx, receiver: Receiver, clock: FakeClock) -> None:
    setup_channel(ctx, receiver.url)
    queue(ctx, 2)
    d = Dispatcher(ctx)
    assert d.drain() == 2
    clock.advance(8 * 86400)
    queue(ctx, 1)
    receiver.default_status = 500
    d._pruned_at = None  # as if an hour had passed
    d.drain()
    left = rows(ctx)
    assert [r.status for r in left] == ["pending"]  # the old sent ones are gone


def test_a_busy_outbox_is_counted_not_logged_every_tick(engine, caplog) -> None:
    # Deliveries to a slow channel keep the deliver job busy across many 0.2 s ticks; each
    # skipped tick is counted, none is logged.
    slow = Receiver(delay_seconds=0.8)
    try:
        with running_service(engine, outbox_interval_seconds=0.2) as (url, ctx):
            setup_channel(ctx, slow.url + "/hook")
            queue(ctx, 4)
            slow.wait_for(4, timeout=30)
            metrics = httpx.get(url + "/metrics", timeout=10).text
    finally:
        slow.close()
    skipped = re.search(
        r'^gpuwarden_background_job_runs_total\{outcome="skipped",task="deliver"\} (\S+)$',
        metrics,
        re.M,
    )
    assert skipped is not None and float(skipped.group(1)) >= 3, metrics
    noisy = [r for r in caplog.records if "maximum number of running instances" in r.getMessage()]
    assert noisy == []


@pytest.fixture
def proxy(monkeypatch) -> Iterator[ForwardProxy]:
    """A real forward proxy on loopback; the environment's proxy variables cleared."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    p = ForwardProxy()
    yield p
    p.close()


def public_dns(host: str, port: int) -> list[str]:
    """The site's DNS: every name is a public address, except the metadata service's."""
    return ["169.254.169.254"] if host == "metadata.test" else ["93.184.216.34"]


def test_notifications_go_through_the_environments_egress_proxy(
    ctx, receiver: Receiver, proxy: ForwardProxy, monkeypatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    # The proxy is the admin's choice: on loopback, with no GPUWARDEN_WEBHOOK_ALLOW_NETS.
    ctx.settings.webhook_allow_nets = ""
    port = receiver.url.rsplit(":", 1)[1]
    setup_channel(ctx, f"http://hooks.example.test:{port}/hook")
    queue(ctx, 2)
    assert Dispatcher(ctx, resolver=public_dns).drain() == 2
    assert proxy.seen == [f"POST http://hooks.example.test:{port}/hook"] * 2
    assert [r.path for r in receiver.received] == ["/hook", "/hook"]


def test_through_a_proxy_the_url_check_still_judges_the_channel_host(
    ctx, receiver: Receiver, proxy: ForwardProxy
) -> None:
    ctx.settings.notify_proxy_url = proxy.url  # the explicit setting, no environment needed
    ctx.settings.webhook_allow_nets = ""
    setup_channel(ctx, "http://metadata.test/latest/meta-data")
    queue(ctx, 1)
    assert Dispatcher(ctx, resolver=public_dns).drain() == 0
    (row,) = rows(ctx)
    assert row.status == "failed" and "169.254.169.254" in row.last_error
    assert proxy.seen == []


@pytest.mark.parametrize("how", ["no_proxy", "direct"])
def test_no_proxy_and_direct_connect_without_the_proxy(
    ctx, receiver: Receiver, proxy: ForwardProxy, monkeypatch, how: str
) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    if how == "no_proxy":
        monkeypatch.setenv("NO_PROXY", "localhost,.internal.test")
    else:
        ctx.settings.notify_proxy_url = "direct"
    port = receiver.url.rsplit(":", 1)[1]
    setup_channel(ctx, f"http://hooks.internal.test:{port}/hook")
    queue(ctx, 1)
    assert Dispatcher(ctx, resolver=lambda host, port: ["127.0.0.1"]).drain() == 1
    assert proxy.seen == [] and len(receiver.received) == 1


def test_https_goes_through_the_proxy_by_connect_with_tls_to_the_channel_host(
    tmp_path, proxy: ForwardProxy
) -> None:
    # Slack and most webhooks are https: the proxy tunnels, TLS and its certificate check are
    # with the channel's host (hooks.test), not with the proxy.
    cert, key = self_signed_cert(tmp_path, "hooks.test")
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    hook = Receiver(tls=server_tls)
    trust = ssl.create_default_context(cafile=str(cert))
    port = hook.url.rsplit(":", 1)[1]
    try:
        transport = PinnedTransport(
            lambda: [],
            resolver=public_dns,
            egress=egress_from(None, {"HTTPS_PROXY": proxy.url}),
            make_proxied=lambda p: httpx.HTTPTransport(proxy=httpx.Proxy(p), verify=trust),
        )
        with httpx.Client(transport=transport) as client:
            r = client.post(f"https://hooks.test:{port}/hook", content=b"{}")
            assert r.status_code == 200
            with pytest.raises(ValidationFailed):  # the channel host is still judged
                client.post("https://metadata.test/latest", content=b"{}")
    finally:
        hook.close()
    assert proxy.seen == [f"CONNECT hooks.test:{port}"]
    assert [m.headers["host"] for m in hook.received] == [f"hooks.test:{port}"]


@pytest.mark.parametrize(
    "poison",
    ["[" * 5000 + "]" * 5000, '{"kind": "firing"}'],
    ids=["json-too-deep-to-read", "not-a-notification"],
)
def test_a_delivery_that_cannot_be_read_is_set_aside_and_the_others_are_sent(
    ctx, receiver: Receiver, clock: FakeClock, caplog: pytest.LogCaptureFixture, poison: str
) -> None:
    setup_channel(ctx, receiver.url)
    ids = queue(ctx, 3)
    with ctx.engine.begin() as conn:  # written straight into the table, bypassing enqueue
        conn.execute(
            text("UPDATE outbox SET payload = :p WHERE delivery_id = :d"),
            {"p": poison, "d": ids[1]},
        )
    d = Dispatcher(ctx, rng=random.Random(0))
    with caplog.at_level("WARNING"):
        assert d.drain() == 2
    got = [x.headers["webhook-id"] for x in receiver.wait_for(2)]
    assert got == [ids[0], ids[2]]
    with ctx.engine.connect() as conn:  # not the payload: it cannot be read
        q = select(outbox.c.delivery_id, outbox.c.status, outbox.c.attempts)
        status = {r.delivery_id: (r.status, r.attempts) for r in conn.execute(q)}
    assert status[ids[1]] == ("failed", 1), status
    assert ctx.telemetry.set_aside_rows.labels("deliver")._value.get() == 1
    assert any("deliver set aside" in r.getMessage() and ids[1] in r.getMessage()
               for r in caplog.records)  # fmt: skip
    clock.advance(3600)
    assert d.drain() == 0  # never tried again
    assert ctx.telemetry.set_aside_rows.labels("deliver")._value.get() == 1
