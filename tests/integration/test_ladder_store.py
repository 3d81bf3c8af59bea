"""The ladder's progress and audit-log tables: a step is counted done once, the log filters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine

from service.db import actions_repo, ladder_repo
from service.db.rows import NewAction

T0 = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)


def test_a_step_is_finished_once_and_the_ladder_is_done_after_its_last(engine: Engine) -> None:
    with engine.begin() as conn:
        p = ladder_repo.progress_for(
            conn, policy="idle", job_id="slurm:1", alert_id=7, episode_start=T0, now=T0
        )
        again = ladder_repo.progress_for(
            conn, policy="idle", job_id="slurm:1", alert_id=7, episode_start=T0, now=T0
        )
        assert again.id == p.id and p.steps_done == 0 and p.state == "active"
        assert ladder_repo.finish_step(conn, progress_id=p.id, step=0, now=T0, last=False)
        assert not ladder_repo.finish_step(conn, progress_id=p.id, step=0, now=T0, last=False)
        assert ladder_repo.mark_pending(conn, progress_id=p.id, step=1, now=T0)
        assert not ladder_repo.mark_pending(conn, progress_id=p.id, step=0, now=T0)
        (active,) = ladder_repo.active_progress(conn)
        assert active.pending_step == 1 and active.steps_done == 1
        assert ladder_repo.finish_step(conn, progress_id=p.id, step=1, now=T0, last=True)
        assert ladder_repo.active_progress(conn) == []


def test_the_audit_log_filters_by_job_user_policy_outcome_and_time(engine: Engine) -> None:
    with engine.begin() as conn:
        for i, (job, user, outcome) in enumerate(
            [
                ("slurm:1", "ana", "warned"),
                ("slurm:1", "ana", "reclaimed"),
                ("slurm:2", "bo", "would"),
            ]
        ):
            actions_repo.record_action(
                conn,
                NewAction(
                    at=T0 + timedelta(minutes=i), policy="idle", job_id=job, user=user,
                    action="notify_owner" if outcome != "reclaimed" else "reclaim", outcome=outcome,
                    dry_run=outcome == "would", waste_usd=1.5 * i, since=T0,
                ),
            )  # fmt: skip
        rows = actions_repo.list_actions(conn)
        assert [r["outcome"] for r in rows] == ["would", "reclaimed", "warned"]
        assert rows[0]["dry_run"] is True and rows[1]["dry_run"] is False
        assert len(actions_repo.list_actions(conn, job_id="slurm:1")) == 2
        assert [r["job_id"] for r in actions_repo.list_actions(conn, user="bo")] == ["slurm:2"]
        assert actions_repo.list_actions(conn, policy="other") == []
        assert [r["outcome"] for r in actions_repo.list_actions(conn, outcome="warned")] == [
            "warned"
        ]
        window = actions_repo.list_actions(
            conn, since=T0 + timedelta(minutes=1), until=T0 + timedelta(minutes=2)
        )
        assert [r["outcome"] for r in window] == ["reclaimed"]
        assert len(actions_repo.list_actions(conn, limit=1)) == 1
