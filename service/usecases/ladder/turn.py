"""One job's due step in one acting round (``Turn``), and the audit rows, holds and ends that
every part of the ladder records through it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Unpack

from service.actions.base import ReclaimDriver
from service.context import ServiceContext
from service.core.verdict import NO_VERDICT, Verdict
from service.db import actions_repo, ladder_repo, policies_repo
from service.db.rows import ActionNote, EpisodeKey, NewAction, NewOutboxRow
from service.notify import Notification
from service.thresholds.evaluator import AlertState
from service.thresholds.ladder import JobFacts, LadderProgress, LadderSpec, next_step_at, step_word
from service.thresholds.policy import PolicySpec, condition_words
from service.usecases.evaluation import notification
from service.usecases.notices import OwnerPart, ladder_owner_part
from service.usecases.outbox import outbox_row

log = logging.getLogger(__package__)

# Channel types a notice goes to (Alertmanager holds alerts, not notices).
NOTICE_CHANNEL_TYPES = ("slack", "webhook")


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

    @property
    def key(self) -> EpisodeKey:
        """The keywords a repository keeps this episode's ladder rows under."""
        return {"policy": self.policy.name, "job_id": self.job_id, "alert_id": self.alert_id}


@dataclass
class LadderRoundResult:
    """What one acting round did: audit rows written, by outcome."""

    episodes: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    notices: int = 0

    def count(self, outcome: str) -> None:
        """Count one audit row of ``outcome``."""
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


@dataclass(frozen=True)
class Round:
    """One acting round: the service, its reclaim drivers, the clock reading and the tallies."""

    ctx: ServiceContext
    drivers: Mapping[str, ReclaimDriver]
    now: datetime
    result: LadderRoundResult


@dataclass(frozen=True)
class Turn:
    """One job's due step in one round: what every part of taking it needs (the verdict is
    read only once every check has passed)."""

    rnd: Round
    ep: Episode
    prog: LadderProgress
    facts: JobFacts
    step: int
    verdict: Verdict = NO_VERDICT
    evidence: str | None = None  # sham or hung time's evidence in words (issue 47)

    @property
    def ctx(self) -> ServiceContext:
        """The service this round runs in."""
        return self.rnd.ctx

    @property
    def now(self) -> datetime:
        """The round's clock reading."""
        return self.rnd.now

    @property
    def result(self) -> LadderRoundResult:
        """The round's tallies."""
        return self.rnd.result

    @property
    def last(self) -> bool:
        """Whether this is the ladder's last step."""
        return self.step == len(self.ep.ladder.steps) - 1

    def record(self, conn: Any, *, outcome: str, **note: Unpack[ActionNote]) -> None:
        """This step's audit row, counted in the round's result."""
        record(
            conn,
            self.ep,
            self.prog,
            self.now,
            step=self.step,
            outcome=outcome,
            dry_run=self.ep.ladder.dry_run,
            verdict=self.verdict,
            **note,
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
            note=self.notice(outcome=outcome),
        )

    def notice(self, *, outcome: str) -> Notification:
        """The notification of the step's notice (its delivery id set as it is queued)."""
        ep = self.ep
        text, next_word, next_at = owner_notice(
            ep, self.prog, self.step, self.facts, self.verdict, outcome=outcome,
            evidence=self.evidence,
        )  # fmt: skip
        note = notification(
            self.ctx,
            ep.policy,
            ep.state,
            "notice",
            ep.alert_id,
            self.now,
            self.verdict,
        )
        return note.model_copy(
            update={"notice": text, "next_step": next_word, "next_step_at": next_at}
        )

    def notice_rows(self, *, outcome: str) -> list[NewOutboxRow]:
        """Outbox rows of the step's notice, one per Slack or webhook channel of the policy."""
        ep, note = self.ep, self.notice(outcome=outcome)
        with self.ctx.engine.connect() as conn:
            types = {c.name: c.type for c in policies_repo.list_channels(conn)}
        return [
            outbox_row(note, channel=channel, alert_id=ep.alert_id)
            for channel in ep.policy.channels
            if types.get(channel) in NOTICE_CHANNEL_TYPES
        ]


def action_at(ladder: LadderSpec | None, prog: LadderProgress) -> str:
    """The action of the step the ladder stands at (notify_owner, or reclaim once a reclaim is
    pending or every warning is done); a ladder since removed: by the pending intent."""
    if ladder is None:
        return "reclaim" if prog.pending_step is not None else "notify_owner"
    return ladder.steps[min(prog.steps_done, len(ladder.steps) - 1)].action


def record(
    conn: Any,
    ep: Episode,
    prog: LadderProgress,
    now: datetime,
    *,
    step: int | None,
    outcome: str,
    dry_run: bool,
    verdict: Verdict = NO_VERDICT,
    **note: Unpack[ActionNote],
) -> None:
    """One audit row with the numbers behind it (value, threshold, since, dollars)."""
    # A skip or an end outside a step is filed under the step the ladder stood at.
    action = ep.ladder.steps[step].action if step is not None else action_at(ep.ladder, prog)
    actions_repo.record_action(
        conn,
        NewAction(
            at=now,
            **ep.key,
            user=ep.user,
            team=ep.team,
            step=step,
            action=action,
            outcome=outcome,
            dry_run=dry_run,
            value=ep.state.value,
            threshold=ep.policy.threshold,
            since=prog.episode_start,
            waste_usd=verdict.waste_usd,
            idle_usd=verdict.idle_usd,
            **note,
        ),
    )


def hold(turn: Turn, *, reason: str) -> None:
    """Leave the turn's step untaken this round, recorded (once while the reason stays the
    same)."""
    ep, step = turn.ep, turn.step
    log.info("the ladder of %s holds step %d on %s: %s", ep.policy.name, step, ep.job_id, reason)
    with turn.ctx.engine.begin() as conn:
        last = actions_repo.latest_action(conn, **ep.key)
        if last and (last["outcome"], last["step"], last["reason"]) == ("held", step, reason):
            return
        record(
            conn,
            ep,
            turn.prog,
            turn.now,
            step=step,
            outcome="held",
            dry_run=ep.ladder.dry_run,
            reason=reason,
        )
    turn.result.count("held")


def stop(
    rnd: Round,
    ep: Episode,
    prog: LadderProgress,
    *,
    state: str,
    outcome: str,
    **note: Unpack[ActionNote],
) -> None:
    """End this job's ladder for the episode, recorded once (``note``: why, by which driver)."""
    with rnd.ctx.engine.begin() as conn:
        ladder_repo.stop_ladder(conn, progress_id=prog.id, state=state, now=rnd.now)
        record(
            conn,
            ep,
            prog,
            rnd.now,
            step=prog.pending_step,
            outcome=outcome,
            dry_run=ep.ladder.dry_run,
            **note,
        )
    rnd.result.count(outcome)


def owner_notice(
    ep: Episode,
    prog: LadderProgress,
    step: int,
    facts: JobFacts,
    verdict: Verdict,
    *,
    outcome: str,
    evidence: str | None = None,
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
    if verdict.top_cause:
        text += f" Top cause: {verdict.top_cause}."
    if evidence:
        text += f" Evidence: {evidence}."
    if verdict.waste_usd is not None:
        text += f" Waste so far ${verdict.waste_usd:,.2f}"
        if verdict.idle_usd is not None:
            text += f" (idle ${verdict.idle_usd:,.2f})"
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
