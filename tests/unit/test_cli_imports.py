"""The CLI's HTTP commands and ``--help`` import neither the database layer nor the web framework.

Each command runs in a fresh interpreter (against a closed port, so it fails after its one call)
and reports which heavy packages it loaded; a one-call command that pulls SQLAlchemy, FastAPI or
pydantic spends a second of CPU before it asks anything (bench/cli_startup.py measures the time).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import free_port

HEAVY = ("sqlalchemy", "alembic", "fastapi", "starlette", "uvicorn", "pydantic", "httpx", "yaml")

PROBE = """
import json, sys
from service.cli.main import main
try:
    rc = main(sys.argv[1:])
except SystemExit as exc:
    rc = exc.code
heavy = sorted({m.split('.')[0] for m in sys.modules} & set(HEAVY))
print(json.dumps({"rc": rc, "heavy": heavy}), file=sys.stderr)
"""


def loaded(*argv: str, heavy: tuple[str, ...] = HEAVY, **env: str) -> dict[str, Any]:
    """Run ``gpuwarden ARGV`` in a new interpreter; its exit status and heavy packages loaded."""
    code = f"HEAVY = {heavy!r}\n{PROBE}"
    r = subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "120", **env},
    )
    last = r.stderr.strip().splitlines()[-1]
    out: dict[str, Any] = json.loads(last)
    return out


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["gpus", "--help"],
        ["gpus"],
        ["job", "slurm:1"],
        ["report", "cost", "--since", "1h"],
        ["actions", "--since", "24h"],
        ["actions", "--help"],
    ],
)
def test_http_commands_and_help_import_no_heavy_package(argv: list[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: the command fails after one call
    extra = [] if "--help" in argv else ["--url", url, "--token", "gw_x"]
    got = loaded(*argv, *extra)
    assert got["rc"] in (0, 1), got
    assert got["heavy"] == [], got


def test_database_commands_still_load_what_they_need() -> None:
    # The guard above is not vacuous: a token command does reach SQLAlchemy.
    got = loaded("token", "list", "--database-url", "sqlite:////nonexistent-dir/x.db")
    assert "sqlalchemy" in got["heavy"], got


# What the admin commands may not pull: alembic (a tenth of a second of CPU) for a schema check
# that reads one table, and pydantic-settings, the web framework or httpx for a file check.
ADMIN_HEAVY = ("alembic", "pydantic_settings", "fastapi", "starlette", "uvicorn", "httpx")


def test_policies_check_reads_the_file_without_settings_database_or_http() -> None:
    got = loaded(
        "policies",
        "check",
        "deploy/examples/gpuwarden.yaml",
        heavy=(*ADMIN_HEAVY, "sqlalchemy"),
        SLACK_WEBHOOK_URL="https://hooks.slack.com/services/T000/B000/XXXX",
        GPUWARDEN_WEBHOOK_SECRET="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    )
    assert got == {"rc": 0, "heavy": []}


def test_token_list_checks_the_schema_without_alembic(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    subprocess.run(
        [sys.executable, "-m", "service.cli", "migrate", "--database-url", url],
        check=True,
        capture_output=True,
        timeout=120,
    )
    got = loaded("token", "list", "--database-url", url, heavy=ADMIN_HEAVY)
    assert got == {"rc": 0, "heavy": []}
