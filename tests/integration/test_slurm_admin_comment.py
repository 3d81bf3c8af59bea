"""The shipped epilog writes each job's verdict into Slurm's AdminComment, where sacct shows it.

A real one-node Slurm 22.05 with accounting: slurmctld, slurmd and slurmdbd over a MariaDB of the
test's own (tests/slurm_support.py); the Epilog is the shipped script with
GPUWARDEN_SLURM_ADMIN_COMMENT=yes. It stores the verdict through sacctmgr, in the database sacct
reads: 22.05's `scontrol update AdminComment=` refuses a job whose epilog runs ("Job has
already finished"). Needs root, as CI runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from sqlalchemy import Engine

from service.clock import utc_now
from tests.integration.cost_data import store_series
from tests.slurm_support import GPUS, Cluster, slurm_cluster, wait_for_job
from tests.support import FakeClock

GIB = 2**30
# Characters a shell would act on, in the job's name: none of them may run or reach the text.
HOSTILE_NAME = "a\"b'c $(touch {marker}) `touch {marker}` | ;"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from slurm_cluster(tmp_path_factory, accounting=True)


def idle_held_gpus(engine: Engine, clock: FakeClock) -> None:
    """Every GPU of the cluster held idle (memory in use, no SM active) from 5 minutes ago to 5
    minutes ahead; central's clock then 3 minutes ahead, past the jobs' ends."""
    start = utc_now().replace(microsecond=0) - timedelta(minutes=5)
    clock.set(start + timedelta(minutes=10))
    idle = {"sm_active": 0.0, "gpu_util": 0.0, "fb_used_bytes": 20 * GIB}
    for i, (uuid, _, _) in enumerate(GPUS):
        store_series(engine, clock, uuid=uuid, index=i, start=start, metrics=[idle] * 60)
    clock.set(start + timedelta(minutes=8))


def admin_comment(cluster: Cluster, slurm_id: str) -> str:
    """The job's AdminComment as sacct shows it, once slurmdbd has the job's end."""
    deadline = time.monotonic() + 20
    while True:
        out = cluster.run(
            "sacct", "-j", slurm_id, "-X", "-n", "-P", "-o", "State,AdminComment%300"
        ).strip()  # fmt: skip
        state, _, comment = out.partition("|")
        if state == "COMPLETED" or time.monotonic() > deadline:
            assert state == "COMPLETED", f"{out}\n{cluster.logs()}"
            return comment
        time.sleep(0.3)


def test_the_verdict_in_admin_comment_is_the_job_summarys(
    cluster: Cluster, server: str, http: httpx.Client, tokens, engine: Engine, clock: FakeClock,
    tmp_path: Path,
):  # fmt: skip
    idle_held_gpus(engine, clock)
    cluster.point_at(server, tokens["agent"], GPUWARDEN_SLURM_ADMIN_COMMENT="yes")
    marker = tmp_path / "ran"
    name = HOSTILE_NAME.format(marker=marker)
    slurm_id = cluster.run(
        "sbatch", "--parsable", f"--job-name={name}", "--gres=gpu:2", "--output=/dev/null",
        "--wrap", "sleep 2",
    ).strip()  # fmt: skip
    cluster.wait_gone(slurm_id)
    comment = admin_comment(cluster, slurm_id)

    job_id = f"slurm:{slurm_id}"
    job = wait_for_job(http, tokens["reader"], job_id, ended=True)
    row = job["summary"]
    # The figures are the job summary's: central's clock has not moved since the epilog ran.
    assert row["top_cause"] == "idle_held" and row["cost_usd"] > 0
    # Lower case, as sacctmgr stores it (the link's percent-escapes mean the same).
    assert comment.startswith(
        f"gpuwarden: ${row['cost_usd']:,.2f} on {row['held_seconds'] / 3600:.1f} gpu-h, "
        f"waste ${row['waste_usd']:,.2f} ("
    ), comment
    assert ", top idle_held; fix: " in comment
    link = f"http://127.0.0.1:8000/jobs/{quote(job_id, safe='').lower()}"
    assert comment.endswith(f"; {link}")
    page = http.get(
        "/api/v1" + link.removeprefix("http://127.0.0.1:8000"),
        headers={"Authorization": f"Bearer {tokens['reader']}"},
    )
    assert page.status_code == 200 and page.json()["id"] == job_id
    verdict = http.get(
        f"/api/v1/verdicts/{job_id}", headers={"Authorization": f"Bearer {tokens['reader']}"}
    )
    assert verdict.headers["content-type"].startswith("text/plain")
    assert comment == verdict.text and len(comment) <= 250
    # The job's hostile name ran nothing and reached no text (slurmdbd keeps it, its '"' as
    # a backtick).
    assert not marker.exists()
    assert stored_name(cluster, slurm_id, expect=name.replace('"', "`")) == name.replace('"', "`")


def stored_name(cluster: Cluster, slurm_id: str, *, expect: str) -> str:
    """The job's name as sacct shows it, once it is ``expect`` or after 20 s: slurmdbd may file
    the job's end before its start, and names the record "allocation" until the start comes."""
    deadline = time.monotonic() + 20
    while True:
        out = cluster.run("sacct", "-j", slurm_id, "-X", "-n", "-P", "-o", "JobName%300").strip()
        if out == expect or time.monotonic() > deadline:
            return out
        time.sleep(0.3)


