"""Taking a step: a warning's notice now, or a reclaim through its driver (sent with the
round's others), its intent recorded first and its answer after."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from service.actions.base import ReclaimDriver, ReclaimResult, ReclaimTarget
from service.context import ServiceContext
from service.core.verdict import NO_VERDICT
from service.db import actions_repo, ladder_repo, outbox_repo
from service.thresholds.ladder import DriverName, driver_for, reclaim_mode, step_word
from service.thresholds.policy import condition_words
from service.usecases.evaluation import verdict_by_job
from service.usecases.ladder.turn import Turn, hold
from service.usecases.useful_work import USEFUL_WORK_METRICS, job_evidence_words
from service.vocabulary import STEP_DONE_OUTCOMES

log = logging.getLogger(__package__)


@dataclass(frozen=True)
class DriverCall:
    """A reclaim to send through its driver, and what recording its answer needs."""

    turn: Turn
    driver: ReclaimDriver
    name: str
    target: ReclaimTarget
    dry_run: bool
    resumed: bool


def take(turn: Turn) -> DriverCall | None:
    """Take the turn's step: a warning now, a reclaim returned to be sent."""
    ep, ctx, now = turn.ep, turn.ctx, turn.now
    verdict = verdict_by_job(ctx, {ep.job_id}, now).get(ep.job_id) or NO_VERDICT
    evidence = None
    if ep.policy.metric in USEFUL_WORK_METRICS:  # the evidence in words (issue 47)
        evidence = job_evidence_words(ctx, ep.job_id, now)
    turn = replace(turn, verdict=verdict, evidence=evidence)
    if ep.ladder.steps[turn.step].action == "notify_owner":
        _warn(turn)
        return None
    return _reclaim(turn)


def run_calls(ctx: ServiceContext, calls: list[DriverCall]) -> None:
    """Send the round's reclaims, up to GPUWARDEN_LADDER_PARALLEL_RECLAIMS at once (each may
    wait its driver's timeout), then record each answer."""
    if not calls:
        return
    workers = min(len(calls), ctx.settings.ladder_parallel_reclaims)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reclaim") as pool:
        answers = list(pool.map(lambda c: _call(c.driver, c.target, dry_run=c.dry_run), calls))
    for c, res in zip(calls, answers, strict=True):
        try:
            _reclaim_outcome(c.turn, res, driver=c.name, mode=c.target.mode, resumed=c.resumed)
        except Exception:  # recorded next round: the driver is idempotent
            log.exception("recording the reclaim of %s failed", c.target.job_id)


def _warn(turn: Turn) -> None:
    """Send the owner a notice (a dry run: the admins, saying it would), counted once."""
    outcome = "would" if turn.ep.ladder.dry_run else "warned"
    rows, owner = turn.notice_rows(outcome=outcome), turn.owner_part(outcome=outcome)
    with turn.ctx.engine.begin() as conn:
        if not rows and owner is None:
            # Never reclaim a job whose owner could not be warned: the ladder waits here.
            turn.record(
                conn,
                outcome="failed",
                reason="no Slack or webhook channel on the policy, and no owner address, to"
                " send the notice to",
            )
            return
        if not turn.finish(conn):
            return  # another round took this step
        outbox_repo.enqueue(conn, rows, now=turn.now)
        to = [r["channel"] for r in rows]
        deliveries = [str(r["delivery_id"]) for r in rows]
        if owner is not None:
            deliveries += owner.queue(conn, turn.ctx)
            to.append(owner.words)
        # The deliveries are kept: a reclaim needs one of them sent, not merely queued.
        turn.record(
            conn, outcome=outcome, detail=f"notice to {', '.join(to)}", delivery_ids=deliveries
        )
    turn.result.notices += len(deliveries)


def _target(turn: Turn, driver: DriverName) -> ReclaimTarget:
    """The job as the driver needs it, with the numbers behind the reclaim."""
    ep, prog = turn.ep, turn.prog
    return ReclaimTarget(
        job_id=ep.job_id,
        mode=reclaim_mode(ep.ladder, driver),
        user=turn.facts.user,
        team=turn.facts.team,
        nodes=turn.facts.nodes,
        labels=dict(turn.facts.labels),
        policy=ep.policy.name,
        reason=f"{condition_words(ep.policy)} since {prog.episode_start.isoformat()}",
        # How long the condition has held (seconds), beside the verdict's dollars.
        figures={"condition_seconds": (turn.now - prog.episode_start).total_seconds()},
        verdict=turn.verdict,
        started_at=turn.facts.started_at,
        # One step of one episode of this job's ladder: the same on every retry and restart.
        idempotency_key=f"ladder-{prog.id}-{int(prog.episode_start.timestamp())}-step-{turn.step}",
    )


