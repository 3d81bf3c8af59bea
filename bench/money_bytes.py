"""Benchmark helper: save every surface that shows the money (the cost report as JSON and CSV
by each grouping, the fleet, the GPUs, jobs and job pages, ``/metrics`` and the CLI's report
and fleet), served by one checkout's code over a copy of a database at a fixed now, so two
versions of the code can be compared byte for byte.

Save: ``bench/money_bytes.py save DIR --db FILE --now 2026-12-07T11:40:00Z --code CHECKOUT``
(a SQLite file, e.g. a ``gpuwarden demo`` database; CHECKOUT an older commit's ``git archive``
or this one). Compare: ``bench/money_bytes.py compare OLD_DIR NEW_DIR``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

GROUPS = ("job", "user", "team", "project", "node", "gpu_model", "gpu")
# What moves with the wall clock between two scrapes, whatever the code.
CLOCK_LINES = (b"gpuwarden_fleet_metrics_duration_seconds",)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def save(folder: str, db_file: str, now_text: str, code: str) -> None:
    """Serve a copy of ``db_file`` with the code of ``code`` at ``now`` and save each surface's
    bytes in ``folder``."""
    sys.path.insert(0, str(Path(code).resolve()))
    import httpx
    import uvicorn

    from service.api.app import create_app
    from service.db import tokens_repo
    from service.db.engine import make_engine
    from service.roles import Role
    from service.settings import Settings

    now = datetime.fromisoformat(now_text.replace("Z", "+00:00"))
    work = Path(tempfile.mkdtemp())
    db = work / "money.db"
    shutil.copy(db_file, db)
    url = f"sqlite:///{db}"
    engine = make_engine(url)
    with engine.begin() as conn:
        token, _ = tokens_repo.create_token(
            conn, role=Role.ADMIN, node=None, name="money-bytes", now=now
        )
    settings = Settings(database_url=url, run_scheduler=False)
    app = create_app(settings, engine=engine, clock=lambda: now)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    base = f"http://127.0.0.1:{port}"
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    auth = {"Authorization": f"Bearer {token}"}
    start = (now - timedelta(hours=1)).replace(minute=0, second=0, microsecond=0)
    window = {"start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()}
    today = {"start": now.replace(hour=0, minute=0, second=0).isoformat(), "end": now.isoformat()}
    gets: dict[str, tuple[str, dict[str, Any]]] = {}
    for group in GROUPS:
        for name, span in (("hour", window), ("today", today)):
            q = {**span, "group_by": group}
            gets[f"report_{name}_{group}.json"] = ("/api/v1/reports/cost", q)
            gets[f"report_{name}_{group}.csv"] = ("/api/v1/reports/cost", {**q, "format": "csv"})
    gets["report_today_job_page.json"] = (
        "/api/v1/reports/cost",
        {**today, "group_by": "job", "limit": 3, "sort": "idle"},
    )
    gets["fleet.json"] = ("/api/v1/fleet", {})
    gets["fleet_team.json"] = ("/api/v1/fleet", {"team": "vision"})
    gets["gpus.json"] = ("/api/v1/gpus", {})
    gets["jobs.json"] = ("/api/v1/jobs", {})
    gets["metrics.txt"] = ("/metrics", {})
    with httpx.Client(base_url=base, headers=auth, timeout=120) as client:
        for name, (path, params) in gets.items():
            body = client.get(path, params=params).content
            if name == "metrics.txt":
                body = b"".join(
                    line
                    for line in body.splitlines(keepends=True)
                    if not line.startswith(CLOCK_LINES)
                )
            (out / name).write_bytes(body)
        jobs = client.get("/api/v1/jobs").json()
        rows = jobs["jobs"] if isinstance(jobs, dict) else jobs
        for job in rows:
            (out / f"job_{job['id'].replace(':', '_')}.json").write_bytes(
                client.get(f"/api/v1/jobs/{job['id']}").content
            )
    env = {**os.environ, "GPUWARDEN_CENTRAL_URL": base, "GPUWARDEN_API_TOKEN": token}
    env["PYTHONPATH"] = str(Path(code).resolve())
    cli = [sys.executable, "-c", "from service.cli.main import main; main()"]
    runs = {
        "cli_report.txt": ["report", "cost", "--start", window["start"], "--end", window["end"]],
        "cli_report.csv": ["report", "cost", "--start", today["start"], "--end", now_text, "--csv"],
        "cli_report.json": [
            "report",
            "cost",
            "--start",
            today["start"],
            "--end",
            now_text,
            "--json",
            "--group-by",
            "team",
        ],
        "cli_report_focus.csv": [
            "report",
            "cost",
            "--start",
            window["start"],
            "--end",
            window["end"],
            "--focus",
        ],
        "cli_gpus.txt": ["gpus"],
    }
    for name, argv in runs.items():
        done = subprocess.run([*cli, *argv], env=env, capture_output=True, cwd=work, check=False)
        (out / name).write_bytes(done.stdout + done.stderr)
    server.should_exit = True
    engine.dispose()
    shutil.rmtree(work)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("save", help="serve a copy of a database with a checkout's code, save")
    s.add_argument("folder")
    s.add_argument("--db", required=True, help="a SQLite database file (copied, not changed)")
    s.add_argument("--now", required=True, help="the fixed now, e.g. 2026-12-07T11:40:00Z")
    s.add_argument("--code", default=str(Path(__file__).resolve().parents[1]))
    c = sub.add_parser("compare", help="compare two folders of saved surfaces")
    c.add_argument("old")
    c.add_argument("new")
    args = p.parse_args()
    if args.command == "save":
        save(args.folder, args.db, args.now, args.code)
        return
    for path in sorted(Path(args.old).iterdir()):
        other = Path(args.new) / path.name
        same = other.exists() and other.read_bytes() == path.read_bytes()
        print(f"{path.name}: {'bytes equal' if same else 'DIFFER'} ({path.stat().st_size} B)")


if __name__ == "__main__":
    main()
