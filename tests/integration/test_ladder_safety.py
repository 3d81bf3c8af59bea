"""The ladder-safety matrix on both stores (issue 45): each way the ladder once reclaimed a job it
should not have, now refused with the reason in the audit log, beside the case that must still
act. The scheduler's side (canonical ids, user and nodes checked by squeue) runs on a real Slurm
in test_ladder_slurm.py; the Kubernetes driver's in test_kubernetes_driver.py."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from sqlalchemy import Engine, update

from service.actions.base import ProbeResult, ReclaimResult, ReclaimTarget
from service.db import policies_repo
from service.db.schema import nodes
from service.thresholds.policy import parse_policy
from tests.alerting_support import add_job
from tests.integration.cost_data import store_series
from tests.ladder_support import BUSY, IDLE_HELD, STEPS, LadderWorld, ProbingDriver, idle_policy
from tests.receivers import Receiver
from tests.support import FakeClock

JOB = "slurm:4242"
RECLAIMED = ("reclaim", "reclaimed")


@pytest.fixture
def world(app, engine: Engine, clock: FakeClock, receiver: Receiver) -> LadderWorld:
    w = LadderWorld(app.state.ctx, engine, clock, receiver, {"slurm": ProbingDriver()})
    w.samples(1, IDLE_HELD)  # the GPU is known before the job is registered on it
    return w


def driver(world: LadderWorld) -> ProbingDriver:
    d = world.drivers["slurm"]
    assert isinstance(d, ProbingDriver)
    return d


def start(world: LadderWorld, *, dry_run: bool = False, team: str = "ml", **ladder: object) -> None:
    world.setup({"steps": STEPS, "dry_run": dry_run, **ladder})
    add_job(
        world.engine, JOB, world.gpus, started_at=world.clock() - timedelta(minutes=1), team=team
    )


def test_a_truly_idle_job_with_fresh_data_and_a_delivered_warning_is_reclaimed_on_time(
    world: LadderWorld,
) -> None:
    start(world)
    world.idle_for(16)
    assert world.actions(JOB) == [
        ("notify_owner", "warned"), ("notify_owner", "warned"), RECLAIMED,
    ]  # fmt: skip
    assert driver(world).calls == [(JOB, "cancel", False)]
    # Each step asked the scheduler first, with what GPU Warden recorded of the job.
    asked = driver(world).probed
    assert len(asked) == 3 and {(t.user, t.nodes) for t in asked} == {("alice", ("node-a",))}
    assert all(t.started_at is not None for t in asked)


def test_no_step_without_samples_the_agent_killed_after_the_first_warning(
    world: LadderWorld,
) -> None:
    start(world)
    world.idle_for(6)
    assert world.actions(JOB) == [("notify_owner", "warned")]
    world.wait(20)  # the agent is dead: the alert stays firing, stale
    assert RECLAIMED not in world.actions(JOB) and driver(world).calls == []
    held = world.reasons(JOB, "held")
    assert held and "stale" in held[0]
    assert len(held) <= 3  # recorded when the reason changes, not every round


def test_no_step_while_samples_cover_too_little_of_the_condition(world: LadderWorld) -> None:
    world.ctx.settings.ladder_max_sample_age_seconds = 3600  # isolate the coverage rule
    start(world)
    world.idle_for(2)
    world.wait(2)  # two minutes of nothing while the condition holds (stale, no sample)
    world.idle_for(2)
    # At 5 minutes only 3 of 5 minutes reported: the first warning waits.
    assert ("notify_owner", "warned") not in world.actions(JOB)
    assert any("% of the" in r for r in world.reasons(JOB, "held"))


def test_a_late_batch_showing_work_before_the_warning_restarts_the_ladder(
    world: LadderWorld,
) -> None:
    start(world)
    world.idle_for(4)
    world.samples(0.5, IDLE_HELD)
    gap = world.clock()  # the next 30 s of samples are stuck in the agent's spool
    world.clock.set(gap + timedelta(seconds=30))
    world.idle_for(2)
    assert world.actions(JOB) == [("notify_owner", "warned")]
    # The spool replays: the GPU was busy in the gap, before the warning was sent.
    store_series(
        world.engine, world.clock, uuid=world.gpus[0], start=gap, metrics=[BUSY] * 3,
        hostname=world.hostname,
    )  # fmt: skip
    world.idle_for(8)
    outcomes = world.actions(JOB)
    assert outcomes[1] == ("notify_owner", "skipped") and RECLAIMED not in outcomes
    assert "busy again" in world.reasons(JOB, "skipped")[0]


def test_samples_from_a_node_the_gpu_moved_to_do_not_speak_for_the_job(
    world: LadderWorld,
) -> None:
    start(world)
    world.idle_for(6)
    assert world.actions(JOB) == [("notify_owner", "warned")]
    world.wait(2)  # node-a falls silent; past 60 s another node may take the GPU over
    world.hostname = "node-b"
    world.idle_for(10)  # node-b's agent reports the GPU idle
    assert RECLAIMED not in world.actions(JOB) and driver(world).calls == []
    assert any("now reports from node node-b" in r for r in world.reasons(JOB, "held"))
    # The scheduler is asked about the node that registered the job, not the new one.
    assert {t.nodes for t in driver(world).probed} == {("node-a",)}


def test_a_node_clock_off_blocks_steps_and_says_so(world: LadderWorld) -> None:
    start(world)
    for _ in range(14):  # each batch's Date header measures it anew (test_ingest_clock.py)
        with world.engine.begin() as conn:
            conn.execute(
                update(nodes)
                .where(nodes.c.hostname == "node-a")
                .values(clock_offset_seconds=-600.0, clock_checked_at=world.clock())
            )
        world.idle_for(1)
    assert world.actions(JOB) == [("notify_owner", "held")]
    assert "clock is 600 s behind the central's" in world.reasons(JOB, "held")[0]


def test_a_dry_run_switched_live_warns_for_real_before_it_reclaims(world: LadderWorld) -> None:
    start(world, dry_run=True)
    world.idle_for(10)
    assert world.actions(JOB) == [("notify_owner", "would"), ("notify_owner", "would")]
    live = idle_policy({"steps": STEPS, "dry_run": False})
    with world.engine.begin() as conn:
        policies_repo.put_policy(
            conn, policy=parse_policy(live), source="api", now=world.clock()
        )  # fmt: skip
    world.idle_for(4)  # the dry run's reclaim step was due: not taken live
    assert RECLAIMED not in world.actions(JOB) and driver(world).calls == []
    assert "the ladder changed" in world.reasons(JOB, "skipped")[0]
    world.idle_for(12)
    assert world.actions(JOB)[-3:] == [
        ("notify_owner", "warned"), ("notify_owner", "warned"), RECLAIMED,
    ]  # fmt: skip


def test_a_finished_dry_run_switched_live_starts_over(world: LadderWorld) -> None:
    start(world, dry_run=True)
    world.idle_for(14)
    assert world.actions(JOB)[-1] == ("reclaim", "would")
    live = idle_policy({"steps": STEPS, "dry_run": False})
    with world.engine.begin() as conn:
        policies_repo.put_policy(conn, policy=parse_policy(live), source="api", now=world.clock())
    world.idle_for(4)
    assert world.actions(JOB)[-1] == ("reclaim", "skipped")  # filed where the ladder stood
    world.idle_for(2)
    assert world.actions(JOB)[-1] == ("notify_owner", "warned") and driver(world).calls == [
        (JOB, "cancel", True)
    ]


def test_a_warning_that_never_reached_anyone_does_not_count(
    world: LadderWorld, receiver: Receiver
) -> None:
    receiver.default_status = 503  # the channel is down: every notice stays queued
    start(world)
    world.idle_for(16)
    assert world.actions(JOB)[:2] == [("notify_owner", "warned"), ("notify_owner", "warned")]
    assert RECLAIMED not in world.actions(JOB) and driver(world).calls == []
    assert "no warning of this episode has reached the owner" in world.reasons(JOB, "held")[-1]
    receiver.default_status = 200  # it comes back: the queued warnings go, then the reclaim
    world.idle_for(15)  # the outbox's backoff is at most 10 minutes
    assert world.actions(JOB)[-1] == RECLAIMED


def test_a_job_the_scheduler_lists_otherwise_is_never_touched(world: LadderWorld) -> None:
    driver(world).found = ProbeResult("mismatch", "squeue lists job 4242 for user mallory")
    start(world)
    world.idle_for(16)
    assert world.actions(JOB) == [("notify_owner", "skipped")]
    assert "mallory" in world.reasons(JOB, "skipped")[0]
    assert driver(world).calls == [] and world.notices() == []


def test_no_step_while_the_scheduler_cannot_be_asked(world: LadderWorld) -> None:
    driver(world).found = ProbeResult("unknown", "squeue timed out after 30 s")
    start(world)
    world.idle_for(16)
    assert world.actions(JOB) == [("notify_owner", "held")]
    assert driver(world).calls == [] and world.notices() == []


def test_a_team_exemption_trusts_the_schedulers_account_not_the_job_comment(
    world: LadderWorld,
) -> None:
    # The owner wrote team=oncall in the job's comment; Slurm charges the account physics.
    start(world, team="oncall", exempt={"teams": ["oncall"]})
    world.idle_for(6)
    assert world.actions(JOB) == [("notify_owner", "warned")]


def test_a_team_exempt_by_its_account_is_skipped(world: LadderWorld) -> None:
    driver(world).account = "oncall"
    start(world, team="physics", exempt={"teams": ["oncall"]})
    world.idle_for(16)
    assert world.actions(JOB) == [("notify_owner", "skipped")]
    assert world.reasons(JOB, "skipped") == ["exempt: team oncall"]


@dataclass
class PairingDriver(ProbingDriver):
    """Each live reclaim waits for another to arrive (a barrier of two): sent one at a time,
    they never meet and fail; it also counts how many ran at once."""

    barrier: threading.Barrier = field(default_factory=lambda: threading.Barrier(2, timeout=10))
    running: int = 0
    most: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reclaim(self, target: ReclaimTarget, *, dry_run: bool) -> ReclaimResult:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            self.barrier.wait()
            time.sleep(0.2)  # long enough for a third call to overlap, were it let through
        except threading.BrokenBarrierError:
            return ReclaimResult("failed", "sent alone")
        finally:
            with self.lock:
                self.running -= 1
        return super().reclaim(target, dry_run=dry_run)


def test_a_round_sends_its_reclaims_in_parallel_up_to_the_bound(
    app, engine: Engine, clock: FakeClock, receiver: Receiver
) -> None:
    pairing = PairingDriver()
    gpus = ("GPU-a0", "GPU-a1", "GPU-a2", "GPU-a3")
    world = LadderWorld(app.state.ctx, engine, clock, receiver, {"slurm": pairing}, gpus=gpus)
    world.ctx.settings.ladder_parallel_reclaims = 2
    world.samples(1, IDLE_HELD)
    world.setup({"steps": STEPS, "dry_run": False})
    jobs = [f"slurm:{500 + i}" for i in range(len(gpus))]
    for job, gpu in zip(jobs, gpus, strict=True):
        add_job(world.engine, job, (gpu,), started_at=world.clock() - timedelta(minutes=1))
    world.idle_for(16)
    assert [world.actions(j)[-1] for j in jobs] == [RECLAIMED] * 4
    assert sorted(c[0] for c in pairing.calls) == sorted(jobs)
    assert pairing.most == 2  # two at a time: in parallel, and never past the bound