def _reclaim(turn: Turn) -> DriverCall | None:
    """Free the job's GPUs through its driver: a live reclaim needs a delivered warning, then
    records its intent; the driver call is returned, to be sent with the round's others."""
    ep = turn.ep
    name = driver_for(ep.ladder, ep.job_id)
    target = _target(turn, name)
    driver = turn.rnd.drivers.get(name)
    resumed = turn.prog.pending_step is not None
    if driver is None:
        word = step_word(ep.ladder, ep.ladder.steps[turn.step], ep.job_id)
        res = (
            ReclaimResult("would", f"would {word} (no {name} driver is configured yet)")
            if ep.ladder.dry_run
            else ReclaimResult("failed", f"no {name} driver is configured on this service")
        )
        _reclaim_outcome(turn, res, driver=name, mode=target.mode, resumed=resumed)
        return None
    if not ep.ladder.dry_run and not resumed:
        unwarned = _unwarned(turn)
        if unwarned is not None:
            hold(turn, reason=unwarned)
            return None
        with turn.ctx.engine.begin() as conn:
            if not ladder_repo.mark_pending(
                conn, progress_id=turn.prog.id, step=turn.step, now=turn.now
            ):
                return None
    return DriverCall(turn, driver, name, target, dry_run=ep.ladder.dry_run, resumed=resumed)


def _unwarned(turn: Turn) -> str | None:
    """Why the owner does not count as warned in this episode (no warning's notice was sent,
    only queued or failed), or None when one was delivered."""
    ep = turn.ep
    with turn.ctx.engine.connect() as conn:
        ids = actions_repo.warning_deliveries(conn, **ep.key, since=turn.prog.episode_start)
        found = outbox_repo.statuses(conn, delivery_ids=ids)
    counts = {s: sum(1 for v in found.values() if v == s) for s in ("sent", "pending", "failed")}
    if counts["sent"]:
        return None
    return (
        "no warning of this episode has reached the owner: a reclaim needs one sent"
        f" ({counts['pending']} still queued, {counts['failed']} failed)"
    )


def _call(driver: ReclaimDriver, target: ReclaimTarget, *, dry_run: bool) -> ReclaimResult:
    """The driver's answer; one that raises (against its contract) counts as failed."""
    try:
        return driver.reclaim(target, dry_run=dry_run)
    except Exception as exc:
        log.exception("the %s driver raised on %s", driver.name, target.job_id)
        return ReclaimResult("failed", f"the {driver.name} driver raised {type(exc).__name__}")


def _reclaim_outcome(
    turn: Turn, res: ReclaimResult, *, driver: str, mode: str, resumed: bool
) -> None:
    """Record what the driver did; a reclaim (or a dry run's would) also sends a notice."""
    outcome = res.outcome if res.outcome != "would" or turn.ep.ladder.dry_run else "failed"
    detail = res.detail
    if resumed and outcome == "gone":
        detail += " (an earlier attempt was interrupted: it most likely freed the job)"
    done = outcome in STEP_DONE_OUTCOMES  # a reclaim comes to reclaimed or would
    rows = turn.notice_rows(outcome=outcome) if done else []
    owner = turn.owner_part(outcome=outcome) if done else None
    with turn.ctx.engine.begin() as conn:
        if done and not turn.finish(conn):
            return
        if done:
            outbox_repo.enqueue(conn, rows, now=turn.now)
            turn.result.notices += len(rows) + (len(owner.queue(conn, turn.ctx)) if owner else 0)
        elif outcome == "gone":
            ladder_repo.stop_ladder(conn, progress_id=turn.prog.id, state="gone", now=turn.now)
        turn.record(
            conn,
            outcome=outcome,
            driver=driver,
            mode=mode,
            detail=detail,
            reason=detail if outcome == "failed" else None,
        )
