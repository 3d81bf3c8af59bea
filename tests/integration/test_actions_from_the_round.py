"""The acting round's own audit rows through GET /api/v1/actions and /metrics: what the ladder
writes is what the surfaces read."""

from __future__ import annotations

from datetime import timedelta

from service.actions.slurm import SlurmDriver
from tests.alerting_support import add_job
from tests.integration.actions_metrics_support import actions as counted
from tests.integration.actions_support import get, outcomes
from tests.ladder_support import IDLE_HELD, LadderWorld
from tests.ladder_support import STEPS as LADDER_STEPS
from tests.receivers import Receiver
from tests.slurm_support import squeue_stand_in


def test_the_ladder_s_own_dry_run_reads_back_as_written(
    app, http, tokens, engine, clock, tmp_path
) -> None:
    """The acting round (dry run, the real Slurm driver, which only reads squeue then) writes
    the log; the route, the filters and the counter read those very rows."""
    receiver = Receiver()
    started_at = clock() - timedelta(minutes=1)
    squeue = squeue_stand_in(tmp_path / "squeue", "4242", user="alice", started_at=started_at)
    try:
        world = LadderWorld(
            app.state.ctx, engine, clock, receiver,
            {"slurm": SlurmDriver.from_settings(
                app.state.ctx.settings.model_copy(update={"slurm_squeue_command": str(squeue)})
            )},
        )  # fmt: skip
        world.samples(1, IDLE_HELD)
        world.setup({"steps": LADDER_STEPS})  # dry_run defaults to true
        add_job(engine, "slurm:4242", world.gpus, started_at=started_at)
        world.idle_for(16)
    finally:
        receiver.close()
    rows = get(http, tokens["reader"], job="slurm:4242").json()
    assert [(a["step"], a["action"], a["outcome"]) for a in rows] == [
        (2, "reclaim", "would"), (1, "notify_owner", "would"), (0, "notify_owner", "would"),
    ]  # fmt: skip
    assert all(a["dry_run"] and a["user"] == "alice" and a["team"] == "ml" for a in rows)
    assert rows[0]["driver"] == "slurm" and rows[0]["detail"] == "would run: scancel 4242"
    assert rows[0]["since"] is not None and rows[0]["value"] == rows[0]["threshold"] == 1.0
    assert outcomes(get(http, tokens["reader"], team="ml", outcome="would")) == ["would"] * 3
    assert get(http, tokens["reader"], outcome="reclaimed").json() == []
    assert counted(http)[("idle-held-job", "reclaim", "would")] == 1
    assert counted(http)[("idle-held-job", "reclaim", "reclaimed")] == 0
