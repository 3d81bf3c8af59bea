"""The Slurm driver verifies a job before acting, against a real Slurm (slurmctld, slurmd, munge;
tests/slurm_support.py): an id Slurm reads as another spelling of a job (``0101``, ``101+0``),
a job of another user, on other nodes or started after GPU Warden's record (a wrapped id) is
refused, live and in dry run, and keeps running; the job as recorded is cancelled."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from service.actions.base import ReclaimTarget
from service.actions.slurm import SlurmDriver
from tests.alerting_support import add_job
from tests.ladder_support import IDLE_HELD, STEPS, LadderWorld
from tests.receivers import Receiver
from tests.slurm_support import NODE, Cluster, slurm_cluster, squeue_stand_in
from tests.support import FakeClock


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from slurm_cluster(tmp_path_factory)


@pytest.fixture
def driver(cluster: Cluster) -> SlurmDriver:
    return SlurmDriver(env=cluster.env, timeout_seconds=30)


def state(cluster: Cluster, slurm_id: str) -> str:
    """The job's state as squeue shows it ("" once it is no longer listed)."""
    return cluster.run("squeue", "-h", "-j", slurm_id, "-o", "%T", check=False).strip()


@pytest.fixture
def running(cluster: Cluster) -> Iterator[tuple[ReclaimTarget, datetime, datetime]]:
    """A running job of root on NODE, charged to account gw-research: its target as GPU Warden
    records it (start read from squeue), and the wall-clock window in which it started."""
    before = datetime.now(UTC).replace(microsecond=0)
    slurm_id = cluster.run(
        "sbatch", "--parsable", "--account=gw-research", "--output=/dev/null",
        "--wrap", "sleep 600",
    ).strip()  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while state(cluster, slurm_id) != "RUNNING":
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.3)
        after = datetime.now(UTC)
        target = ReclaimTarget(
            f"slurm:{slurm_id}", "cancel", user="root", nodes=(NODE,), started_at=before
        )
        yield target, before, after
    finally:
        cluster.run("scancel", slurm_id, check=False)
        cluster.wait_gone(slurm_id)


def killed(cluster: Cluster, slurm_id: str) -> bool:
    """Whether slurmctld logged a kill (scancel) of job ``slurm_id``."""
    log = (cluster.base / "slurmctld.log").read_text(errors="replace")
    mention = re.compile(rf"JobId={slurm_id}\b")
    return any("kill" in ln.lower() and mention.search(ln) for ln in log.splitlines())


def test_the_probe_reports_the_real_job_s_user_account_nodes_and_start(
    driver: SlurmDriver, running: tuple[ReclaimTarget, datetime, datetime]
) -> None:
    target, before, after = running
    found = driver.probe(target)
    assert found.outcome == "present", found.detail
    assert found.facts is not None
    slurm_id = target.job_id.removeprefix("slurm:")
    assert (found.facts.job_id, found.facts.user) == (slurm_id, "root")
    assert (found.facts.account, found.facts.nodes) == ("gw-research", (NODE,))
    assert found.facts.started_at is not None
    assert before <= found.facts.started_at <= after + timedelta(seconds=1)


