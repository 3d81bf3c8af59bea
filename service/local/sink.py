"""The local notification sink of ``up`` and ``demo``: a loopback webhook that logs what it gets."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class _SinkHandler(BaseHTTPRequestHandler):
    """Appends each notification POSTed to it as one readable line to the server's log file."""

    server: LocalSink

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        try:
            body = json.loads(self.rfile.read(min(length, 1 << 20)))
            doc = body.get("data", body)  # a Standard Webhooks payload: the alert is its data
            # The summary already says the job's waste so far (an alert's and a notice's alike).
            line = str(doc.get("summary") or doc) + self.server.from_history(doc)
        except (ValueError, AttributeError, TypeError):
            line = "a notification that was not JSON"
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        with self.server.lock, self.server.log_path.open("a") as f:
            f.write(f"{stamp} {line}\n")
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the log file is the record."""


class LocalSink(ThreadingHTTPServer):
    """The local notification sink of ``up`` and ``demo``: a log of the notifications received."""

    def __init__(self, log_path: Path) -> None:
        super().__init__(("127.0.0.1", 0), _SinkHandler)
        self.log_path = log_path
        self.lock = threading.Lock()
        # Notifications about events before this time come from the demo's replayed history.
        self.history_until: datetime | None = None

    def from_history(self, doc: dict[str, Any]) -> str:
        """`` (from history: fired at 00:31:05Z)`` for an event before ``history_until``; never
        for a ladder notice, whose step is taken live even on an alert that fired in history."""
        if doc.get("kind") == "notice":
            return ""
        resolved = doc.get("state") == "resolved"
        text = doc.get("resolved_at" if resolved else "fired_at")
        if self.history_until is None or not isinstance(text, str):
            return ""
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
        if at >= self.history_until:
            return ""
        return f" (from history: {'resolved' if resolved else 'fired'} at {at:%H:%M:%S}Z)"

    @property
    def url(self) -> str:
        """Where the channel posts."""
        return f"http://127.0.0.1:{self.server_address[1]}/notifications"


def start_local_sink(log_path: Path) -> LocalSink:
    """Serve the local notification sink on a free loopback port in a daemon thread."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.touch()
    sink = LocalSink(log_path)
    threading.Thread(target=sink.serve_forever, name="notification-log", daemon=True).start()
    return sink