class _FailingCentral(BaseHTTPRequestHandler):
    """Takes the epilog's end (PATCH), then fails the verdict as the server's ``mode`` says."""

    def do_PATCH(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer(200, "{}")

    def do_GET(self) -> None:
        mode = self.server.mode  # type: ignore[attr-defined]
        if mode == "hangs":
            time.sleep(20)
            self._answer(200, "gpuwarden: $1.00 on 0.1 GPU-h; too late")
        elif mode == "errs":
            self._answer(500, "Internal Server Error")
        else:  # a line the epilog must not store: a quote and a command in it
            self._answer(200, 'gpuwarden: $1.00 on 0.1 GPU-h" $(touch /tmp/gw-x)')

    def _answer(self, code: int, body: str) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        pass


@pytest.mark.parametrize("mode", ["hangs", "errs", "sends a quote"])
def test_a_failing_central_leaves_admin_comment_as_it_was_and_the_job_ends(
    cluster: Cluster, mode: str
):
    central = ThreadingHTTPServer(("127.0.0.1", 0), _FailingCentral)
    central.mode = mode  # type: ignore[attr-defined]
    threading.Thread(target=central.serve_forever, daemon=True).start()
    try:
        cluster.point_at(
            f"http://127.0.0.1:{central.server_port}", "agent-token",
            GPUWARDEN_SLURM_ADMIN_COMMENT="yes", GPUWARDEN_SLURM_TIMEOUT_SECONDS="3",
        )  # fmt: skip
        slurm_id = cluster.run(
            "sbatch", "--parsable", "--gres=gpu:1", "--output=/dev/null", "--wrap", "sleep 3"
        ).strip()  # fmt: skip
        # What the site wrote while the job ran must survive a verdict that did not come.
        deadline = time.monotonic() + 20
        while cluster.run("squeue", "-h", "-j", slurm_id, "-o", "%T").strip() != "RUNNING":
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.2)
        cluster.run("scontrol", "update", f"job={slurm_id}", "AdminComment=site note")
        began = time.monotonic()
        cluster.wait_gone(slurm_id)
        # A hang timeout, not a timing: an epilog that waited on the failing central past its
        # 3 s budget would hold the job far longer (bench timings belong in bench/).
        assert time.monotonic() - began < 60
        assert admin_comment(cluster, slurm_id) == "site note"
    finally:
        central.shutdown()
        central.server_close()
