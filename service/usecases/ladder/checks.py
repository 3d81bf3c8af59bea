"""What the ladder checks before it acts, exactly as it must: "never act on what you cannot
verify". A changed ladder starts over, a step that failed lately waits, GPUs busy again (for a
sham or hung policy: no longer sham or hung) restart the ladder, the scheduler must confirm the
job, and the samples must support the step."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, assert_never, cast

from sqlalchemy import Connection

from service.actions.base import JobProbe, ProbeResult, ReclaimTarget
from service.db import actions_repo, evidence_repo, ladder_repo, sample_facts_repo
from service.thresholds.evidence import EvidenceRules, evidence_problem
from service.thresholds.ladder import JobFacts, LadderProgress, driver_for, reclaim_mode
from service.usecases.ladder.turn import Episode, Round, Turn, hold, record, stop
from service.usecases.useful_work import USEFUL_WORK_METRICS, job_evidence_words

log = logging.getLogger(__package__)


def job_facts(job: Mapping[str, Any]) -> JobFacts:
    """The job as the ladder's checks and drivers need it, from its stored record."""
    # The nodes that registered the job (where its GPUs report now may differ: a moved GPU).
    open_ivs = [i for i in job.get("intervals", []) if i["ended_at"] is None]
    nodes = tuple(sorted({i["registered_node"] for i in open_ivs if i["registered_node"]}))
    labels = {str(k): str(v) for k, v in (job.get("labels") or {}).items()}
    return JobFacts(
        job_id=job["id"],
        user=job.get("user"),
        team=job.get("team"),
        started_at=job.get("started_at"),
        ended_at=job.get("ended_at"),
        labels=labels,
        nodes=nodes,
    )


def ladder_changed(rnd: Round, ep: Episode, prog: LadderProgress) -> bool:
    """If the job's progress was started under another ladder (dry_run or steps changed), start
    it over from now, so a ladder switched live warns for real before it reclaims."""
    digest, now = ep.ladder.digest, rnd.now
    if prog.ladder_digest == digest:
        return False
    acted = prog.steps_done > 0 or prog.pending_step is not None or prog.state == "done"
    with rnd.ctx.engine.begin() as conn:
        ladder_repo.restart_ladder(
            conn,
            progress_id=prog.id,
            episode_start=now if acted else prog.episode_start,
            now=now,
            ladder_digest=digest,
        )
        if acted:
            record(
                conn,
                ep,
                prog,
                now,
                step=None,
                outcome="skipped",
                dry_run=ep.ladder.dry_run,
                reason="the ladder changed (its dry_run or steps): its steps start over from"
                " now, so no step taken under the old ladder counts",
            )
            rnd.result.count("skipped")
    return acted


def checked(turn: Turn) -> JobFacts | None:
    """The job as its scheduler confirms it (its team: the scheduler's account), or None when
    the step may not go on: the job is gone or listed otherwise (the ladder ends), or the
    scheduler could not be asked (the step is held)."""
    ep, facts = turn.ep, turn.facts
    probed = _probe(turn)
    if probed is None:
        # A driver that cannot re-read (the action webhook): its receiver gets user and nodes
        # to check; the team stays the registered one.
        return facts
    name, found = probed
    said = f"the {name} driver asked the scheduler: {found.detail}"
    match found.outcome:
        case "gone":
            stop(turn.rnd, ep, turn.prog, state="gone", outcome="gone", reason=said, driver=name)
        case "mismatch":
            log.warning(
                "the ladder of %s refuses to act on %s: %s", ep.policy.name, ep.job_id, said
            )
            stop(turn.rnd, ep, turn.prog, state="refused", outcome="skipped", reason=said)
        case "unknown":
            hold(turn, reason=said)
        case "present" if found.facts is None:  # present, but it says nothing to check against
            hold(turn, reason=said)
        case "present":
            # Exemptions by team trust the scheduler's accounting, never the job comment's team.
            return replace(facts, team=found.facts.account)
        case _:
            assert_never(found.outcome)
    return None


