"""The Slurm reclaim driver: ``scancel <id>`` or ``scontrol requeue <id>``, each through a
configured command with a timeout, only after ``squeue`` confirmed that the job of that id is
the one GPU Warden recorded (its id as squeue prints it, its user, its nodes and its start)."""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from service.actions.base import ProbeResult, ReclaimResult, ReclaimTarget, SchedulerFacts
from service.core.job_ids import slurm_id_problem
from service.settings import Settings

log = logging.getLogger(__name__)

# Job states in which nothing is left to free (squeue shows them briefly after the end).
# COMPLETING is not one: a requeued job passes through it on its way back to PENDING, so a
# cancel then still runs (and scancel itself says when the job is really ending).
_ENDED_STATES = frozenset(
    {
        "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED",
        "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT",
    }
)  # fmt: skip
# States of a job back in the queue: it holds no GPUs (a later run registers anew).
_QUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
# States of a job already on its way back to the queue (or ending): a requeue has nothing to do.
_REQUEUED_STATES = _QUEUED_STATES | {"COMPLETING"}
# What scancel and scontrol say about a job that has already ended or never existed.
_GONE_ERRORS = ("invalid job id", "already completing or completed", "job has already finished")
# One squeue line per job: its id as printed (101, 101_3, 101+1), its own job id (an array
# task's or het component's number, which the prolog's SLURM_JOB_ID names), user, state,
# account, start (Unix seconds under SLURM_TIME_FORMAT=%s) and node list (compressed). The
# separator means nothing to a shell (an ``ssh head squeue`` command passes the format through
# one) and appears in no field; a start printed as a date (colons) breaks the field count.
_SEPARATOR = ":"
SQUEUE_FORMAT = _SEPARATOR.join(("%i", "%A", "%u", "%T", "%a", "%S", "%N"))
_FIELDS = SQUEUE_FORMAT.count(_SEPARATOR) + 1
_TIME_HINT = "is SLURM_TIME_FORMAT=%s set where squeue runs?"
# squeue's placeholders for a field a job does not have.
_NO_VALUE = frozenset({"", "(null)", "N/A", "None", "Unknown"})
_NUMERIC = re.compile(r"^[0-9]+$")
# How much of a failed command's stderr an audit row keeps (Slurm's errors are a few lines).
_STDERR_CHARS = 400


@dataclass(frozen=True)
class SqueueLine:
    """One job as ``squeue -o SQUEUE_FORMAT`` lists it (node list still compressed)."""

    printed_id: str
    own_id: str
    user: str
    state: str
    account: str | None
    started_at: datetime | None
    node_list: str


@dataclass(frozen=True)
class _Checked:
    """A verification's answer, and the job's state where squeue listed it."""

    result: ProbeResult
    state: str | None = None


