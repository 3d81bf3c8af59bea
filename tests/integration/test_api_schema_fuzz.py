"""schemathesis over the whole OpenAPI document, on SQLite and PostgreSQL, with an admin token.

It generates valid and invalid requests for every operation (examples, coverage, fuzzing and
stateful phases, a bounded number each) against the real service on loopback and fails on any
5xx, any status, header or content type the document does not declare, any response body that
breaks the declared schema, an invalid request accepted (ST201), a valid one refused (ST202) or
an OPTIONS Allow that differs from the document (ST205). Bounded: a few minutes for both
stores; docs/security.md records a longer run by hand.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from service.api.app import create_app
from service.clock import utc_now
from tests.alerting_support import auth
from tests.support import live_server, make_batch

# Minutes long: left out of a plain pytest run, run by `make test` (CI) and `pytest -m fuzz`.
pytestmark = pytest.mark.fuzz

MAX_EXAMPLES = int(os.environ.get("GPUWARDEN_FUZZ_EXAMPLES", "30"))
# Only catches a hang; the longer run by hand (docs/security.md) raises it.
TIMEOUT_SECONDS = int(os.environ.get("GPUWARDEN_FUZZ_TIMEOUT_SECONDS", "540"))
# Every check (no --max-response-time: a wall-clock bound; timing lives in bench/), with
# the rules JSON Schema cannot say (a 422 for valid-looking data that breaks a rule on stored
# data, the clock or another field) listed per operation in tests/schemathesis.toml.
CHECKS = "all"
CONFIG = Path(__file__).resolve().parents[1] / "schemathesis.toml"


def _seed(url: str, tokens: dict[str, str]) -> None:
    """A GPU with samples, a job and a policy, so the reads have something to read."""
    with httpx.Client(base_url=url, timeout=30) as http:
        batch = make_batch(start=utc_now() - timedelta(minutes=5), count=20)
        r = http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"]))
        assert r.status_code == 200, r.text
        job = {
            "id": "slurm:1",
            "user": "alice",
            "team": "ml",
            "gpus": ["GPU-a0"],
            "started_at": (utc_now() - timedelta(minutes=5)).isoformat(),
        }
        r = http.post("/api/v1/jobs", json=job, headers=auth(tokens["admin"]))
        assert r.status_code in (200, 201), r.text


def test_the_api_answers_as_its_openapi_document_says(
    settings, engine, tokens, tmp_path: Path
) -> None:
    settings = settings.model_copy(
        # The fuzzer sends many requests without a token on purpose; they must stay 401.
        update={"auth_failure_burst": 1_000_000}
    )
    app = create_app(settings, engine=engine, clock=utc_now)
    st = Path(sys.executable).parent / "st"
    with live_server(app) as url:
        _seed(url, tokens)
        cmd = [
            str(st),
            "--config-file",
            str(CONFIG),
            "run",
            f"{url}/openapi.json",
            "--checks",
            CHECKS,
            "--max-examples",
            str(MAX_EXAMPLES),
            "--header",
            f"Authorization: Bearer {tokens['admin']}",
            # One worker: with two, Hypothesis reads lambdas' source with ast in two threads
            # at once, and CPython 3.11 can then raise "AST constructor recursion depth
            # mismatch" inside schemathesis (python/cpython#106905), failing the run.
            "--workers",
            "1",
            "--request-timeout",
            "30",
            "--seed",
            "1",
            "--no-color",
            "--suppress-health-check",
            "all",
        ]
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=TIMEOUT_SECONDS, cwd=tmp_path, check=False
        )
    output = done.stdout[-20000:] + done.stderr[-5000:]
    report = os.environ.get("GPUWARDEN_FUZZ_REPORT")
    if report:  # the longer run by hand keeps schemathesis's summary
        with open(report, "a") as out:
            out.write(done.stdout[-6000:])
    assert done.returncode == 0, output
