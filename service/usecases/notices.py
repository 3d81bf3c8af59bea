"""Messages to people: find the owner's addresses (directory, lookup command, fallback), queue a
rendered message through the outbox, and record what went to whom.

The one way to send a rendered message to a user or a team::

    addressee = resolve(ctx, user="alice", team="vision")  # or resolve_team_addressee(...)
    with ctx.engine.begin() as conn:
        queue_message(conn, ctx, addressee=addressee, message=msg, kind="report",
                      key="report:weekly:2026-12-07:user:alice")

``key`` makes the queueing idempotent: a second call with the same key queues nothing, on any
replica (the delivery ids derive from it and are unique in the store).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection

from service.context import ServiceContext
from service.db import notices_repo, outbox_repo, owners_repo, policies_repo
from service.db.rows import NewNotice, NewOutboxRow, NoticeBase
from service.notify import Notification
from service.notify.envelope import Envelope, Message
from service.notify.lookup import run_lookup
from service.notify.message import (
    OwnerNotice,
    owner_notice_of,
    render_owner_notice,
)
from service.thresholds.ladder import JobFacts, step_word
from service.thresholds.owners import (
    ADMINS,
    Addressee,
    OwnerEntry,
    resolve_owner,
    resolve_team,
)
from service.thresholds.policy import OWNER_CHANNEL, ChannelSpec, PolicySpec

log = logging.getLogger(__name__)

FAILED_LOOKUP_CACHE_SECONDS = 300.0  # a lookup that failed is tried again this soon at most
OWNER_NOTICE = "owner_notice"


def directory(
    conn: Connection, *, users: Iterable[str], teams: Iterable[str], now: datetime
) -> dict[str, OwnerEntry]:
    """The entries of ``users``, ``teams`` and the admins, by key (expired lookups left out)."""
    keys = [("user", u) for u in users] + [("team", t) for t in teams] + [("admins", ADMINS)]
    out = {}
    for s in owners_repo.get_owners(conn, keys=keys):
        if s.source == "lookup" and (s.expires_at is None or s.expires_at <= now):
            continue
        out[s.entry.key] = s.entry
    return out


def look_up_missing(ctx: ServiceContext, users: Iterable[str]) -> None:
    """Run the lookup command (if one is set) for each of ``users`` missing from the directory
    or whose cached answer expired, and cache the answers; never raises."""
    s = ctx.settings
    if not s.owner_lookup_command:
        return
    now = ctx.clock()
    wanted = sorted({u for u in users if u})
    try:
        with ctx.engine.connect() as conn:
            known = directory(conn, users=wanted, teams=(), now=now)
    except Exception:
        log.exception("the owner directory could not be read for lookups")
        return
    for user in wanted:
        if f"user:{user}" in known:
            continue
        answer = run_lookup(
            s.owner_lookup_command,
            s.owner_lookup_pattern,
            user=user,
            timeout_seconds=s.owner_lookup_timeout_seconds,
        )
        ttl = s.owner_lookup_ttl_seconds
        if answer.error:
            log.warning("looking up owner %s: %s", user, answer.error)
            ttl = min(ttl, FAILED_LOOKUP_CACHE_SECONDS)
        entry = answer.entry or OwnerEntry(kind="user", name=user)  # no address: cached too
        try:
            with ctx.engine.begin() as conn:
                owners_repo.put_owner(
                    conn,
                    entry=entry,
                    source="lookup",
                    now=now,
                    expires_at=now + timedelta(seconds=ttl),
                )
        except Exception:
            log.exception("the lookup answer for %s could not be cached", user)


def resolve(ctx: ServiceContext, *, user: str | None, team: str | None) -> Addressee:
    """Where a message to the owner ``user`` (of ``team``) goes, running the lookup command
    first when the user is not in the directory; call it outside a write transaction."""
    resolved = resolve_many(ctx, [(user, team)])
    return resolved[(user, team)]


def resolve_many(
    ctx: ServiceContext, owners: Iterable[tuple[str | None, str | None]]
) -> dict[tuple[str | None, str | None], Addressee]:
    """``resolve`` for many (user, team) pairs at once."""
    pairs = sorted(set(owners), key=lambda p: (p[0] or "", p[1] or ""))
    look_up_missing(ctx, (u for u, _ in pairs if u))
    now = ctx.clock()
    with ctx.engine.connect() as conn:
        found = directory(
            conn,
            users={u for u, _ in pairs if u},
            teams={t for _, t in pairs if t},
            now=now,
        )
        # A user's own entry may name their team: read those too for the fallback.
        extra = {e.team for e in found.values() if e.kind == "user" and e.team} - set(found)
        if extra:
            found |= directory(conn, users=(), teams=extra, now=now)
    return {(u, t): resolve_owner(found, user=u, team=t) for u, t in pairs}


def resolve_team_addressee(ctx: ServiceContext, *, team: str) -> Addressee:
    """Where a message to ``team`` goes: the team, else the admins."""
    with ctx.engine.connect() as conn:
        found = directory(conn, users=(), teams=[team], now=ctx.clock())
    return resolve_team(found, team=team)


def _channels(conn: Connection) -> tuple[ChannelSpec | None, ChannelSpec | None]:
    """The e-mail and Slack DM channels people's messages go out on (the first of each type
    by name), or None where there is none."""
    chans = policies_repo.list_channels(conn)
    email = next((c for c in chans if c.type == "email"), None)
    dm = next((c for c in chans if c.type == "slack_dm"), None)
    return email, dm


def _delivery_id(key: str | None, part: str) -> str:
    if key is None:
        return f"msg_{uuid.uuid4().hex}"
    return "msg_" + hashlib.sha256(f"{key}\x00{part}".encode()).hexdigest()[:40]


# One message part: the channel, the addresses it goes to, and those copied.
_Part = tuple[ChannelSpec, list[str], list[str]]


def queue_message(
    conn: Connection,
    ctx: ServiceContext,
    *,
    addressee: Addressee,
    message: Message,
    kind: str,
    job_id: str | None = None,
    policy: str | None = None,
    key: str | None = None,
) -> list[NewNotice]:
    """Queue ``message`` to ``addressee``'s e-mail address (copy: cc_email) and Slack id
    (copy: cc_slack) in ``conn``'s transaction and record each as a notice; the notices made
    (a single ``unreachable`` one when no address or channel was found). With ``key``, a
    message already queued under it is not queued again."""
    now = ctx.clock()
    parts = _parts(addressee.entry, *_channels(conn))
    base = _notice_base(addressee, message, kind=kind, job_id=job_id, policy=policy)
    if not parts:
        return _record_unreachable(conn, base, addressee, kind=kind, key=key, now=now)
    made = [
        (channel, to, cc, _delivery_id(key, f"{channel.name}:{to[0]}")) for channel, to, cc in parts
    ]
    if key:
        done = notices_repo.delivered_ids(conn, delivery_ids=[m[3] for m in made])
        made = [m for m in made if m[3] not in done]
    return _enqueue(conn, made, base, message, now=now)


def _parts(
    entry: OwnerEntry | None, email_ch: ChannelSpec | None, dm_ch: ChannelSpec | None
) -> list[_Part]:
    """The parts a message to ``entry`` goes out as: its e-mail (with its cc) on ``email_ch``,
    its Slack id and its cc Slack id each on ``dm_ch``, where both address and channel exist."""
    parts: list[_Part] = []
    if entry is not None and entry.email and email_ch is not None:
        parts.append((email_ch, [entry.email], [entry.cc_email] if entry.cc_email else []))
    if entry is not None and entry.slack and dm_ch is not None:
        parts.append((dm_ch, [entry.slack], []))
        if entry.cc_slack:
            parts.append((dm_ch, [entry.cc_slack], []))
    return parts


def _notice_base(
    addressee: Addressee,
    message: Message,
    *,
    kind: str,
    job_id: str | None,
    policy: str | None,
) -> NoticeBase:
    """The fields every notice of one message shares."""
    entry = addressee.entry
    return {
        "kind": kind,
        "subject": message.subject,
        "job_id": job_id,
        "policy": policy,
        "asked": addressee.asked,
        "recipient": entry.key if entry is not None else None,
        "fallback": addressee.fallback,
        "reason": addressee.reason,
    }


def _record_unreachable(
    conn: Connection,
    base: NoticeBase,
    addressee: Addressee,
    *,
    kind: str,
    key: str | None,
    now: datetime,
) -> list[NewNotice]:
    """Record the one ``unreachable`` notice of a message that has no address or channel
    (none if ``key``'s was recorded already); the notices recorded."""
    why = (
        "no address"
        if addressee.entry is None
        else "no e-mail or slack_dm channel for its addresses"
    )
    marker = _delivery_id(key, "unreachable") if key else None
    notice: NewNotice = {
        **base,
        "delivery_id": marker,
        "channel": None,
        "address": None,
        "status": "unreachable",
        "reason": "; ".join(r for r in (addressee.reason, why) if r),
    }
    if marker and notices_repo.delivered_ids(conn, delivery_ids=[marker]):
        return []
    notices_repo.record(conn, [notice], now=now)
    log.warning("a %s for %s reached no one: %s", kind, addressee.asked, notice["reason"])
    return [notice]


def _enqueue(
    conn: Connection,
    made: list[tuple[ChannelSpec, list[str], list[str], str]],
    base: NoticeBase,
    message: Message,
    *,
    now: datetime,
) -> list[NewNotice]:
    """Put each part of ``made`` (channel, to, cc, delivery id) in the outbox and record it as
    a pending notice; the notices recorded."""
    rows: list[NewOutboxRow] = []
    notices: list[NewNotice] = []
    for channel, to, cc, delivery_id in made:
        env = Envelope(delivery_id=delivery_id, to=to, cc=cc, message=message)
        rows.append(
            {
                "delivery_id": delivery_id,
                "channel": channel.name,
                "alert_id": None,
                "payload": env.model_dump(mode="json"),
            }
        )
        notices.append(
            {
                **base,
                "delivery_id": delivery_id,
                "channel": channel.name,
                "address": ", ".join(to + cc),
                "status": "pending",
            }
        )
    outbox_repo.enqueue(conn, rows, now=now)
    notices_repo.record(conn, notices, now=now)
    return notices


def queue_owner_notice(
    conn: Connection,
    ctx: ServiceContext,
    *,
    notice: OwnerNotice,
    addressee: Addressee,
    key: str | None = None,
) -> list[NewNotice]:
    """Render ``notice`` (saying why it reached a team or the admins, if it did) and queue it
    to ``addressee`` as ``queue_message`` does."""
    if addressee.fallback is not None and notice.fallback_reason is None:
        notice = notice.model_copy(update={"fallback_reason": addressee.reason})
    return queue_message(
        conn,
        ctx,
        addressee=addressee,
        message=render_owner_notice(notice),
        kind=OWNER_NOTICE,
        job_id=notice.job_id,
        policy=notice.policy,
        key=key,
    )


DRY_RUN_REASON = "a dry run: the admins hear what the ladder would do, the owner nothing yet"


def ladder_addressee(
    ctx: ServiceContext, *, user: str | None, team: str | None, dry_run: bool
) -> Addressee:
    """Where a ladder step's notice goes: the job's owner (with the usual fallback), or for a
    dry run the admins; call it outside a write transaction (the lookup may run)."""
    if not dry_run:
        return resolve(ctx, user=user, team=team)
    with ctx.engine.connect() as conn:
        found = directory(conn, users=(), teams=(), now=ctx.clock())
    asked = f"user:{user}" if user else (f"team:{team}" if team else ADMINS)
    admins = found.get(ADMINS)
    return Addressee(
        asked, admins if admins and admins.reachable else None, "admins", DRY_RUN_REASON
    )


def ladder_action_words(outcome: str, word: str, *, step: int, steps: int) -> str:
    """What a ladder step did, for the notice: warned, reclaimed, or (dry run) would."""
    if outcome == "would":
        return f"[dry run] GPU Warden would {word} now; nothing was done."
    if outcome == "reclaimed":
        return f"GPU Warden reclaimed the job ({word})."
    return f"This is warning {step + 1} of the {steps} steps GPU Warden takes on such jobs."


@dataclass(frozen=True)
class OwnerPart:
    """A ladder step's notice to the job's owner: what it says, where it goes, its key."""

    notice: OwnerNotice
    addressee: Addressee
    key: str

    @property
    def words(self) -> str:
        """Whom it goes to, for the audit log: ``owner (user:alice)``."""
        return f"owner ({self.addressee.entry.key if self.addressee.entry else '-'})"

    def queue(self, conn: Connection, ctx: ServiceContext) -> list[str]:
        """Queue it in ``conn``'s transaction (once per key); the delivery ids that made."""
        made = queue_owner_notice(
            conn, ctx, notice=self.notice, addressee=self.addressee, key=self.key
        )
        return [str(n["delivery_id"]) for n in made if n["status"] == "pending"]


def ladder_owner_part(
    ctx: ServiceContext,
    *,
    policy: PolicySpec,
    job_id: str,
    facts: JobFacts,
    step: int,
    progress_id: int,
    outcome: str,
    note: Notification,
) -> OwnerPart | None:
    """A ladder step's owner notice from the step's notification ``note`` (a dry run's goes
    to the admins), or None when the policy does not address ``owner`` or no one can be
    reached; call it outside a write transaction (the lookup may run)."""
    lad = policy.ladder
    if lad is None or OWNER_CHANNEL not in policy.channels:
        return None
    addressee = ladder_addressee(ctx, user=facts.user, team=facts.team, dry_run=lad.dry_run)
    if addressee.entry is None:
        return None
    next_word = note.next_step
    verb = "would" if lad.dry_run else "will"
    notice = owner_notice_of(
        note,
        next_step=f"GPU Warden {verb} {next_word}" if next_word else None,
        next_step_at=note.next_step_at,
    )
    word = step_word(lad, lad.steps[step], job_id)
    notice = notice.model_copy(
        update={
            "job_id": job_id,
            "user": facts.user or notice.user,
            "team": facts.team or notice.team,
            "action": ladder_action_words(outcome, word, step=step, steps=len(lad.steps)),
        }
    )
    return OwnerPart(notice, addressee, key=f"ladder:{progress_id}:{step}:{outcome}")