@pytest.mark.parametrize("spelling", ["0{id}", "00{id}", "{id}+0"])
def test_another_spelling_of_a_job_id_is_refused_and_the_job_keeps_running(
    cluster: Cluster, driver: SlurmDriver, running: tuple[ReclaimTarget, datetime, datetime],
    spelling: str, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Slurm reads ``0101`` and ``101+0`` as job 101; an id GPU Warden stored so names another
    job than its record, and is never acted on."""
    target, _, _ = running
    slurm_id = target.job_id.removeprefix("slurm:")
    other = replace(target, job_id=f"slurm:{spelling.format(id=slurm_id)}")
    assert driver.probe(other).outcome == "mismatch"
    with caplog.at_level(logging.WARNING, logger="service.actions.slurm"):
        for dry_run in (True, False):
            done = driver.reclaim(other, dry_run=dry_run)
            assert done.outcome == "failed" and done.detail.startswith("refused: "), done.detail
    assert f"Slurm reclaim of {other.job_id} refused" in caplog.text
    assert state(cluster, slurm_id) == "RUNNING"
    assert not killed(cluster, slurm_id)


def test_a_job_whose_user_nodes_or_start_differ_from_the_record_is_refused(
    cluster: Cluster, driver: SlurmDriver, running: tuple[ReclaimTarget, datetime, datetime],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    target, before, _ = running
    slurm_id = target.job_id.removeprefix("slurm:")
    wrong = {
        "user 'root', GPU Warden's record 'alice'": replace(target, user="alice"),
        "not on node-b": replace(target, nodes=(NODE, "node-b")),
        # The record of an earlier job of this id (a wrapped id): Slurm's job started later.
        "another job of the same id": replace(target, started_at=before - timedelta(hours=1)),
    }
    for why, other in wrong.items():
        found = driver.probe(other)
        assert found.outcome == "mismatch" and why in found.detail, found.detail
        assert found.facts is not None and found.facts.user == "root"
        with caplog.at_level(logging.WARNING, logger="service.actions.slurm"):
            for dry_run in (True, False):
                done = driver.reclaim(other, dry_run=dry_run)
                assert done.outcome == "failed" and why in done.detail, done.detail
        assert why in caplog.text
    unverifiable = [replace(target, user=None), replace(target, nodes=())]
    for other in unverifiable:
        done = driver.reclaim(other, dry_run=False)
        assert done.outcome == "failed" and "no user or no nodes" in done.detail
    assert state(cluster, slurm_id) == "RUNNING"
    assert not killed(cluster, slurm_id)


def test_the_job_as_recorded_is_cancelled_once(
    cluster: Cluster, driver: SlurmDriver, running: tuple[ReclaimTarget, datetime, datetime]
) -> None:
    """An agent's host name may be a full name of another case than Slurm's node name."""
    target, _, _ = running
    slurm_id = target.job_id.removeprefix("slurm:")
    recorded = replace(target, nodes=(f"{NODE.upper()}.cluster.example",))
    would = driver.reclaim(recorded, dry_run=True)
    assert (would.outcome, would.detail) == ("would", f"would run: scancel {slurm_id}")
    assert state(cluster, slurm_id) == "RUNNING"
    done = driver.reclaim(recorded, dry_run=False)
    assert done.outcome == "reclaimed", done.detail
    cluster.wait_gone(slurm_id)
    assert killed(cluster, slurm_id)
    again = driver.reclaim(recorded, dry_run=False)
    assert again.outcome == "gone", again.detail
    assert driver.probe(recorded).outcome == "gone"


def test_a_compressed_node_list_is_expanded_by_scontrol(cluster: Cluster, tmp_path: Path) -> None:
    """squeue prints a multi-node job's nodes compressed; the real scontrol expands them."""
    started_at = datetime.now(UTC).replace(microsecond=0)
    squeue = squeue_stand_in(
        tmp_path / "squeue", "4242", user="alice", started_at=started_at, node="gpu[09-11],x1"
    )
    driver = SlurmDriver(squeue_command=str(squeue), env=cluster.env)
    target = ReclaimTarget(
        "slurm:4242", "cancel", user="alice", nodes=("gpu10", "x1"), started_at=started_at
    )
    found = driver.probe(target)
    assert found.outcome == "present", found.detail
    assert found.facts is not None and found.facts.nodes == ("gpu09", "gpu10", "gpu11", "x1")
    elsewhere = driver.probe(replace(target, nodes=("gpu12",)))
    assert elsewhere.outcome == "mismatch" and "not on gpu12" in elsewhere.detail


def test_an_agent_s_zero_padded_id_never_gets_the_real_job_cancelled(
    app: Any, engine: Engine, clock: FakeClock, cluster: Cluster,
    running: tuple[ReclaimTarget, datetime, datetime],
) -> None:  # fmt: skip
    """Issue 45, case 2, through the ladder: an agent registered ``slurm:0<id>`` on its own GPU
    and sent idle samples; Slurm's job <id> (another user's) keeps running."""
    target, _, _ = running
    slurm_id = target.job_id.removeprefix("slurm:")
    padded = f"slurm:0{slurm_id}"
    receiver = Receiver()
    try:
        world = LadderWorld(
            app.state.ctx, engine, clock, receiver,
            {"slurm": SlurmDriver(env=cluster.env, timeout_seconds=30)},
        )  # fmt: skip
        world.samples(1, IDLE_HELD)
        add_job(engine, padded, world.gpus, started_at=clock() - timedelta(minutes=1))
        world.setup({"steps": STEPS, "dry_run": False})
        world.idle_for(16)
    finally:
        receiver.close()
    # The ladder asks squeue before its first step, reads job <id> under another spelling and
    # ends there: no warning, no cancel (the driver's own check inside its reclaim is the
    # second line: test_another_spelling_of_a_job_id_is_refused_and_the_job_keeps_running).
    assert world.actions(padded) == [("notify_owner", "skipped")]
    assert "squeue" in world.reasons(padded, "skipped")[0], world.reasons(padded, "skipped")
    assert world.notices() == []
    assert state(cluster, slurm_id) == "RUNNING"
    assert not killed(cluster, slurm_id)