def evidence(turn: Turn, job: Mapping[str, Any]) -> str | None:
    """Why the samples do not support a step now (stale, not covering, moved, a clock off)."""
    s, prog, now = turn.ctx.settings, turn.prog, turn.now
    rules = EvidenceRules(
        min_coverage=s.ladder_min_coverage,
        max_sample_age_seconds=s.ladder_max_sample_age_seconds,
        max_clock_offset_seconds=s.ladder_max_clock_offset_seconds,
    )
    with turn.ctx.engine.connect() as conn:
        gpus, clocks = evidence_repo.job_evidence(conn, job=job, since=prog.episode_start, now=now)
    return evidence_problem(
        since=prog.episode_start,
        now=now,
        stale=turn.ep.state.stale,
        gpus=gpus,
        clocks=clocks,
        rules=rules,
    )


def backing_off(rnd: Round, ep: Episode, step: int) -> bool:
    """Whether ``step`` failed too recently to be tried again."""
    with rnd.ctx.engine.connect() as conn:
        failed = actions_repo.last_failure_at(conn, **ep.key, step=step)
    return failed is not None and rnd.now - failed < timedelta(
        seconds=rnd.ctx.settings.action_retry_seconds
    )


def busy_again(turn: Turn) -> bool:
    """If something ran on the job's GPUs since the condition began (by the samples' own times,
    so a late batch that arrived after a step counts too), skip the step and start the ladder
    over from then. A sham or hung policy's GPUs run kernels all along: for it, busy means the
    job's last hold time is no longer judged sham or hung (useful, or unverified)."""
    ep, prog, now = turn.ep, turn.prog, turn.now
    if ep.policy.metric in USEFUL_WORK_METRICS:
        return _useful_again(turn)
    after = prog.episode_start
    with turn.ctx.engine.begin() as conn:
        busy_at = sample_facts_repo.last_busy_at(conn, job_id=ep.job_id, after=after, until=now)
        if busy_at is None:
            return False
        _start_over(
            turn, conn, busy_at,
            f"the job's GPUs were busy again at {busy_at.isoformat()}; "
            "the ladder starts over from then",
        )  # fmt: skip
    return True


def _useful_again(turn: Turn) -> bool:
    """If the job's GPUs are not sham or hung over the last hold time now (the per-sample
    causes of the newest samples, not judged yet, cannot tell), skip the step and start the
    ladder over from now: a sham or hung step is taken only on its evidence."""
    ep, now = turn.ep, turn.now
    if job_evidence_words(turn.ctx, ep.job_id, now) is not None:
        return False
    with turn.ctx.engine.begin() as conn:
        _start_over(
            turn, conn, now,
            "the job's GPUs are not sham or hung over the last hold time (useful work,"
            " or the evidence is partial: unverified); the ladder starts over from now",
        )  # fmt: skip
    return True


def _start_over(turn: Turn, conn: Connection, episode_start: datetime, reason: str) -> None:
    """Restart the ladder's episode at ``episode_start`` and record the step as skipped."""
    ep, prog, now = turn.ep, turn.prog, turn.now
    ladder_repo.restart_ladder(conn, progress_id=prog.id, episode_start=episode_start, now=now)
    record(conn, ep, prog, now, step=turn.step, outcome="skipped", dry_run=ep.ladder.dry_run,
           reason=reason)  # fmt: skip
    turn.result.count("skipped")


def _probe(turn: Turn) -> tuple[str, ProbeResult] | None:
    """The job's driver's re-read of it (driver name, what it found), or None when that
    driver cannot re-read a job."""
    ep, facts = turn.ep, turn.facts
    name = driver_for(ep.ladder, ep.job_id)
    driver = turn.rnd.drivers.get(name)
    # Slurm and Kubernetes re-read the job; the action webhook cannot (its receiver checks).
    if driver is None or not callable(getattr(driver, "probe", None)):
        return None
    prober = cast(JobProbe, driver)
    target = ReclaimTarget(
        job_id=ep.job_id,
        mode=reclaim_mode(ep.ladder, name),
        user=facts.user,
        team=facts.team,
        nodes=facts.nodes,
        labels=dict(facts.labels),
        policy=ep.policy.name,
        started_at=facts.started_at,
    )
    try:
        return name, prober.probe(target)
    except Exception:  # against its contract: read as unknown, so the step is held
        log.exception("the %s driver's probe raised on %s", name, ep.job_id)
        return name, ProbeResult("unknown", "the probe raised")
