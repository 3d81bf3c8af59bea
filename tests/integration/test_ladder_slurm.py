"""The ladder on a real Slurm (slurmctld, slurmd, munge; tests/slurm_support.py): an idle job is
warned twice, then cancelled by the real driver through ``scancel``; a job busy again after the
first warning, a dry run and an exempt job all keep running. The GPUs' samples are scripted on
the test's clock; the jobs, their registration (the shipped prolog) and the cancel are real."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from service.actions.base import ReclaimResult, ReclaimTarget
from service.actions.slurm import SQUEUE_FORMAT, SlurmDriver
from service.clock import utc_now
from tests.ladder_support import BUSY, STEPS, LadderWorld
from tests.receivers import Receiver
from tests.slurm_support import GPUS, NODE, Cluster, know_gpus, slurm_cluster, wait_for_job
from tests.support import FakeClock


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from slurm_cluster(tmp_path_factory)


@pytest.fixture
def job(
    cluster: Cluster, server: str, http: httpx.Client, tokens: dict[str, str], engine: Engine,
    clock: FakeClock,
) -> Iterator[tuple[str, dict[str, Any]]]:  # fmt: skip
    """A running sbatch job holding one GPU, registered by the shipped prolog: (id, job)."""
    know_gpus(engine, clock, [uuid for uuid, _, _ in GPUS])
    cluster.point_at(server, tokens["agent"])
    slurm_id = cluster.run(
        "sbatch", "--parsable", "--gres=gpu:1", "--output=/dev/null", "--wrap", "sleep 600"
    ).strip()  # fmt: skip
    try:
        registered = wait_for_job(http, tokens["reader"], f"slurm:{slurm_id}", ended=False)
        # Samples from now on fall inside the job's interval on its GPU.
        clock.set(utc_now().replace(microsecond=0) + timedelta(seconds=5))
        yield slurm_id, registered
    finally:
        cluster.run("scancel", slurm_id, check=False)
        cluster.wait_gone(slurm_id)


@pytest.fixture
def slurm_world(
    app: Any, engine: Engine, clock: FakeClock, receiver: Receiver, cluster: Cluster,
    job: tuple[str, dict[str, Any]],
) -> tuple[str, LadderWorld]:  # fmt: skip
    """The running job's Slurm id, and a world whose samples go to its GPUs and whose reclaims
    go through the real driver."""
    slurm_id, registered = job
    driver = SlurmDriver(env=cluster.env, timeout_seconds=30)
    gpus = tuple(g["gpu_uuid"] for g in registered["gpus"])
    return slurm_id, LadderWorld(
        app.state.ctx, engine, clock, receiver, {"slurm": driver}, gpus=gpus
    )


def listed(cluster: Cluster, slurm_id: str) -> str:
    """The job's state as squeue shows it ("" once it is no longer listed)."""
    return cluster.run("squeue", "-h", "-j", slurm_id, "-o", "%T", check=False).strip()


def test_an_idle_job_is_warned_twice_then_cancelled(
    cluster: Cluster, slurm_world: tuple[str, LadderWorld]
) -> None:
    slurm_id, world = slurm_world
    world.setup({"steps": STEPS, "dry_run": False})
    world.idle_for(11)
    assert world.actions(f"slurm:{slurm_id}") == [
        ("notify_owner", "warned"), ("notify_owner", "warned"),
    ]  # fmt: skip
    assert listed(cluster, slurm_id) == "RUNNING"
    world.idle_for(2)
    assert world.actions(f"slurm:{slurm_id}")[-1] == ("reclaim", "reclaimed")
    deadline = time.monotonic() + 30
    while listed(cluster, slurm_id) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert listed(cluster, slurm_id) == ""
    log = (cluster.base / "slurmctld.log").read_text(errors="replace")
    assert any(
        "kill" in line.lower() and f"JobId={slurm_id}" in line for line in log.splitlines()
    ), log[-3000:]
    assert len(world.notices()) == 3


def test_a_job_busy_after_the_first_warning_is_not_cancelled(
    cluster: Cluster, slurm_world: tuple[str, LadderWorld]
) -> None:
    slurm_id, world = slurm_world
    world.setup({"steps": STEPS, "dry_run": False})
    world.idle_for(6)
    world.samples(0.5, BUSY)
    world.idle_for(8)
    outcomes = world.actions(f"slurm:{slurm_id}")
    assert outcomes[:2] == [("notify_owner", "warned"), ("notify_owner", "skipped")]
    assert ("reclaim", "reclaimed") not in outcomes
    assert listed(cluster, slurm_id) == "RUNNING"


