"""The acting round: walk each firing alert's job up its policy's ladder, one step at a time,
and the runtime that runs it while this replica is the evaluator's leader."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from service.actions.base import ReclaimDriver
from service.actions.registry import drivers_from
from service.context import ServiceContext
from service.db import actions_repo, alert_state_repo, jobs_repo, ladder_repo, policies_repo
from service.db.rows import NewAction
from service.settings import Settings
from service.thresholds.evaluator import AlertState
from service.thresholds.ladder import LadderProgress, LadderSpec, due_step, exemption
from service.thresholds.policy import PolicySpec
from service.usecases.evaluation import Alerting
from service.usecases.ladder.checks import (
    backing_off,
    busy_again,
    checked,
    evidence,
    job_facts,
    ladder_changed,
)
from service.usecases.ladder.steps import DriverCall, run_calls, take
from service.usecases.ladder.turn import (
    Episode,
    LadderRoundResult,
    Round,
    Turn,
    action_at,
    hold,
    stop,
)

log = logging.getLogger(__package__)


def default_drivers(settings: Settings) -> dict[str, ReclaimDriver]:
    """The reclaim drivers this service can use, by name (service.actions.registry)."""
    return drivers_from(settings)


def ladder_once(ctx: ServiceContext, *, drivers: Mapping[str, ReclaimDriver]) -> LadderRoundResult:
    """Take every step that is due now; a job that fails is logged and left for the next round."""
    now = ctx.clock()
    result = LadderRoundResult()
    rnd = Round(ctx, drivers, now, result)
    with ctx.engine.connect() as conn:
        policies = [p for p in policies_repo.list_policies(conn) if p.ladder is not None]
        active = ladder_repo.active_progress(conn)
        open_alerts = alert_state_repo.open_alerts(conn) if policies or active else {}
    episodes = _episodes(policies, open_alerts)
    laddered = {p.name: p.ladder for p in policies if p.ladder is not None}
    open_ids = {st.id for states in open_alerts.values() for st in states.values()}
    result.episodes = len(episodes)
    for prog in active:
        if prog.alert_id not in open_ids:
            _episode_over(rnd, prog, laddered.get(prog.policy))
    calls: list[DriverCall] = []
    for ep in episodes:
        try:
            call = _advance(rnd, ep)
        except Exception:  # one job's failure must not stop the others' ladders
            log.exception(
                "the ladder of %s for job %s failed this round", ep.policy.name, ep.job_id
            )
            continue
        if call is not None:
            calls.append(call)
    run_calls(ctx, calls)
    return result


def _episodes(
    policies: list[PolicySpec], open_alerts: Mapping[str, Mapping[str, AlertState]]
) -> list[Episode]:
    """Firing alerts on a job, of policies with a ladder; a silenced or suppressed alert waits."""
    out = []
    for p in policies:
        assert p.ladder is not None
        for st in open_alerts.get(p.name, {}).values():
            job = st.labels.get("job_id")
            if st.state != "firing" or st.id is None or not job or st.silenced or st.suppressed:
                continue
            if "," in job:  # a GPU several jobs share: which one to reclaim is not clear
                continue
            out.append(Episode(p, p.ladder, st, st.id, job))
    return out


def _episode_over(rnd: Round, prog: LadderProgress, ladder: LadderSpec | None) -> None:
    """The alert resolved (or its policy went): the ladder resets, noted if it had begun; a
    job that ended (its end resolves its alerts) is noted gone."""
    now = rnd.now
    with rnd.ctx.engine.begin() as conn:
        job = jobs_repo.get_job(conn, job_id=prog.job_id)
        ended = job is None or job["ended_at"] is not None
        state = "gone" if ended else "reset"
        ladder_repo.stop_ladder(conn, progress_id=prog.id, state=state, now=now)
        if prog.steps_done or prog.pending_step is not None:
            outcome = "gone" if ended else "skipped"
            actions_repo.record_action(
                conn,
                NewAction(
                    at=now,
                    policy=prog.policy,
                    job_id=prog.job_id,
                    user=job["user"] if job else None,
                    team=job["team"] if job else None,
                    alert_id=prog.alert_id,
                    action=action_at(ladder, prog),
                    outcome=outcome,
                    dry_run=ladder.dry_run if ladder is not None else False,
                    since=prog.episode_start,
                    reason=(
                        "the job has ended"
                        if ended
                        else "the condition cleared (the alert resolved); the ladder starts over"
                    ),
                ),
            )
            rnd.result.count(outcome)


def _advance(rnd: Round, ep: Episode) -> DriverCall | None:
    """Re-check the job, then take its due step, if any (a reclaim is returned, to be sent
    with the round's others)."""
    with rnd.ctx.engine.begin() as conn:
        prog = ladder_repo.progress_for(
            conn,
            **ep.key,
            episode_start=ep.state.active_since,
            now=rnd.now,
            ladder_digest=ep.ladder.digest,
        )
        job = jobs_repo.get_job(conn, job_id=ep.job_id)
    # A ladder that finished under another ladder (a dry run's last step) starts over too.
    if prog.state in ("active", "done") and ladder_changed(rnd, ep, prog):
        return None
    if prog.state != "active":
        return None
    if job is None or job.get("ended_at") is not None:
        reason = "the job has ended" if job else "the job is not known"
        stop(rnd, ep, prog, state="gone", outcome="gone", reason=reason)
        return None
    facts = job_facts(job)
    ep = replace(ep, user=facts.user, team=facts.team)
    step = prog.pending_step
    if step is not None:
        # A reclaim cut short or failed: every check passed before its intent was recorded, and
        # the driver re-verifies the job with the scheduler before it acts again.
        if backing_off(rnd, ep, step):
            return None
        return take(Turn(rnd, ep, prog, facts, step))
    step = due_step(
        ep.ladder,
        episode_start=prog.episode_start,
        steps_done=prog.steps_done,
        now=rnd.now,
        job_started_at=facts.started_at,
    )
    if step is None or backing_off(rnd, ep, step):
        return None
    turn = Turn(rnd, ep, prog, facts, step)
    if busy_again(turn):
        return None
    confirmed = checked(turn)
    if confirmed is None:
        return None
    why = exemption(ep.ladder, confirmed)
    if why is not None:
        stop(rnd, ep, prog, state="exempt", outcome="skipped", reason=why)
        return None
    problem = evidence(turn, job)
    if problem is not None:
        hold(turn, reason=problem)
        return None
    return take(turn)


class Ladder:
    """The acting round's runtime: it acts only while this replica is the evaluator's leader,
    and sends the notices it queued through the evaluator's dispatcher."""

    def __init__(
        self, alerting: Alerting, drivers: Mapping[str, ReclaimDriver] | None = None
    ) -> None:
        self.alerting = alerting
        self._owns_drivers = drivers is None
        self.drivers = drivers if drivers is not None else default_drivers(alerting.ctx.settings)

    def close(self) -> None:
        """Close the drivers it built (their HTTP and API clients); a failing close is logged."""
        if not self._owns_drivers:
            return
        for name, driver in self.drivers.items():
            close = getattr(driver, "close", None)
            if close is None:
                continue
            try:
                close()
            except Exception:  # shutting down: one driver's close must not stop the others'
                log.exception("closing the %s driver failed", name)

    def tick(self) -> LadderRoundResult | None:
        """If this replica is the leader: take the due steps, then send their notices."""
        if not self.alerting.leader.check():
            return None
        result = ladder_once(self.alerting.ctx, drivers=self.drivers)
        if result.notices:
            self.alerting.dispatcher.drain()
        return result