class SlurmDriver:
    """Cancels or requeues a Slurm job, after verifying it against squeue; idempotent: a job
    already ended answers ``gone``, one back in the queue (holding no GPUs) ``gone`` too; one
    that is not the job GPU Warden recorded answers ``failed`` and is left alone. Never raises."""

    name = "slurm"

    def __init__(
        self,
        *,
        cancel_command: str = "scancel",
        requeue_command: str = "scontrol requeue",
        squeue_command: str = "squeue",
        hostnames_command: str = "scontrol show hostnames",
        timeout_seconds: float = 30.0,
        start_tolerance_seconds: float = 120.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.commands = {
            "cancel": shlex.split(cancel_command),
            "requeue": shlex.split(requeue_command),
        }
        self.squeue = shlex.split(squeue_command)
        self.hostnames = shlex.split(hostnames_command)
        self.timeout_seconds = timeout_seconds
        # How much later than GPU Warden's record Slurm may say the job started (the prolog's
        # clock, a node registering late) before it is taken for another job of the same id.
        self.start_tolerance_seconds = start_tolerance_seconds
        self.env = env  # None: the service's own environment

    @classmethod
    def from_settings(cls, settings: Settings) -> SlurmDriver:
        """The driver with the configured commands and timeout."""
        return cls(
            cancel_command=settings.slurm_cancel_command,
            requeue_command=settings.slurm_requeue_command,
            squeue_command=settings.slurm_squeue_command,
            hostnames_command=settings.slurm_hostnames_command,
            timeout_seconds=settings.action_timeout_seconds,
        )

    def probe(self, target: ReclaimTarget) -> ProbeResult:
        """What squeue says of ``target``'s job, compared with GPU Warden's record (reads only)."""
        return self._check(target).result

    def reclaim(self, target: ReclaimTarget, *, dry_run: bool) -> ReclaimResult:
        """Free ``target``'s GPUs by its mode (cancel or requeue) once squeue confirmed the job is
        the one recorded; ``would`` under dry run (which verifies too, and only reads)."""
        command = self.commands.get(target.mode)
        if command is None:
            return ReclaimResult("failed", f"unknown Slurm mode {target.mode!r}")
        if target.user is None or not target.nodes:
            return self._refuse(target, "GPU Warden has no user or no nodes for it to verify")
        checked = self._check(target)
        found = checked.result
        if found.outcome == "mismatch":
            return self._refuse(target, found.detail)
        if found.outcome == "unknown":
            return ReclaimResult("failed", found.detail)
        if found.outcome == "gone":
            return ReclaimResult("gone", found.detail)
        slurm_id = target.job_id.partition(":")[2]
        if target.mode == "requeue" and checked.state in _REQUEUED_STATES:
            why = f"job {slurm_id} is already pending again ({checked.state})"
            return ReclaimResult("gone", why)
        argv = [*command, slurm_id]
        if dry_run:
            return ReclaimResult("would", f"would run: {shlex.join(argv)}")
        return self._act(argv, slurm_id)

    def _refuse(self, target: ReclaimTarget, why: str) -> ReclaimResult:
        """A refused reclaim of ``target``, logged with ``why``."""
        log.warning("Slurm reclaim of %s refused: %s", target.job_id, why)
        return ReclaimResult("failed", f"refused: {why}")

    def _check(self, target: ReclaimTarget) -> _Checked:
        """Read ``target``'s job from squeue and compare it with the record."""
        prefix, _, slurm_id = target.job_id.partition(":")
        if prefix != "slurm":
            return _Checked(ProbeResult("mismatch", f"{target.job_id!r} is not a Slurm job id"))
        problem = slurm_id_problem(slurm_id)
        if problem is not None:
            return _Checked(ProbeResult("mismatch", problem))
        listed = self._squeue(slurm_id)
        if isinstance(listed, ProbeResult):
            return _Checked(listed)
        line = next((j for j in listed if slurm_id in (j.printed_id, j.own_id)), None)
        if line is None:
            if not listed:
                return _Checked(ProbeResult("gone", f"job {slurm_id} has ended (not in squeue)"))
            printed = ", ".join(j.printed_id for j in listed)
            why = f"squeue -j {slurm_id} lists job {printed}, not {slurm_id}"
            return _Checked(ProbeResult("mismatch", why))
        return _Checked(self._compare(target, slurm_id, line), line.state)

    def _compare(self, target: ReclaimTarget, slurm_id: str, line: SqueueLine) -> ProbeResult:
        """``present`` with the facts when ``line`` is the recorded job, else why not."""
        if line.state in _ENDED_STATES:
            return ProbeResult("gone", f"job {slurm_id} has ended ({line.state})")
        if line.state in _QUEUED_STATES:
            return ProbeResult("gone", f"job {slurm_id} is already pending again ({line.state})")
        nodes = self._expand(line.node_list)
        if isinstance(nodes, str):
            return ProbeResult("unknown", nodes)
        facts = SchedulerFacts(
            job_id=line.printed_id,
            user=line.user,
            nodes=nodes,
            account=line.account,
            started_at=line.started_at,
        )
        why = differences(target, facts, tolerance_seconds=self.start_tolerance_seconds)
        if why:
            return ProbeResult("mismatch", f"job {slurm_id}: {'; '.join(why)}", facts)
        return ProbeResult("present", f"job {slurm_id} is {line.state} on {','.join(nodes)}", facts)

    def _squeue(self, slurm_id: str) -> list[SqueueLine] | ProbeResult:
        """The jobs ``squeue -j <slurm_id>`` lists, or a gone or unknown answer."""
        env = {**(os.environ if self.env is None else self.env), "SLURM_TIME_FORMAT": "%s"}
        done = self._run([*self.squeue, "-h", "-j", slurm_id, "-o", SQUEUE_FORMAT], env=env)
        if isinstance(done, str):
            return ProbeResult("unknown", done)
        if done.returncode != 0:
            if _gone(done.stderr):
                return ProbeResult("gone", f"job {slurm_id} has ended (not in squeue)")
            return ProbeResult("unknown", _exited(done))
        lines = [parse_squeue_line(t) for t in done.stdout.splitlines() if t.strip()]
        if any(j is None for j in lines):
            why = f"squeue printed an unexpected line ({_TIME_HINT}): {done.stdout[:200]!r}"
            return ProbeResult("unknown", why)
        return [j for j in lines if j is not None]

    def _expand(self, node_list: str) -> tuple[str, ...] | str:
        """The host names of a Slurm node list (``gpu[01-02],x``), or why they are unknown."""
        if not node_list:
            return ()
        if "[" not in node_list:
            return tuple(node_list.split(","))
        done = self._run([*self.hostnames, node_list])
        if isinstance(done, str):
            return done
        if done.returncode != 0:
            return _exited(done)
        return tuple(done.stdout.split())

    def _act(self, argv: Sequence[str], slurm_id: str) -> ReclaimResult:
        """Run the cancel or requeue command ``argv`` for job ``slurm_id``."""
        done = self._run(argv)
        line = shlex.join(argv)
        if isinstance(done, str):
            return ReclaimResult("failed", done)
        if done.returncode == 0:
            return ReclaimResult("reclaimed", f"ran: {line}")
        if _gone(done.stderr):
            return ReclaimResult("gone", f"{line}: job {slurm_id} had already ended")
        return ReclaimResult("failed", _exited(done))

    def _run(
        self, argv: Sequence[str], *, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str] | str:
        """The finished command, or why it could not run (missing, timed out) naming the command
        line and what it wrote to stderr before it was stopped."""
        try:
            return subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=self.timeout_seconds,
                check=False,
                env=self.env if env is None else env,
            )
        except subprocess.TimeoutExpired as exc:
            # squeue retries an unreadable slurm.conf for 60 s: its first error is the cause.
            why = f"{shlex.join(argv)} timed out after {self.timeout_seconds:g} s"
            return _with_stderr(why, exc.stderr)
        except OSError as exc:
            return f"could not run {shlex.join(argv)}: {exc.strerror or exc}"


