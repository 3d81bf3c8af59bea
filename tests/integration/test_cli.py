"""The ``gpuwarden`` command as a user runs it: migrate, token create/list/revoke, serve refusal."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from sqlalchemy import select

from service.db.engine import make_engine
from service.db.schema import api_tokens
from service.db.tokens_repo import authenticate


def gw(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUWARDEN_DATABASE_URL": f"sqlite:///{db}"}
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_serve_refuses_an_unmigrated_database_and_names_the_fix(tmp_path: Path):
    r = gw(tmp_path / "gw.db", "serve", "--port", "1")
    assert r.returncode == 1
    assert "run `gpuwarden migrate`" in r.stderr


def test_token_lifecycle(tmp_path: Path):
    db = tmp_path / "gw.db"
    assert gw(db, "migrate").returncode == 0
    r = gw(db, "token", "create", "--role", "agent", "--node", "gpu-node-1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    secret = lines[-1]
    assert secret.startswith("gw_") and len(secret) > 40
    assert re.fullmatch(r"id=\d+", lines[0]) and len(lines) == 2  # the id to revoke by, first
    engine = make_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        info = authenticate(conn, token=secret)
        stored = conn.execute(select(api_tokens.c.token_hash)).scalar_one()
    assert info is not None and info.node == "gpu-node-1"
    assert secret not in stored  # only the hash is kept

    listed = gw(db, "token", "list")
    assert "gpu-node-1" in listed.stdout and secret not in listed.stdout
    assert lines[0] == f"id={info.id}"
    assert gw(db, "token", "revoke", str(info.id)).returncode == 0
    with engine.connect() as conn:
        assert authenticate(conn, token=secret) is None
    engine.dispose()

    bad = gw(db, "token", "create", "--role", "agent")
    assert bad.returncode == 1 and "node" in bad.stderr
    assert gw(db, "token", "revoke", "999").returncode == 1


def test_serve_with_a_bad_or_missing_config_says_why_in_one_line(tmp_path: Path):
    db = tmp_path / "gw.db"
    assert gw(db, "migrate").returncode == 0
    bad = tmp_path / "gpuwarden.yaml"
    bad.write_text("prices:\n  - {model_pattern: '*H100*', usd_per_gpu_hour: 4}\n")
    metadata = tmp_path / "metadata.yaml"
    metadata.write_text(
        "channels:\n  - {name: ops, type: webhook, url: 'http://169.254.169.254/'}\n"
    )
    for config, says in (
        (bad, "prices.0.effective_from: is required"),
        (tmp_path / "missing.yaml", "does not exist"),
        (metadata, "channel 'ops'"),  # a refused address stops the start (docs/security.md)
    ):
        r = gw(db, "serve", "--port", "1", "--config", str(config))
        assert r.returncode == 1
        assert says in r.stderr and str(config) in r.stderr
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr


def test_database_url_works_after_the_sub_command_and_is_said(tmp_path: Path):
    db = tmp_path / "after.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    url = f"sqlite:///{db}"
    for args in (["migrate", "--database-url", url], ["token", "list", "--database-url", url]):
        r = subprocess.run(
            [sys.executable, "-m", "service.cli", *args],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
    assert db.exists()
    assert f"database {url} (given)" in r.stderr


def test_agent_says_at_start_up_the_node_name_tokens_must_name(tmp_path: Path):
    # The docs create agent tokens for `hostname -s` run on the node; the agent reports that.
    short = subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("GPUWARDEN_NODE_NAME", "NODE_NAME")}
    env |= {"GPUWARDEN_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "agent", "--backend", "simulated",
         "--central-url", "http://127.0.0.1:9", "--agent-token", "gw_x"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
    assert first.startswith(f"agent for node {short.stdout.strip()}: backend simulated"), first
