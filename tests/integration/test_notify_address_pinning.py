"""Notifications go to the address that was checked, never to a later DNS answer.

The DNS stand-in is a hook on ``socket.getaddrinfo`` that answers only for the made-up host
``hooks.test`` and only with loopback addresses: 127.0.0.1 (admitted by the allow-list) on the
first lookup, then 127.0.0.2 (refused) on every later one, as a rebinding DNS server would.
A real receiver listens on each of the two addresses, on the same port.
"""

from __future__ import annotations

import http.server
import logging
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.errors import ConfigError, ValidationFailed
from service.notify import Notification
from service.notify.pinned import PinnedTransport
from service.notify.urlsafety import parse_allow_nets
from service.thresholds.policy import ChannelSpec
from service.usecases.evaluation import load_config
from service.usecases.outbox import Dispatcher
from tests.receivers import Receiver
from tests.support import self_signed_cert

NOTE = Notification.model_validate(
    {
        "delivery_id": "msg_pinning",
        "kind": "test",
        "status": "firing",
        "policy": "p",
        "severity": "info",
        "metric": "sm_active",
        "aggregate": "avg",
        "window": "5m",
        "op": "<",
        "threshold": 0.3,
        "value": 0.1,
        "scope": "gpu",
        "scope_key": "gpu:GPU-a0",
        "labels": {"gpu": "GPU-a0", "node": "node-a"},
        "active_since": "2026-12-02T08:00:00+00:00",
    }
)


class RebindingDns:
    """Answers ``hooks.test`` with ``first`` once and ``then`` afterwards; others as usual."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, first: str, then: str) -> None:
        self.lookups = 0
        real = socket.getaddrinfo

        def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
            if host != "hooks.test":
                return real(host, port, *args, **kwargs)
            self.lookups += 1
            addr = first if self.lookups == 1 else then
            return real(addr, port, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture
def receivers() -> Iterator[tuple[Receiver, Receiver]]:
    allowed = Receiver(host="127.0.0.1")
    refused = Receiver(host="127.0.0.2", port=allowed.server.server_address[1])
    yield allowed, refused
    allowed.close()
    refused.close()


def test_a_rebinding_answer_never_reaches_the_refused_address(
    app, receivers: tuple[Receiver, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    allowed, refused = receivers
    ctx = app.state.ctx
    ctx.settings.webhook_allow_nets = "127.0.0.1/32"
    dns = RebindingDns(monkeypatch, first="127.0.0.1", then="127.0.0.2")
    port = allowed.server.server_address[1]
    channel = ChannelSpec(name="hook", type="slack", url=f"http://hooks.test:{port}/in")
    dispatcher = Dispatcher(ctx)

    dispatcher.send_now(channel, NOTE)
    assert dns.lookups == 1  # resolved once: checked, then connected to what was checked
    (got,) = allowed.wait_for(1)
    assert got.path == "/in" and got.headers["host"] == f"hooks.test:{port}"

    # Every later lookup answers the refused address: the send is refused, nothing arrives.
    with pytest.raises(ValidationFailed) as err:
        dispatcher.send_now(channel, NOTE)
    assert "127.0.0.2" in err.value.message
    assert refused.received == [] and len(allowed.received) == 1
    dispatcher.client.close()


def test_an_address_that_fails_to_connect_falls_back_to_the_next_checked_one(
    receivers: tuple[Receiver, Receiver],
) -> None:
    allowed, _ = receivers
    port = allowed.server.server_address[1]
    closed = socket.socket()
    closed.bind(("127.0.0.3", 0))  # bound, never listening: connections are refused
    transport = PinnedTransport(
        lambda: parse_allow_nets("127.0.0.0/8"),
        resolver=lambda host, p: ["127.0.0.3", "127.0.0.1"],
    )
    with httpx.Client(transport=transport) as client:
        r = client.post(f"http://hooks.test:{port}/x", content=b"{}")
    closed.close()
    assert r.status_code == 200 and len(allowed.received) == 1


def test_https_keeps_the_host_name_for_sni_and_the_certificate(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path, "hooks.test")
    seen: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            seen.append(self.headers.get("host"))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    sni: list[str | None] = []
    tls.sni_callback = lambda sock, name, ctx: sni.append(name)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    try:
        trust = ssl.create_default_context(cafile=str(cert))
        transport = PinnedTransport(
            lambda: parse_allow_nets("127.0.0.1/32"),
            resolver=lambda host, p: ["127.0.0.1"],
            make_inner=lambda: httpx.HTTPTransport(verify=trust),
        )
        with httpx.Client(transport=transport) as client:
            r = client.post(f"https://hooks.test:{port}/x", content=b"{}")
        assert r.status_code == 200
        assert sni == ["hooks.test"] and seen == [f"hooks.test:{port}"]
    finally:
        server.shutdown()
        server.server_close()


def _config(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "gpuwarden.yaml"
    path.write_text(f"channels:\n  - {{name: ops, type: webhook, url: '{url}'}}\n")
    return path


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.5/hook",
        "http://127.0.0.1:9093/",
        "http://169.254.169.254/latest",
        "http://[fd00:ec2::254]/",
        "http://[2002:7f00:1::]/",
    ],
)
def test_config_file_channels_with_refused_literal_addresses_stop_the_start(
    app, tmp_path: Path, url: str
) -> None:
    ctx = app.state.ctx
    ctx.settings.config = _config(tmp_path, url)
    with pytest.raises(ConfigError) as err:
        load_config(ctx)
    assert "ops" in str(err.value) and "GPUWARDEN_WEBHOOK_ALLOW_NETS" in str(err.value)
    ctx.settings.webhook_allow_nets = "10.0.0.0/8,127.0.0.0/8,169.254.169.254/32,fd00::/8"
    assert load_config(ctx) == (0, 1)


def test_config_file_channel_whose_host_does_not_resolve_yet_is_a_warning(
    app, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ctx = app.state.ctx
    ctx.settings.config = _config(tmp_path, "http://alertmanager.not-yet.invalid:9093/")
    with caplog.at_level(logging.WARNING):
        assert load_config(ctx) == (0, 1)
    assert "does not resolve" in caplog.text
    # and at send time it is checked again: still no address, so the send is refused
    channel = ChannelSpec(name="ops", type="webhook", url="http://alertmanager.not-yet.invalid/")
    dispatcher = Dispatcher(ctx)
    with pytest.raises(ValidationFailed, match="does not resolve"):
        dispatcher.send_now(channel, NOTE)
    dispatcher.client.close()
