"""The Slurm reclaim driver: ``scancel <id>`` or ``scontrol requeue <id>``, after reading the
job's state with ``squeue``, each through a configured command with a timeout."""

from __future__ import annotations

import logging
import re
import shlex
import subprocess
from collections.abc import Sequence

from service.actions.base import ReclaimResult, ReclaimTarget
from service.settings import Settings

log = logging.getLogger(__name__)

# A Slurm job id as GPU Warden writes it after ``slurm:``: a job, an array task, a het part.
_SLURM_ID = re.compile(r"^[0-9]+([_+][0-9]+)?$")
# Job states in which nothing is left to free (squeue shows them briefly after the end).
# COMPLETING is not one: a requeued job passes through it on its way back to PENDING, so a
# cancel then still runs (and scancel itself says when the job is really ending).
_ENDED_STATES = frozenset(
    {
        "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED",
        "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT",
    }
)  # fmt: skip
# States of a job already on its way back to the queue (or ending): a requeue has nothing to do.
_REQUEUED_STATES = frozenset({"COMPLETING", "PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
# What scancel and scontrol say about a job that has already ended or never existed.
_GONE_ERRORS = ("invalid job id", "already completing or completed", "job has already finished")


class SlurmDriver:
    """Cancels or requeues a Slurm job; idempotent: a job already ended answers ``gone``, one
    already requeued (pending again) answers ``gone`` too. Never raises."""

    name = "slurm"

    def __init__(
        self,
        *,
        cancel_command: str = "scancel",
        requeue_command: str = "scontrol requeue",
        squeue_command: str = "squeue",
        timeout_seconds: float = 30.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.commands = {
            "cancel": shlex.split(cancel_command),
            "requeue": shlex.split(requeue_command),
        }
        self.squeue = shlex.split(squeue_command)
        self.timeout_seconds = timeout_seconds
        self.env = env  # None: the service's own environment

    @classmethod
    def from_settings(cls, settings: Settings) -> SlurmDriver:
        """The driver with the configured commands and timeout."""
        return cls(
            cancel_command=settings.slurm_cancel_command,
            requeue_command=settings.slurm_requeue_command,
            squeue_command=settings.slurm_squeue_command,
            timeout_seconds=settings.action_timeout_seconds,
        )

    def reclaim(self, target: ReclaimTarget, *, dry_run: bool) -> ReclaimResult:
        """Free ``target``'s GPUs by its mode (cancel or requeue); ``would`` under dry run."""
        prefix, _, slurm_id = target.job_id.partition(":")
        if prefix != "slurm" or not _SLURM_ID.match(slurm_id):
            return ReclaimResult("failed", f"{target.job_id!r} is not a Slurm job id (slurm:<n>)")
        command = self.commands.get(target.mode)
        if command is None:
            return ReclaimResult("failed", f"unknown Slurm mode {target.mode!r}")
        argv = [*command, slurm_id]
        if dry_run:
            return ReclaimResult("would", f"would run: {shlex.join(argv)}")
        state = self._state(slurm_id)
        if state is None or state in _ENDED_STATES:
            return ReclaimResult("gone", f"job {slurm_id} has ended ({state or 'not in squeue'})")
        if target.mode == "requeue" and state in _REQUEUED_STATES:
            return ReclaimResult("gone", f"job {slurm_id} is already pending again ({state})")
        if state.startswith("failed:"):
            return ReclaimResult("failed", state.removeprefix("failed:"))
        return self._act(argv, slurm_id)

    def _state(self, slurm_id: str) -> str | None:
        """The job's state as squeue lists it, None when squeue no longer lists it, or
        ``failed:<why>`` when squeue could not be asked."""
        done = self._run([*self.squeue, "-h", "-j", slurm_id, "-o", "%T"])
        if isinstance(done, str):
            return f"failed:{done}"
        if done.returncode != 0:
            if _gone(done.stderr):
                return None
            return f"failed:squeue exited {done.returncode}: {done.stderr.strip()[:200]}"
        states = done.stdout.split()
        return states[0].upper() if states else None

    def _act(self, argv: Sequence[str], slurm_id: str) -> ReclaimResult:
        done = self._run(argv)
        line = shlex.join(argv)
        if isinstance(done, str):
            return ReclaimResult("failed", f"{line}: {done}")
        if done.returncode == 0:
            return ReclaimResult("reclaimed", f"ran: {line}")
        if _gone(done.stderr):
            return ReclaimResult("gone", f"{line}: job {slurm_id} had already ended")
        return ReclaimResult(
            "failed", f"{line} exited {done.returncode}: {done.stderr.strip()[:200]}"
        )

    def _run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str] | str:
        """The finished command, or why it could not run (missing, timed out)."""
        try:
            return subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=self.timeout_seconds,
                check=False,
                env=self.env,
            )
        except subprocess.TimeoutExpired:
            return f"timed out after {self.timeout_seconds:g} s"
        except OSError as exc:
            return f"could not run {argv[0]!r}: {exc.strerror or exc}"


def _gone(stderr: str) -> bool:
    text = stderr.lower()
    return any(e in text for e in _GONE_ERRORS)
