"""The agent's stdlib HTTP transport against a real central service on loopback."""

from __future__ import annotations

import json
import zlib

from fastapi import FastAPI

from service.collectors.transport import StdlibTransport
from tests.support import FakeClock, free_port, live_server, make_batch


def test_a_connection_the_server_dropped_is_replaced_without_losing_the_request(
    app: FastAPI, clock: FakeClock, tokens
):
    port = free_port()
    url = f"http://127.0.0.1:{port}/api/v1/ingest"
    headers = {
        "Authorization": f"Bearer {tokens['agent']}",
        "Content-Type": "application/json",
        "Content-Encoding": "gzip",
    }

    def body(k: int) -> bytes:
        raw = json.dumps(make_batch(start=clock(), count=1)).encode()
        clock.advance(10)
        return zlib.compress(raw, 1, wbits=31)

    t = StdlibTransport(timeout_seconds=10)
    with live_server(app, port=port):
        assert t.post(url, body(0), headers)[0] == 200
        assert t.post(url, body(1), headers)[0] == 200  # same keep-alive connection
    with live_server(app, port=port):  # the old connection is dead now
        status, text, _ = t.post(url, body(2), headers)
    t.close()
    assert status == 200, text
    assert json.loads(text)["samples_received"] == 1
