"""What `up` and `demo` set up for a first run: their own tokens reused, the default alerting
with its local notification log admitted by the URL-safety check (that URL only)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from service.db import policies_repo, tokens_repo
from service.db.engine import make_engine
from service.db.migrate import upgrade
from service.errors import ConfigError, ValidationFailed
from service.local.launcher import LOCAL_CHANNEL, check_port_free, install_default_alerting
from service.local.run import LocalRun, find_running, record_running, resolve_database
from service.local.sink import LocalSink, start_local_sink
from service.local.tokens import own_tokens
from service.notify import webhook
from service.notify.base import Notification
from service.notify.urlsafety import resolve_checked
from service.settings import Settings

WANTED = {
    "agent": ("agent", "gpuwarden up: local agent", "vm"),
    "reader": ("reader", "gpuwarden up: local reader", None),
}


@pytest.fixture
def engine(tmp_path: Path):
    engine = make_engine(f"sqlite:///{tmp_path / 'up.db'}")
    upgrade(engine)
    yield engine
    engine.dispose()


def test_up_reuses_its_tokens_instead_of_minting_two_per_start(engine, tmp_path: Path) -> None:
    path = tmp_path / "up-tokens.json"
    first = own_tokens(engine, path, WANTED)
    assert own_tokens(engine, path, WANTED) == first
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    with engine.connect() as conn:
        assert len(tokens_repo.list_tokens(conn)) == 2
    path.unlink()  # the secrets are lost: the old tokens are retired, not left valid
    second = own_tokens(engine, path, WANTED)
    assert second != first
    with engine.connect() as conn:
        live = [t for t in tokens_repo.list_tokens(conn) if t.revoked_at is None]
        assert len(live) == 2 and tokens_repo.authenticate(conn, token=first["reader"]) is None


def test_default_policies_send_to_a_local_log(engine, tmp_path: Path) -> None:
    sink = start_local_sink(tmp_path / "notifications.log")
    try:
        assert install_default_alerting(engine, sink.url) == 8
        with engine.connect() as conn:
            policies = policies_repo.list_policies(conn)
            (channel,) = policies_repo.list_channels(conn)
        assert {p.name for p in policies} >= {"low-sm-activity", "gpu-hardware-fault"}
        assert all(p.channels == [LOCAL_CHANNEL] for p in policies)
        assert channel.url == sink.url
        summary = "[FIRING] gpu-hardware-fault on node-a GPU 1 (GPU-1): max = 1 (>= 1)"
        body = {"type": "alert.firing", "data": {"summary": summary, "state": "firing"}}
        httpx.post(sink.url, json=body).raise_for_status()  # the webhook's Standard Webhooks body
        assert sink.log_path.read_text().rstrip().endswith(f" {summary}")
    finally:
        sink.shutdown()
        sink.server_close()


def test_only_the_sink_url_is_admitted_on_loopback() -> None:
    sink = "http://127.0.0.1:40123/notifications"
    with pytest.raises(ValidationFailed, match="loopback"):
        resolve_checked(sink, [])
    resolve_checked(sink, [], admit_url=sink)
    for other in ("http://127.0.0.1:40124/notifications", "http://127.0.0.1:40123/admin"):
        with pytest.raises(ValidationFailed, match="loopback"):
            resolve_checked(other, [], admit_url=sink)
    with pytest.raises(ValidationFailed, match="private"):
        resolve_checked(
            "http://10.0.0.1:40123/notifications",
            [],
            admit_url="http://10.0.0.1:40123/notifications",
        )


def test_a_port_in_use_is_refused_at_once() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port}.*--port"):
            check_port_free("127.0.0.1", port)


def test_token_commands_find_the_running_database(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("GPUWARDEN_DATABASE_URL", raising=False)
    settings = Settings(state_dir=tmp_path)
    import os

    run = LocalRun("demo", os.getpid(), "http://127.0.0.1:1", "sqlite:////x/demo.db", "gw_r")
    record_running(settings, run)
    assert find_running(settings) == run
    resolved, why = resolve_database(settings)
    assert resolved.database_url == "sqlite:////x/demo.db"
    assert "running gpuwarden demo" in why
    given, why = resolve_database(Settings(state_dir=tmp_path, database_url="sqlite:///y.db"))
    assert given.database_url == "sqlite:///y.db" and "(given)" in why


def _gpus_in(folder: Path) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(
        [sys.executable, "-m", "service.cli", "gpus"],
        cwd=folder, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)},
    )  # fmt: skip


def test_gpus_with_nothing_running_says_so_and_where(tmp_path: Path) -> None:
    r = _gpus_in(tmp_path)
    assert r.returncode == 1
    assert "nothing is running in ./gpuwarden-data" in r.stderr, r.stderr
    assert "reader token is needed" not in r.stderr


def test_gpus_after_a_run_that_ended_says_nothing_is_running(tmp_path: Path) -> None:
    # A run killed without cleaning up leaves running.json naming a process that is gone.
    gone = subprocess.Popen(["true"])
    gone.wait()
    run = LocalRun("up", gone.pid, "http://127.0.0.1:1", "sqlite:////x/up.db", "gw_r")
    record_running(Settings(state_dir=tmp_path / "gpuwarden-data"), run)
    r = _gpus_in(tmp_path)
    assert r.returncode == 1 and "nothing is running in ./gpuwarden-data" in r.stderr, r.stderr


def _sink_lines(notes: list[Notification], *, history_until: datetime) -> list[str]:
    """The log lines the local sink writes for ``notes`` posted as the webhook channel posts."""
    sink = start_local_sink(Path(tempfile.mkdtemp()) / "notifications.log")
    assert isinstance(sink, LocalSink)
    sink.history_until = history_until
    try:
        for note in notes:
            httpx.post(sink.url, json=webhook.render(note)).raise_for_status()
        return sink.log_path.read_text().splitlines()
    finally:
        sink.shutdown()
        sink.server_close()


def test_the_local_log_says_the_waste_once_and_live_notices_are_not_history() -> None:
    fired = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)  # in the demo's replayed history
    alert = Notification(
        delivery_id="d1", kind="firing", status="firing", policy="low-sm-activity",
        severity="warning", metric="activity", aggregate="avg", window="10m", op="<",
        threshold=0.3, value=0.01, scope="job", scope_key="slurm:7",
        labels={"job_id": "slurm:7"}, active_since=fired, fired_at=fired,
        waste_usd=3.0, idle_usd=2.0, fixable_usd=1.0,
    )  # fmt: skip
    notice = alert.model_copy(
        update={
            "delivery_id": "d2",
            "kind": "notice",
            "notice": "Job slurm:7 has been idle since 08:00 UTC. Waste so far $3.00.",
        }
    )
    alert_line, notice_line = _sink_lines([alert, notice], history_until=fired + timedelta(hours=1))
    assert alert_line.lower().count("waste so far") == 1, alert_line
    assert "(from history: fired at 08:00:00Z)" in alert_line  # the alert did fire in history
    assert notice_line.lower().count("waste so far") == 1, notice_line
    assert ".;" not in notice_line and notice_line.endswith("Waste so far $3.00.")
    assert "from history" not in notice_line  # a ladder step is taken live


def test_serve_on_a_busy_port_fails_at_once_and_creates_nothing(tmp_path: Path) -> None:
    """`gpuwarden serve` beside a running demo: one line naming the port, no ./gpuwarden.db."""
    import os
    import socket

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-m", "service.cli", "serve", "--migrate", "--port", str(port)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "--port" in r.stderr
    assert list(tmp_path.iterdir()) == []  # no gpuwarden.db, no state folder
