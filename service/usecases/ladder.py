"""The acting round: walk each firing alert's job up its policy's ladder, one step at a time.

Run by the evaluator's leader only, after each evaluation round. Crash-safe: a warning's notice,
its audit row and the step's count are one transaction; a reclaim records its intent first,
then asks the (idempotent) driver, then records the outcome, so a restart in between retries
the same reclaim and never takes a step twice or skips one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, assert_never, cast

from service.actions.base import JobProbe, ProbeResult, ReclaimDriver, ReclaimResult, ReclaimTarget
from service.actions.registry import drivers_from
from service.context import ServiceContext
from service.db import (
    actions_repo,
    alert_state_repo,
    evidence_repo,
    jobs_repo,
    ladder_repo,
    outbox_repo,
    policies_repo,
    windows_repo,
)
from service.notify import Notification
from service.settings import Settings
from service.thresholds.evaluator import AlertState
from service.thresholds.evidence import EvidenceRules, evidence_problem
from service.thresholds.ladder import (
    DriverName,
    JobFacts,
    LadderProgress,
    LadderSpec,
    driver_for,
    due_step,
    exemption,
    next_step_at,
    reclaim_mode,
    step_word,
)
from service.thresholds.policy import PolicySpec, condition_words
from service.usecases.evaluation import Alerting, notification, verdict_by_job
from service.usecases.notices import OwnerPart, ladder_owner_part
from service.usecases.outbox import outbox_row
from service.usecases.useful_work import USEFUL_WORK_METRICS, job_evidence_words
from service.vocabulary import STEP_DONE_OUTCOMES

log = logging.getLogger(__name__)

# Channel types a notice goes to (Alertmanager holds alerts, not notices).
NOTICE_CHANNEL_TYPES = ("slack", "webhook")


def default_drivers(settings: Settings) -> dict[str, ReclaimDriver]:
    """The reclaim drivers this service can use, by name (service.actions.registry)."""
    return drivers_from(settings)


@dataclass(frozen=True)
class Episode:
    """A firing alert of a policy with a ladder, on a job: what the ladder acts on."""

    policy: PolicySpec
    ladder: LadderSpec
    state: AlertState
    alert_id: int
    job_id: str
    user: str | None = None
    team: str | None = None


@dataclass
class LadderRoundResult:
    """What one acting round did: audit rows written, by outcome."""

    episodes: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    notices: int = 0

    def count(self, outcome: str) -> None:
        """Count one audit row of ``outcome``."""
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


def ladder_once(ctx: ServiceContext, *, drivers: Mapping[str, ReclaimDriver]) -> LadderRoundResult:
    """Take every step that is due now; a job that fails is logged and left for the next round."""
    now = ctx.clock()
    result = LadderRoundResult()
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
            _episode_over(ctx, prog, laddered.get(prog.policy), now, result)
    calls: list[_DriverCall] = []
    for ep in episodes:
        try:
            call = _advance(ctx, ep, drivers, now, result)
        except Exception:  # one job's failure must not stop the others' ladders
            log.exception(
                "the ladder of %s for job %s failed this round", ep.policy.name, ep.job_id
            )
            continue
        if call is not None:
            calls.append(call)
    _run_calls(ctx, calls)
    return result


@dataclass(frozen=True)
class _DriverCall:
    """A reclaim to send through its driver, and what recording its answer needs."""

    turn: _Turn
    driver: ReclaimDriver
    name: str
    target: ReclaimTarget
    dry_run: bool
    resumed: bool


def _run_calls(ctx: ServiceContext, calls: list[_DriverCall]) -> None:
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


def _episode_over(
    ctx: ServiceContext,
    prog: LadderProgress,
    ladder: LadderSpec | None,
    now: datetime,
    result: LadderRoundResult,
) -> None:
    """The alert resolved (or its policy went): the ladder resets, noted if it had begun; a
    job that ended (its end resolves its alerts) is noted gone."""
    with ctx.engine.begin() as conn:
        job = jobs_repo.get_job(conn, job_id=prog.job_id) or {}
        ended = not job or job.get("ended_at") is not None
        state = "gone" if ended else "reset"
        ladder_repo.stop_ladder(conn, progress_id=prog.id, state=state, now=now)
        if prog.steps_done or prog.pending_step is not None:
            outcome = "gone" if ended else "skipped"
            actions_repo.record_action(
                conn,
                at=now,
                policy=prog.policy,
                job_id=prog.job_id,
                user=job.get("user"),
                team=job.get("team"),
                alert_id=prog.alert_id,
                action=_action_at(ladder, prog),
                outcome=outcome,
                dry_run=ladder.dry_run if ladder is not None else False,
                since=prog.episode_start,
                reason=(
                    "the job has ended"
                    if ended
                    else "the condition cleared (the alert resolved); the ladder starts over"
                ),
            )
            result.count(outcome)


def _action_at(ladder: LadderSpec | None, prog: LadderProgress) -> str:
    """The action of the step the ladder stands at (notify_owner, or reclaim once a reclaim is
    pending or every warning is done); a ladder since removed: by the pending intent."""
    if ladder is None:
        return "reclaim" if prog.pending_step is not None else "notify_owner"
    return ladder.steps[min(prog.steps_done, len(ladder.steps) - 1)].action


def _facts(job: Mapping[str, Any]) -> JobFacts:
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


def _advance(
    ctx: ServiceContext,
    ep: Episode,
    drivers: Mapping[str, ReclaimDriver],
    now: datetime,
    result: LadderRoundResult,
) -> _DriverCall | None:
    """Re-check the job, then take its due step, if any (a reclaim is returned, to be sent
    with the round's others)."""
    with ctx.engine.begin() as conn:
        prog = ladder_repo.progress_for(
            conn,
            policy=ep.policy.name,
            job_id=ep.job_id,
            alert_id=ep.alert_id,
            episode_start=ep.state.active_since,
            now=now,
            ladder_digest=ep.ladder.digest,
        )
        job = jobs_repo.get_job(conn, job_id=ep.job_id)
    # A ladder that finished under another ladder (a dry run's last step) starts over too.
    if prog.state in ("active", "done") and _ladder_changed(ctx, ep, prog, now, result):
        return None
    if prog.state != "active":
        return None
    if job is None or job.get("ended_at") is not None:
        reason = "the job has ended" if job else "the job is not known"
        _stop(ctx, ep, prog, now, result, state="gone", outcome="gone", reason=reason)
        return None
    facts = _facts(job)
    ep = replace(ep, user=facts.user, team=facts.team)
    step = prog.pending_step
    if step is not None:
        # A reclaim cut short or failed: every check passed before its intent was recorded, and
        # the driver re-verifies the job with the scheduler before it acts again.
        if _backing_off(ctx, ep, step, now):
            return None
        return _take(ctx, ep, prog, facts, step, drivers, now, result)
    step = due_step(
        ep.ladder,
        episode_start=prog.episode_start,
        steps_done=prog.steps_done,
        now=now,
        job_started_at=facts.started_at,
    )
    if step is None or _backing_off(ctx, ep, step, now):
        return None
    if _busy_again(ctx, ep, prog, step, now, result):
        return None
    checked = _checked(ctx, ep, prog, facts, step, drivers, now, result)
    if checked is None:
        return None
    why = exemption(ep.ladder, checked)
    if why is not None:
        _stop(ctx, ep, prog, now, result, state="exempt", outcome="skipped", reason=why)
        return None
    problem = _evidence(ctx, ep, prog, job, now)
    if problem is not None:
        _hold(ctx, ep, prog, step, now, result, reason=problem)
        return None
    return _take(ctx, ep, prog, facts, step, drivers, now, result)


def _take(
    ctx: ServiceContext,
    ep: Episode,
    prog: LadderProgress,
    facts: JobFacts,
    step: int,
    drivers: Mapping[str, ReclaimDriver],
    now: datetime,
    result: LadderRoundResult,
) -> _DriverCall | None:
    """Take ``step``: a warning now, a reclaim returned to be sent."""
    verdict = verdict_by_job(ctx, {ep.job_id}, now).get(ep.job_id) or {}
    if ep.policy.metric in USEFUL_WORK_METRICS:  # the evidence in words (issue 47)
        verdict = {**verdict, "evidence": job_evidence_words(ctx, ep.job_id, now)}
    turn = _Turn(ctx, ep, prog, facts, step, verdict, now, result)
    if ep.ladder.steps[step].action == "notify_owner":
        _warn(turn)
        return None
    return _reclaim(turn, drivers)


def _ladder_changed(
    ctx: ServiceContext, ep: Episode, prog: LadderProgress, now: datetime, result: LadderRoundResult
) -> bool:
    """If the job's progress was started under another ladder (dry_run or steps changed), start
    it over from now, so a ladder switched live warns for real before it reclaims."""
    digest = ep.ladder.digest
    if prog.ladder_digest == digest:
        return False
    acted = prog.steps_done > 0 or prog.pending_step is not None or prog.state == "done"
    with ctx.engine.begin() as conn:
        ladder_repo.restart_ladder(
            conn,
            progress_id=prog.id,
            episode_start=now if acted else prog.episode_start,
            now=now,
            ladder_digest=digest,
        )
        if acted:
            _record(
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
            result.count("skipped")
    return acted


def _checked(
    ctx: ServiceContext,
    ep: Episode,
    prog: LadderProgress,
    facts: JobFacts,
    step: int,
    drivers: Mapping[str, ReclaimDriver],
    now: datetime,
    result: LadderRoundResult,
) -> JobFacts | None:
    """The job as its scheduler confirms it (its team: the scheduler's account), or None when
    the step may not go on: the job is gone or listed otherwise (the ladder ends), or the
    scheduler could not be asked (the step is held)."""
    probed = _probe(ep, facts, drivers)
    if probed is None:
        # A driver that cannot re-read (the action webhook): its receiver gets user and nodes
        # to check; the team stays the registered one.
        return facts
    name, found = probed
    said = f"the {name} driver asked the scheduler: {found.detail}"
    match found.outcome:
        case "gone":
            _stop(
                ctx, ep, prog, now, result, state="gone", outcome="gone", reason=said, driver=name
            )
        case "mismatch":
            log.warning(
                "the ladder of %s refuses to act on %s: %s", ep.policy.name, ep.job_id, said
            )
            _stop(ctx, ep, prog, now, result, state="refused", outcome="skipped", reason=said)
        case "unknown":
            _hold(ctx, ep, prog, step, now, result, reason=said)
        case "present" if found.facts is None:  # present, but it says nothing to check against
            _hold(ctx, ep, prog, step, now, result, reason=said)
        case "present":
            # Exemptions by team trust the scheduler's accounting, never the job comment's team.
            return replace(facts, team=found.facts.account)
        case _:
            assert_never(found.outcome)
    return None


def _evidence(
    ctx: ServiceContext, ep: Episode, prog: LadderProgress, job: Mapping[str, Any], now: datetime
) -> str | None:
    """Why the samples do not support a step now (stale, not covering, moved, a clock off)."""
    s = ctx.settings
    rules = EvidenceRules(
        min_coverage=s.ladder_min_coverage,
        max_sample_age_seconds=s.ladder_max_sample_age_seconds,
        max_clock_offset_seconds=s.ladder_max_clock_offset_seconds,
    )
    with ctx.engine.connect() as conn:
        gpus, clocks = evidence_repo.job_evidence(conn, job=job, since=prog.episode_start, now=now)
    return evidence_problem(
        since=prog.episode_start,
        now=now,
        stale=ep.state.stale,
        gpus=gpus,
        clocks=clocks,
        rules=rules,
    )


def _hold(
    ctx: ServiceContext,
    ep: Episode,
    prog: LadderProgress,
    step: int,
    now: datetime,
    result: LadderRoundResult,
    *,
    reason: str,
) -> None:
    """Leave ``step`` untaken this round, recorded (once while the reason stays the same)."""
    log.info("the ladder of %s holds step %d on %s: %s", ep.policy.name, step, ep.job_id, reason)
    with ctx.engine.begin() as conn:
        last = actions_repo.latest_action(
            conn, policy=ep.policy.name, job_id=ep.job_id, alert_id=ep.alert_id
        )
        if last and (last["outcome"], last["step"], last["reason"]) == ("held", step, reason):
            return
        _record(
            conn, ep, prog, now, step=step, outcome="held", dry_run=ep.ladder.dry_run, reason=reason
        )
    result.count("held")


def _backing_off(ctx: ServiceContext, ep: Episode, step: int, now: datetime) -> bool:
    """Whether ``step`` failed too recently to be tried again."""
    with ctx.engine.connect() as conn:
        failed = actions_repo.last_failure_at(
            conn, policy=ep.policy.name, job_id=ep.job_id, alert_id=ep.alert_id, step=step
        )
    return failed is not None and now - failed < timedelta(
        seconds=ctx.settings.action_retry_seconds
    )


def _busy_again(
    ctx: ServiceContext,
    ep: Episode,
    prog: LadderProgress,
    step: int,
    now: datetime,
    result: LadderRoundResult,
) -> bool:
    """If something ran on the job's GPUs since the condition began (by the samples' own times,
    so a late batch that arrived after a step counts too), skip the step and start the ladder
    over from then."""
    after = prog.episode_start
    with ctx.engine.begin() as conn:
        busy_at = windows_repo.last_busy_at(conn, job_id=ep.job_id, after=after, until=now)
        if busy_at is None:
            return False
        ladder_repo.restart_ladder(conn, progress_id=prog.id, episode_start=busy_at, now=now)
        _record(
            conn,
            ep,
            prog,
            now,
            step=step,
            outcome="skipped",
            dry_run=ep.ladder.dry_run,
            reason=f"the job's GPUs were busy again at {busy_at.isoformat()}; "
            "the ladder starts over from then",
        )
    result.count("skipped")
    return True


def _probe(
    ep: Episode, facts: JobFacts, drivers: Mapping[str, ReclaimDriver]
) -> tuple[str, ProbeResult] | None:
    """The job's driver's re-read of it (driver name, what it found), or None when that
    driver cannot re-read a job."""
    name = driver_for(ep.ladder, ep.job_id)
    driver = drivers.get(name)
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


def _stop(
    ctx: ServiceContext,
    ep: Episode,
    prog: LadderProgress,
    now: datetime,
    result: LadderRoundResult,
    *,
    state: str,
    outcome: str,
    reason: str,
    detail: str | None = None,
    driver: str | None = None,
) -> None:
    """End this job's ladder for the episode, recorded once."""
    with ctx.engine.begin() as conn:
        ladder_repo.stop_ladder(conn, progress_id=prog.id, state=state, now=now)
        _record(
            conn,
            ep,
            prog,
            now,
            step=prog.pending_step,
            outcome=outcome,
            reason=reason,
            dry_run=ep.ladder.dry_run,
            detail=detail,
            driver=driver,
        )
    result.count(outcome)


def _record(
    conn: Any,
    ep: Episode,
    prog: LadderProgress,
    now: datetime,
    *,
    step: int | None,
    outcome: str,
    dry_run: bool,
    verdict: Mapping[str, Any] | None = None,
    **extra: Any,
) -> None:
    """One audit row with the numbers behind it (value, threshold, since, dollars)."""
    # A skip or an end outside a step is filed under the step the ladder stood at.
    action = ep.ladder.steps[step].action if step is not None else _action_at(ep.ladder, prog)
    actions_repo.record_action(
        conn,
        at=now,
        policy=ep.policy.name,
        job_id=ep.job_id,
        alert_id=ep.alert_id,
        user=ep.user,
        team=ep.team,
        step=step,
        action=action,
        outcome=outcome,
        dry_run=dry_run,
        value=ep.state.value,
        threshold=ep.policy.threshold,
        since=prog.episode_start,
        waste_usd=(verdict or {}).get("waste_usd"),
        idle_usd=(verdict or {}).get("idle_usd"),
        **extra,
    )


def owner_notice(
    ep: Episode,
    prog: LadderProgress,
    step: int,
    facts: JobFacts,
    verdict: Mapping[str, Any],
    *,
    outcome: str,
) -> tuple[str, str | None, datetime | None]:
    """The notice of a step, for the job's owner (and, for a dry run, the admins): what was
    seen, its cause, the dollars so far, what happens next and when. Returns (text, next
    step in words, when)."""
    lad = ep.ladder
    since = prog.episode_start.strftime("%Y-%m-%d %H:%M UTC")
    who = f" ({facts.user})" if facts.user else ""
    text = f"Job {ep.job_id}{who} has been {condition_words(ep.policy)} since {since}"
    if ep.state.value is not None:
        text += f" ({ep.policy.aggregate} {ep.policy.metric} over {ep.policy.window} = "
        text += f"{ep.state.value:.4g}, {ep.policy.op} {ep.policy.threshold:g})"
    text += "."
    if verdict.get("top_cause"):
        text += f" Top cause: {verdict['top_cause']}."
    if verdict.get("evidence"):
        text += f" Evidence: {verdict['evidence']}."
    if verdict.get("waste_usd") is not None:
        text += f" Waste so far ${verdict['waste_usd']:,.2f}"
        if verdict.get("idle_usd") is not None:
            text += f" (idle ${verdict['idle_usd']:,.2f})"
        text += "."
    word = step_word(lad, lad.steps[step], ep.job_id)
    if outcome == "would":
        text = f"[dry run] Would {word} now. " + text
    elif outcome == "reclaimed":
        text = f"Reclaimed ({word}). " + text
    nxt = next_step_at(
        lad, episode_start=prog.episode_start, steps_done=step + 1, job_started_at=facts.started_at
    )
    if nxt is None:
        return text, None, None
    next_word = step_word(lad, nxt[0], ep.job_id)
    verb = f"would {next_word}" if lad.dry_run else next_word
    text += f" Next: {verb} at {nxt[1].strftime('%H:%M:%S UTC')}"
    text += " unless the job's GPUs are busy again or it ends."
    return text, next_word, nxt[1]


@dataclass
class _Turn:
    """One job's due step in one round: what every part of taking it needs."""

    ctx: ServiceContext
    ep: Episode
    prog: LadderProgress
    facts: JobFacts
    step: int
    verdict: Mapping[str, Any]
    now: datetime
    result: LadderRoundResult

    @property
    def last(self) -> bool:
        """Whether this is the ladder's last step."""
        return self.step == len(self.ep.ladder.steps) - 1

    def record(self, conn: Any, *, outcome: str, **extra: Any) -> None:
        """This step's audit row, counted in the round's result."""
        _record(
            conn,
            self.ep,
            self.prog,
            self.now,
            step=self.step,
            outcome=outcome,
            dry_run=self.ep.ladder.dry_run,
            verdict=self.verdict,
            **extra,
        )
        self.result.count(outcome)

    def finish(self, conn: Any) -> bool:
        """Count the step done (False if another round already did)."""
        return ladder_repo.finish_step(
            conn, progress_id=self.prog.id, step=self.step, now=self.now, last=self.last
        )

    def owner_part(self, *, outcome: str) -> OwnerPart | None:
        """The step's notice to the job's owner when the policy addresses ``owner``."""
        return ladder_owner_part(
            self.ctx,
            policy=self.ep.policy,
            job_id=self.ep.job_id,
            facts=self.facts,
            step=self.step,
            progress_id=self.prog.id,
            outcome=outcome,
            payload=self.notice(outcome=outcome).model_dump(mode="json"),
        )

    def notice(self, *, outcome: str) -> Notification:
        """The notification of the step's notice (its delivery id set as it is queued)."""
        ep = self.ep
        text, next_word, next_at = owner_notice(
            ep, self.prog, self.step, self.facts, self.verdict, outcome=outcome
        )
        note = notification(
            self.ctx,
            ep.policy,
            ep.state,
            "notice",
            ep.alert_id,
            self.now,
            dict(self.verdict) or None,
        )
        return note.model_copy(
            update={"notice": text, "next_step": next_word, "next_step_at": next_at}
        )

    def notice_rows(self, *, outcome: str) -> list[dict[str, Any]]:
        """Outbox rows of the step's notice, one per Slack or webhook channel of the policy."""
        ep, note = self.ep, self.notice(outcome=outcome)
        with self.ctx.engine.connect() as conn:
            types = {c.name: c.type for c in policies_repo.list_channels(conn)}
        return [
            outbox_row(note, channel=channel, alert_id=ep.alert_id)
            for channel in ep.policy.channels
            if types.get(channel) in NOTICE_CHANNEL_TYPES
        ]


def _warn(turn: _Turn) -> None:
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


def _target(turn: _Turn, driver: DriverName) -> ReclaimTarget:
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
        figures=_figures(turn.verdict, prog, turn.now),
        started_at=turn.facts.started_at,
        # One step of one episode of this job's ladder: the same on every retry and restart.
        idempotency_key=f"ladder-{prog.id}-{int(prog.episode_start.timestamp())}-step-{turn.step}",
    )


def _reclaim(turn: _Turn, drivers: Mapping[str, ReclaimDriver]) -> _DriverCall | None:
    """Free the job's GPUs through its driver: a live reclaim needs a delivered warning, then
    records its intent; the driver call is returned, to be sent with the round's others."""
    ep = turn.ep
    name = driver_for(ep.ladder, ep.job_id)
    target = _target(turn, name)
    driver = drivers.get(name)
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
            _hold(turn.ctx, ep, turn.prog, turn.step, turn.now, turn.result, reason=unwarned)
            return None
        with turn.ctx.engine.begin() as conn:
            if not ladder_repo.mark_pending(
                conn, progress_id=turn.prog.id, step=turn.step, now=turn.now
            ):
                return None
    return _DriverCall(turn, driver, name, target, dry_run=ep.ladder.dry_run, resumed=resumed)


def _unwarned(turn: _Turn) -> str | None:
    """Why the owner does not count as warned in this episode (no warning's notice was sent,
    only queued or failed), or None when one was delivered."""
    ep = turn.ep
    with turn.ctx.engine.connect() as conn:
        ids = actions_repo.warning_deliveries(
            conn,
            policy=ep.policy.name,
            job_id=ep.job_id,
            alert_id=ep.alert_id,
            since=turn.prog.episode_start,
        )
        found = outbox_repo.statuses(conn, delivery_ids=ids)
    counts = {s: sum(1 for v in found.values() if v == s) for s in ("sent", "pending", "failed")}
    if counts["sent"]:
        return None
    return (
        "no warning of this episode has reached the owner: a reclaim needs one sent"
        f" ({counts['pending']} still queued, {counts['failed']} failed)"
    )


def _figures(verdict: Mapping[str, Any], prog: LadderProgress, now: datetime) -> dict[str, float]:
    """The numbers behind a reclaim: how long the condition has held (seconds) and the job's
    verdict's dollar figures."""
    out = {"condition_seconds": (now - prog.episode_start).total_seconds()}
    for key, value in verdict.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = float(value)
    return out


def _call(driver: ReclaimDriver, target: ReclaimTarget, *, dry_run: bool) -> ReclaimResult:
    """The driver's answer; one that raises (against its contract) counts as failed."""
    try:
        return driver.reclaim(target, dry_run=dry_run)
    except Exception as exc:
        log.exception("the %s driver raised on %s", driver.name, target.job_id)
        return ReclaimResult("failed", f"the {driver.name} driver raised {type(exc).__name__}")


def _reclaim_outcome(
    turn: _Turn, res: ReclaimResult, *, driver: str, mode: str, resumed: bool
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
