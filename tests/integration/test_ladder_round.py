"""The acting round on both stores: warned twice then reclaimed, once; busy again resets; dry
run only says what it would do; exempt jobs are skipped once; a reclaim cut short by a crash is
retried, never repeated; a failing driver is retried later; an ended job is left alone."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine, select

from service.actions.base import ReclaimResult
from service.db import ladder_repo
from service.db.schema import ladder_actions
from tests.alerting_support import add_job
from tests.ladder_support import BUSY, IDLE_HELD, STEPS, LadderWorld, RecordingDriver
from tests.receivers import Receiver
from tests.support import FakeClock

JOB = "slurm:4242"


@pytest.fixture
def world(app, engine: Engine, clock: FakeClock, receiver: Receiver) -> LadderWorld:
    driver = RecordingDriver()
    w = LadderWorld(app.state.ctx, engine, clock, receiver, {"slurm": driver})
    w.samples(1, IDLE_HELD)  # the GPU is known before the job is registered on it
    return w


def driver(world: LadderWorld) -> RecordingDriver:
    d = world.drivers["slurm"]
    assert isinstance(d, RecordingDriver)
    return d


def start_job(world: LadderWorld, **kw: object) -> None:
    add_job(world.engine, JOB, world.gpus, started_at=world.clock() - timedelta(minutes=1))
    if kw:
        from service.db.schema import jobs

        with world.engine.begin() as conn:
            conn.execute(jobs.update().where(jobs.c.id == JOB).values(**kw))


def test_an_idle_job_is_warned_twice_then_reclaimed_once(world: LadderWorld) -> None:
    world.setup({"steps": STEPS, "dry_run": False})
    start_job(world)
    world.idle_for(4)
    assert world.actions(JOB) == []
    world.idle_for(2)
    assert world.actions(JOB) == [("notify_owner", "warned")]
    world.idle_for(10)
    assert world.actions(JOB) == [
        ("notify_owner", "warned"), ("notify_owner", "warned"), ("reclaim", "reclaimed"),
    ]  # fmt: skip
    assert driver(world).calls == [(JOB, "cancel", False)]
    world.idle_for(3)  # still idle-held (the job's end not yet seen): nothing more
    assert len(world.actions(JOB)) == 3 and len(driver(world).calls) == 1
    notices = world.notices()
    assert len(notices) == 3
    first = notices[0]
    assert first["notice"].startswith(f"Job {JOB} (alice) has been idle-held since")
    assert first["next_step"] == "warn" and "Next: warn at" in first["notice"]
    assert (
        notices[1]["next_step"] == "cancel"
        and "unless the job's GPUs are busy" in notices[1]["notice"]
    )
    assert notices[2]["notice"].startswith("Reclaimed (cancel).")
    with world.engine.connect() as conn:
        rows = conn.execute(select(ladder_actions).order_by(ladder_actions.c.id)).all()
    assert [r.step for r in rows] == [0, 1, 2]
    assert all(r.value == 1.0 and r.threshold == 1.0 and r.user == "alice" for r in rows)
    assert rows[2].driver == "slurm" and rows[2].mode == "cancel" and rows[2].dry_run == 0
    # Each step at its time, counted from the condition's start.
    for row, step in zip(rows, STEPS, strict=True):
        minutes = int(step["after"].rstrip("m"))
        assert timedelta(minutes=minutes) <= row.at - row.since < timedelta(minutes=minutes + 1)


def test_a_job_busy_again_after_the_first_warning_is_not_reclaimed(world: LadderWorld) -> None:
    world.setup({"steps": STEPS, "dry_run": False})
    start_job(world)
    world.idle_for(6)
    assert world.actions(JOB) == [("notify_owner", "warned")]
    world.samples(0.5, BUSY)  # half a minute of work: the idle-held minute window still fires
    world.idle_for(7)
    outcomes = world.actions(JOB)
    assert outcomes[:2] == [("notify_owner", "warned"), ("notify_owner", "skipped")]
    assert ("reclaim", "reclaimed") not in outcomes and driver(world).calls == []


def test_a_dry_run_records_what_it_would_do_and_touches_nothing(world: LadderWorld) -> None:
    world.setup({"steps": STEPS})  # dry_run defaults to true
    start_job(world)
    world.idle_for(16)
    assert world.actions(JOB) == [
        ("notify_owner", "would"), ("notify_owner", "would"), ("reclaim", "would"),
    ]  # fmt: skip
    assert driver(world).calls == [(JOB, "cancel", True)]
    notices = world.notices()
    assert [n["notice"].split(".")[0] for n in notices] == [
        "[dry run] Would warn now", "[dry run] Would warn now", "[dry run] Would cancel now",
    ]  # fmt: skip


def test_an_exempt_job_is_skipped_once_and_never_touched(world: LadderWorld) -> None:
    world.setup({"steps": STEPS, "dry_run": False, "exempt": {"users": ["alice"]}})
    start_job(world)
    world.idle_for(16)
    assert world.actions(JOB) == [("notify_owner", "skipped")]
    assert driver(world).calls == [] and world.notices() == []


def test_a_labelled_job_is_exempt_by_default(world: LadderWorld) -> None:
    world.setup({"steps": STEPS, "dry_run": False})
    start_job(world, labels={"gpuwarden.io/exempt": "true"})
    world.idle_for(16)
    assert world.actions(JOB) == [("notify_owner", "skipped")]


def test_a_reclaim_cut_short_is_retried_once_and_a_failure_later(world: LadderWorld) -> None:
    world.ctx.settings.action_retry_seconds = 120
    world.setup({"steps": STEPS, "dry_run": False})
    start_job(world)
    driver(world).answers = [ReclaimResult("failed", "scancel timed out after 30 s")]
    world.idle_for(13)
    assert world.actions(JOB)[-1] == ("reclaim", "failed")
    world.idle_for(1)  # within the retry delay: not tried again
    assert len(driver(world).calls) == 1
    # A crash after the intent and the driver's work, before the outcome: the next try finds
    # the job gone, and the ladder stops there.
    driver(world).answers = [ReclaimResult("gone", "job 4242 has ended (not in squeue)")]
    world.idle_for(2)
    assert world.actions(JOB)[-1] == ("reclaim", "gone")
    assert len(driver(world).calls) == 2
    with world.engine.connect() as conn:
        assert ladder_repo.active_progress(conn) == []
        detail = conn.execute(
            select(ladder_actions.c.detail).order_by(ladder_actions.c.id.desc())
        ).scalar()
    assert detail is not None and "interrupted" in detail


def test_an_ended_job_is_recorded_gone_and_left_alone(world: LadderWorld) -> None:
    world.setup({"steps": STEPS, "dry_run": False})
    start_job(world)
    world.idle_for(6)
    start_job_end = world.clock()
    from service.db.schema import jobs

    with world.engine.begin() as conn:
        conn.execute(jobs.update().where(jobs.c.id == JOB).values(ended_at=start_job_end))
    world.idle_for(10)
    assert world.actions(JOB) == [("notify_owner", "warned"), ("notify_owner", "gone")]
    assert driver(world).calls == []


def test_policies_check_live_explains_the_ladder_on_the_job(
    world: LadderWorld, server: str, tokens: dict[str, str], tmp_path, capsys
) -> None:
    import yaml

    from service.cli.main import main
    from tests.ladder_support import idle_policy

    ladder = {"steps": STEPS, "dry_run": False}
    world.setup(ladder)
    start_job(world)
    world.idle_for(6)  # past the first warning (T+5m)
    assert world.actions(JOB) == [("notify_owner", "warned")]
    config = tmp_path / "gpuwarden.yaml"
    channel = {"name": "owners", "type": "webhook", "url": world.receiver.url}
    config.write_text(yaml.safe_dump({"channels": [channel], "policies": [idle_policy(ladder)]}))
    code = main(["policies", "check", str(config), "--live", "--url", server,
                 "--token", tokens["reader"]])  # fmt: skip
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (
        "idle-held-job: when idle-held begins (T): warn at T+5m, warn at T+8m, reclaim at T+12m"
    )
    assert lines[2].startswith(f"  {JOB} idle-held since ")
    assert ": warned " in lines[2] and ", warn " in lines[2] and ", cancel " in lines[2]


def test_the_rest_api_takes_a_ladder_and_names_a_bad_field(http, tokens: dict[str, str]) -> None:
    from tests.alerting_support import auth
    from tests.ladder_support import idle_policy

    admin, reader = auth(tokens["admin"]), auth(tokens["reader"])
    doc = idle_policy({"steps": STEPS}, channels=())
    r = http.put("/api/v1/policies/idle-held-job", json=doc, headers=admin)
    assert r.status_code == 201, r.text
    assert r.json()["ladder"]["dry_run"] is True and len(r.json()["ladder"]["steps"]) == 3
    assert (
        http.get("/api/v1/policies/idle-held-job", headers=reader).json()["ladder"]
        == r.json()["ladder"]
    )
    assert http.put("/api/v1/policies/idle-held-job", json=doc, headers=reader).status_code == 403
    bad = idle_policy({"steps": [*STEPS[:2], {"action": "reclaim", "after": "7m"}]}, channels=())
    r = http.put("/api/v1/policies/idle-held-job", json=bad, headers=admin)
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "ladder", "steps", 2, "after"]
    assert "must be later than steps.1.after (8m)" in err["msg"]


def test_a_gpu_policy_acts_on_the_one_job_holding_the_gpu(world: LadderWorld) -> None:
    world.setup({"steps": STEPS}, scope="gpu")
    start_job(world)
    world.idle_for(16)
    assert world.actions(JOB) == [
        ("notify_owner", "would"), ("notify_owner", "would"), ("reclaim", "would"),
    ]  # fmt: skip


def test_a_resolved_episode_resets_the_ladder(world: LadderWorld) -> None:
    world.setup({"steps": STEPS, "dry_run": False})
    start_job(world)
    world.idle_for(6)
    world.idle_for(3, BUSY)  # the alert resolves
    world.idle_for(7)  # a new episode: its ladder starts from the first warning
    assert world.actions(JOB) == [
        ("notify_owner", "warned"), ("notify_owner", "skipped"), ("notify_owner", "warned"),
    ]  # fmt: skip
    with world.engine.connect() as conn:
        rows = conn.execute(select(ladder_actions).order_by(ladder_actions.c.id)).all()
    assert rows[1].reason.startswith("the condition cleared") and rows[1].user == "alice"
    assert rows[0].alert_id == rows[1].alert_id != rows[2].alert_id
    assert driver(world).calls == []
