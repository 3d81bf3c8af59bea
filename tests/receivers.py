"""A real HTTP receiver on loopback that records requests and answers as scripted."""

from __future__ import annotations

import http.client
import json
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Received:
    """One request the receiver got."""

    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """Answers each POST with the next scripted (status, headers), then ``default_status``."""

    script: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    default_status: int = 200
    delay_seconds: float = 0.0  # how long each answer takes
    tls: ssl.SSLContext | None = None  # serve https with this server context
    received: list[Received] = field(default_factory=list)
    host: str = "127.0.0.1"  # any 127.x.y.z: Linux answers the whole loopback net
    port: int = 0

    def __post_init__(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                time.sleep(outer.delay_seconds)
                outer.received.append(
                    Received(
                        self.path,
                        {k.lower(): v for k, v in self.headers.items()},
                        body,
                        time.time(),
                    )
                )
                status, headers = (
                    outer.script.pop(0) if outer.script else (outer.default_status, {})
                )
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((self.host, self.port), Handler)
        if self.tls is not None:
            self.server.socket = self.tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.host}:{self.server.server_address[1]}"

    def wait_for(self, count: int, timeout: float = 10.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while len(self.received) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return list(self.received)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class LoopbackHttp:
    """A real HTTP server on 127.0.0.1 answering from a thread: start it, its URL, close it."""

    server: ThreadingHTTPServer
    thread: threading.Thread

    def serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        """Serve ``handler`` on a free port until ``close``."""
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class ForwardProxy(LoopbackHttp):
    """A real HTTP forward proxy on loopback that records each request's target URL.

    It forwards absolute-form requests (``POST http://host:port/path``) and tunnels ``CONNECT
    host:port`` (https) as a site's egress proxy does, except that it connects every host name to
    127.0.0.1 (its own view of DNS, so tests can name public-looking hosts whose receiver runs
    here). ``seen`` holds ``POST <url>`` or ``CONNECT <host:port>`` per request.
    """

    seen: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_CONNECT(self) -> None:
                outer.seen.append(f"CONNECT {self.path}")
                port = int(self.path.rsplit(":", 1)[1])
                try:
                    upstream = socket.create_connection(("127.0.0.1", port), timeout=10)
                except OSError:
                    self.send_error(502)
                    return
                self.send_response(200, "Connection established")
                self.end_headers()
                client = self.connection
                with upstream:
                    pipes = [client, upstream]
                    while True:
                        ready, _, _ = select.select(pipes, [], [], 10)
                        if not ready:
                            return
                        for src in ready:
                            data = src.recv(65536)
                            if not data:
                                return
                            (upstream if src is client else client).sendall(data)

            def do_POST(self) -> None:
                outer.seen.append(f"POST {self.path}")
                target = urlsplit(self.path)
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                conn = http.client.HTTPConnection("127.0.0.1", target.port or 80, timeout=10)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "proxy-connection"}
                try:
                    conn.request("POST", target.path or "/", body=body, headers=headers)
                    answer = conn.getresponse()
                    data = answer.read()
                except OSError:
                    self.send_error(502)
                    return
                finally:
                    conn.close()
                self.send_response(answer.status)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.serve(Handler)