def parse_squeue_line(text: str) -> SqueueLine | None:
    """One line of ``squeue -o SQUEUE_FORMAT`` (start in Unix seconds), or None if malformed."""
    parts = text.strip().split(_SEPARATOR)
    if len(parts) != _FIELDS:
        return None
    printed_id, own_id, user, state, account, start, node_list = parts
    started_at = None
    if _NUMERIC.match(start) and int(start) > 0:
        started_at = datetime.fromtimestamp(int(start), tz=UTC)
    elif start not in _NO_VALUE and start != "0":
        return None  # a date in some local format: no start to compare with
    return SqueueLine(
        printed_id=printed_id,
        own_id=own_id,
        user=user,
        state=state.upper(),
        account=None if account in _NO_VALUE else account,
        started_at=started_at,
        node_list="" if node_list in _NO_VALUE else node_list,
    )


def differences(
    target: ReclaimTarget, facts: SchedulerFacts, *, tolerance_seconds: float
) -> list[str]:
    """Each way Slurm's ``facts`` disagree with GPU Warden's record ``target`` (empty: none)."""
    why = []
    if target.user is not None and target.user != facts.user:
        why.append(f"Slurm says user {facts.user!r}, GPU Warden's record {target.user!r}")
    slurm_nodes = {_short(n) for n in facts.nodes}
    elsewhere = sorted(n for n in target.nodes if _short(n) not in slurm_nodes)
    if elsewhere:
        why.append(
            f"Slurm runs it on {','.join(facts.nodes) or 'no node'}, not on {','.join(elsewhere)}"
        )
    late = _started_later(target.started_at, facts.started_at, tolerance_seconds)
    if late is not None:
        why.append(late)
    return why


def _started_later(
    recorded: datetime | None, slurm: datetime | None, tolerance_seconds: float
) -> str | None:
    """Why a job Slurm says started at ``slurm`` is not the one recorded from ``recorded``."""
    # Only later is another job: a wrapped or requeued id starts after the recorded run, while
    # a record may start after Slurm's start (a late registration, a job first seen running).
    if recorded is None or slurm is None:
        return None
    late_seconds = (slurm - recorded).total_seconds()
    if late_seconds <= tolerance_seconds:
        return None
    return (
        f"Slurm says it started at {slurm.isoformat()}, {late_seconds:.0f} s after GPU Warden's"
        f" record ({recorded.isoformat()}): another job of the same id"
    )


def _short(host: str) -> str:
    """A host name without its domain, lower case (an agent's FQDN matches Slurm's node name)."""
    return host.split(".")[0].lower()


def _exited(done: subprocess.CompletedProcess[str]) -> str:
    """Why a command failed: its command line, exit status and stderr."""
    line = shlex.join(str(a) for a in done.args)
    return _with_stderr(f"{line} exited {done.returncode}", done.stderr)


def _with_stderr(why: str, stderr: str | bytes | None) -> str:
    """``why`` and ``stderr`` on one line, trimmed to _STDERR_CHARS (or that it had none)."""
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr or ""
    lines = " | ".join(ln.strip() for ln in text.splitlines() if ln.strip())
    if not lines:
        return f"{why} (no stderr)"
    if len(lines) > _STDERR_CHARS:
        lines = lines[: _STDERR_CHARS - 1] + "…"
    return f"{why}: {lines}"


def _gone(stderr: str) -> bool:
    text = stderr.lower()
    return any(e in text for e in _GONE_ERRORS)