def test_a_job_whose_agent_died_is_never_cancelled(
    cluster: Cluster, slurm_world: tuple[str, LadderWorld]
) -> None:
    slurm_id, world = slurm_world
    world.setup({"steps": STEPS, "dry_run": False})
    world.idle_for(6)
    assert world.actions(f"slurm:{slurm_id}") == [("notify_owner", "warned")]
    world.wait(12)  # the agent is killed: no sample, the alert stays firing (stale)
    assert ("reclaim", "reclaimed") not in world.actions(f"slurm:{slurm_id}")
    assert "stale" in world.reasons(f"slurm:{slurm_id}", "held")[0]
    assert listed(cluster, slurm_id) == "RUNNING"


def test_a_dry_run_records_would_cancel_and_the_job_keeps_running(
    cluster: Cluster, slurm_world: tuple[str, LadderWorld]
) -> None:
    slurm_id, world = slurm_world
    world.setup({"steps": STEPS, "dry_run": True})
    world.idle_for(14)
    assert world.actions(f"slurm:{slurm_id}")[-1] == ("reclaim", "would")
    assert listed(cluster, slurm_id) == "RUNNING"
    assert world.notices()[-1]["notice"].startswith("[dry run] Would cancel now.")


def test_an_exempt_job_is_never_touched(
    cluster: Cluster, slurm_world: tuple[str, LadderWorld]
) -> None:
    slurm_id, world = slurm_world
    world.setup({"steps": STEPS, "dry_run": False, "exempt": {"partitions": ["gpu"]}})
    world.idle_for(14)
    assert world.actions(f"slurm:{slurm_id}") == [("notify_owner", "skipped")]
    assert listed(cluster, slurm_id) == "RUNNING" and world.notices() == []


def test_the_driver_is_idempotent_on_the_real_controller(cluster: Cluster) -> None:
    driver = SlurmDriver(env=cluster.env, timeout_seconds=30)
    before = utc_now().replace(microsecond=0)
    requeued, cancelled = (
        cluster.run("sbatch", "--parsable", "--output=/dev/null", "--wrap", "sleep 600").strip()
        for _ in range(2)
    )
    try:
        deadline = time.monotonic() + 60
        for slurm_id in (requeued, cancelled):
            while listed(cluster, slurm_id) != "RUNNING" and time.monotonic() < deadline:
                time.sleep(0.3)
        # The jobs as GPU Warden records them (the prolog's user, node and start).
        recorded = ReclaimTarget("", "requeue", user="root", nodes=(NODE,), started_at=before)
        requeue = replace(recorded, job_id=f"slurm:{requeued}")
        would = driver.reclaim(requeue, dry_run=True)
        assert (would.outcome, would.detail) == ("would", f"would run: scontrol requeue {requeued}")
        assert listed(cluster, requeued) == "RUNNING"
        done = driver.reclaim(requeue, dry_run=False)
        assert done.outcome == "reclaimed", done.detail
        # Requeued: on its way back to the queue; a second requeue changes nothing.
        again = driver.reclaim(requeue, dry_run=False)
        assert again.outcome == "gone" and "already pending again" in again.detail
        cancel = replace(recorded, job_id=f"slurm:{cancelled}", mode="cancel")
        done = driver.reclaim(cancel, dry_run=False)
        assert done.outcome == "reclaimed", done.detail
        cluster.wait_gone(cancelled)
        gone = driver.reclaim(cancel, dry_run=False)
        assert gone.outcome == "gone", gone.detail
        assert driver.reclaim(replace(cancel, mode="requeue"), dry_run=False).outcome == "gone"
    finally:
        for slurm_id in (requeued, cancelled):
            cluster.run("scancel", slurm_id, check=False)
            cluster.wait_gone(slurm_id)


def test_the_driver_answers_failed_and_never_raises(tmp_path) -> None:
    slow = tmp_path / "squeue"
    slow.write_text("#!/bin/sh\nsleep 5\n")
    slow.chmod(0o755)
    target = ReclaimTarget("slurm:5", "cancel", user="alice", nodes=("node-a",))
    timed_out = SlurmDriver(squeue_command=str(slow), timeout_seconds=0.5).reclaim(
        target, dry_run=False
    )
    assert timed_out == ReclaimResult(
        "failed", f"{slow} -h -j 5 -o {SQUEUE_FORMAT} timed out after 0.5 s (no stderr)"
    )
    missing = SlurmDriver(squeue_command=str(tmp_path / "nowhere")).reclaim(target, dry_run=False)
    assert missing.outcome == "failed" and f"could not run {tmp_path}/nowhere" in missing.detail
    for job_id, mode in (
        ("slurm:5 -u root", "cancel"),
        ("k8s:ns/p", "cancel"),
        ("slurm:5", "suspend"),
    ):
        wrong = replace(target, job_id=job_id, mode=mode)
        assert SlurmDriver().reclaim(wrong, dry_run=False).outcome == "failed"
