"""The Slurm driver's pure rules: reading one squeue line, comparing Slurm's facts with GPU
Warden's record, and telling a reused id's new run from the stored one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from service.actions.base import ReclaimTarget, SchedulerFacts
from service.actions.slurm import SqueueLine, differences, parse_squeue_line
from service.core.job_runs import is_new_run, moved_job_id

T0 = datetime(2026, 12, 7, 4, 58, 9, tzinfo=UTC)


def test_a_squeue_line_reads_with_slurm_s_placeholders_as_none() -> None:
    running = parse_squeue_line(f"1_0:2:root:RUNNING:(null):{int(T0.timestamp())}:gw[1-2]\n")
    assert running == SqueueLine("1_0", "2", "root", "RUNNING", None, T0, "gw[1-2]")
    pending = parse_squeue_line("1_[2-3]:1:root:PENDING:ml:N/A:")
    assert pending == SqueueLine("1_[2-3]", "1", "root", "PENDING", "ml", None, "")


def test_a_start_printed_as_a_date_or_a_short_line_is_not_read() -> None:
    # Without SLURM_TIME_FORMAT=%s squeue prints 2026-12-07T04:58:09: never a silent None.
    assert parse_squeue_line("1:1:root:RUNNING:ml:2026-12-07T04:58:09:gw") is None
    assert parse_squeue_line("1:1:root:RUNNING:ml:04/12-04:58:gw") is None
    assert parse_squeue_line("RUNNING") is None


def test_each_difference_from_the_record_is_named() -> None:
    target = ReclaimTarget(
        "slurm:7", "cancel", user="alice", nodes=("GPU-07.cluster.example",), started_at=T0
    )
    same = SchedulerFacts("7", user="alice", nodes=("gpu-07", "gpu-08"), started_at=T0)
    assert differences(target, same, tolerance_seconds=120) == []
    # A record that starts after Slurm's start (registered late, first seen running) agrees.
    late_record = SchedulerFacts(
        "7", user="alice", nodes=("gpu-07",), started_at=T0 - timedelta(hours=3)
    )
    assert differences(target, late_record, tolerance_seconds=120) == []
    other = SchedulerFacts("7", user="bob", nodes=("gpu-08",), started_at=T0 + timedelta(days=90))
    why = differences(target, other, tolerance_seconds=120)
    assert len(why) == 3
    assert "user 'bob'" in why[0] and "not on GPU-07.cluster.example" in why[1]
    assert "7776000 s after" in why[2] and "another job of the same id" in why[2]


def test_a_run_that_starts_after_the_stored_run_ended_is_a_new_job() -> None:
    ended = T0 + timedelta(hours=1)
    new = {"old_started_at": T0, "old_ended_at": ended}
    assert is_new_run("slurm:101", **new, started_at=ended + timedelta(days=60))
    assert is_new_run("slurm:101", **new, started_at=ended)
    assert not is_new_run("slurm:101", **new, started_at=T0)  # the same run again
    assert not is_new_run("slurm:101", old_started_at=T0, old_ended_at=None, started_at=ended)
    assert not is_new_run("k8s:ml/p", **new, started_at=ended + timedelta(days=1))
    assert moved_job_id("slurm:101", T0) == "slurm:101@20261207T045809Z"
