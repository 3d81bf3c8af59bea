"""A failed Slurm driver step names its cause: the command line it ran and what that command wrote
to stderr, for a non-zero exit, a timeout (the stderr written before it was stopped) and a command
that could not run. The Slurm commands are the real clients (Debian slurm-wlm) reading a broken
``SLURM_CONF``; no cluster is needed, and the slow command is a stand-in."""

from __future__ import annotations

import os
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from service.actions.base import ReclaimTarget
from service.actions.slurm import SQUEUE_FORMAT, SlurmDriver
from tests.slurm_support import NODE, squeue_stand_in

TARGET = ReclaimTarget(
    "slurm:5", "cancel", user="alice", nodes=(NODE,),
    started_at=datetime.now(UTC) - timedelta(hours=1),
)  # fmt: skip
SQUEUE_ARGS = f"-h -j 5 -o {SQUEUE_FORMAT}"


@pytest.fixture(autouse=True)
def _slurm_clients() -> None:
    absent = [b for b in ("squeue", "scancel", "scontrol") if shutil.which(b) is None]
    if absent:
        why = f"{', '.join(absent)} missing: run scripts/test-services.sh (Debian slurm-wlm)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


def broken_conf(tmp_path: Path) -> dict[str, str]:
    """An environment whose slurm.conf is empty: every Slurm client exits 1 at once."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    return {**os.environ, "SLURM_CONF": str(conf)}


def test_a_squeue_without_its_slurm_conf_times_out_naming_the_command_and_its_error(
    tmp_path: Path,
) -> None:
    # squeue retries a missing slurm.conf for 60 s, so the driver's timeout is what ends it.
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "missing.conf")}
    started = time.monotonic()
    result = SlurmDriver(env=env, timeout_seconds=2).reclaim(TARGET, dry_run=False)
    assert time.monotonic() - started < 45  # a hang bound: squeue alone would retry for 60 s
    assert result.outcome == "failed"
    assert result.detail.startswith(f"squeue {SQUEUE_ARGS} timed out after 2 s: "), result.detail
    assert f"cannot stat file {tmp_path / 'missing.conf'}" in result.detail


def test_a_squeue_that_exits_non_zero_names_the_command_and_its_stderr(tmp_path: Path) -> None:
    found = SlurmDriver(env=broken_conf(tmp_path)).probe(TARGET)
    assert found.outcome == "unknown"
    assert found.detail.startswith(f"squeue {SQUEUE_ARGS} exited 1: "), found.detail
    assert "ClusterName needs to be specified | squeue: fatal:" in found.detail


def test_a_failed_scancel_names_the_command_and_its_stderr(tmp_path: Path) -> None:
    assert TARGET.started_at is not None
    squeue = squeue_stand_in(tmp_path / "squeue", "5", user="alice", started_at=TARGET.started_at)
    driver = SlurmDriver(squeue_command=str(squeue), env=broken_conf(tmp_path))
    result = driver.reclaim(TARGET, dry_run=False)
    assert result.outcome == "failed"
    assert result.detail.startswith("scancel 5 exited 1: scancel: "), result.detail
    assert "ClusterName needs to be specified" in result.detail


def test_a_failed_node_list_expansion_names_the_command_and_its_stderr(tmp_path: Path) -> None:
    assert TARGET.started_at is not None
    squeue = squeue_stand_in(
        tmp_path / "squeue", "5", user="alice", started_at=TARGET.started_at, node="gpu[01-02]"
    )
    found = SlurmDriver(squeue_command=str(squeue), env=broken_conf(tmp_path)).probe(TARGET)
    assert found.outcome == "unknown"
    assert found.detail.startswith("scontrol show hostnames 'gpu[01-02]' exited 1: scontrol: ")
    assert "ClusterName needs to be specified" in found.detail


def test_a_slow_command_s_timeout_keeps_the_stderr_written_before_it_was_stopped(
    tmp_path: Path,
) -> None:
    slow = tmp_path / "scancel"
    slow.write_text(
        "#!/bin/sh\necho 'scancel: error: Socket timed out on send/recv' >&2\nsleep 30\n"
    )
    slow.chmod(0o755)
    assert TARGET.started_at is not None
    squeue = squeue_stand_in(tmp_path / "squeue", "5", user="alice", started_at=TARGET.started_at)
    driver = SlurmDriver(
        squeue_command=str(squeue), cancel_command=f"{slow} --full", timeout_seconds=1
    )
    result = driver.reclaim(TARGET, dry_run=False)
    assert (result.outcome, result.detail) == (
        "failed",
        f"{slow} --full 5 timed out after 1 s: scancel: error: Socket timed out on send/recv",
    )
    silent = tmp_path / "silent"
    silent.write_text("#!/bin/sh\nsleep 30\n")
    silent.chmod(0o755)
    quiet = SlurmDriver(squeue_command=str(silent), timeout_seconds=0.5).probe(TARGET)
    assert quiet.detail == f"{silent} {SQUEUE_ARGS} timed out after 0.5 s (no stderr)"


def test_a_command_that_cannot_run_is_named_with_its_arguments(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "squeue"
    found = SlurmDriver(squeue_command=f"{missing} --clusters=gw").probe(TARGET)
    assert found.outcome == "unknown"
    expected = f"could not run {missing} --clusters=gw {SQUEUE_ARGS}: No such file or directory"
    assert found.detail == expected


def test_a_long_stderr_is_trimmed(tmp_path: Path) -> None:
    noisy = tmp_path / "squeue"
    noisy.write_text('#!/bin/sh\nfor i in $(seq 200); do echo "error line $i" >&2; done\nexit 3\n')
    noisy.chmod(0o755)
    found = SlurmDriver(squeue_command=str(noisy)).probe(TARGET)
    assert found.detail.startswith(f"{noisy} {SQUEUE_ARGS} exited 3: error line 1 | error line 2")
    assert found.detail.endswith("…") and len(found.detail) < 600
