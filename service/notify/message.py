"""Messages for people, rendered once (plain text, HTML, Slack text and blocks) and queued.

An owner notice says what was seen (GPU, node, since when), the cause, the dollars so far, the
fix and its saving, what happens next and when, and links to the job's console page. The same
``Message`` goes out by e-mail (text and HTML parts) or Slack (blocks) unchanged.
"""

from __future__ import annotations

import html
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from service.core.slack_text import (
    TEXT_MAX,
    cut,
    cut_escaped,
    escape,
    field_text,
    message_blocks,
)
from service.core.verdict import NO_VERDICT, Verdict
from service.delivery import rfc3339
from service.notify.base import Notification
from service.notify.envelope import Message
from service.notify.slack import render


class OwnerNotice(BaseModel):
    """What a notice to a job's owner says, in figures; ``render_owner_notice`` words it."""

    model_config = ConfigDict(extra="forbid")  # a misspelt figure fails, never goes unsaid

    job_id: str
    user: str | None = None
    team: str | None = None
    policy: str
    description: str | None = None  # the policy's own words
    node: str | None = None
    gpus: str | None = None  # the GPUs as "0,1 (GPU-a0,GPU-a1)"
    since: datetime
    seen: str  # the condition in words: "avg sm_active over 10m = 0.1 (< 0.3)"
    verdict: Verdict = NO_VERDICT
    next_step: str | None = None  # "the job is cancelled", "another warning"
    next_step_at: datetime | None = None
    report_url: str | None = None  # the job's console page
    fallback_reason: str | None = None  # why this reached a team or the admins instead
    action: str | None = None  # what GPU Warden did or would do now (a ladder's step)


def owner_notice_of(
    note: Notification,
    *,
    next_step: str | None = None,
    next_step_at: datetime | None = None,
    fallback_reason: str | None = None,
) -> OwnerNotice:
    """The owner notice of a job alert's notification (and the ladder's next step, if any)."""
    labels = note.labels
    index, uuid = labels.get("gpu_index"), labels.get("gpu_uuid")
    gpus = f"{index} ({uuid})" if index and uuid else (uuid or index)
    return OwnerNotice(
        job_id=labels.get("job_id") or note.scope_key.removeprefix("job:"),
        user=labels.get("user") or None,
        team=labels.get("team") or None,
        policy=note.policy,
        description=note.description,
        node=labels.get("node") or None,
        gpus=gpus,
        since=note.active_since,
        seen=note.condition(),
        verdict=note.verdict,
        next_step=next_step,
        next_step_at=next_step_at,
        report_url=note.report_url,
        fallback_reason=fallback_reason,
    )


def _usd(value: float) -> str:
    return f"${value:,.2f}"


def notice_lines(n: OwnerNotice) -> list[tuple[str, str]]:
    """The notice as (heading, sentence) pairs, in the order every form shows them."""
    where = " ".join(p for p in (n.node and f"node {n.node}", n.gpus and f"GPU {n.gpus}") if p)
    lines = [("Seen", f"{n.seen} on {where or 'its GPUs'} since {rfc3339(n.since)}")]
    if n.description:
        lines.append(("Policy", n.description))
    v = n.verdict
    if v.top_cause:
        lines.append(("Cause", v.top_cause))
    if v.waste_usd is not None or v.cost_usd is not None:
        money = []
        if v.cost_usd is not None:
            money.append(f"cost so far {_usd(v.cost_usd)}")
        if v.waste_usd is not None:
            waste = f"waste so far {_usd(v.waste_usd)}"
            if v.idle_usd is not None and v.fixable_usd is not None:
                waste += f" (idle {_usd(v.idle_usd)} + fixable {_usd(v.fixable_usd)}, estimated)"
            money.append(waste)
        lines.append(("Dollars", "; ".join(money)))
    if v.fix:
        saving = f" (saves about {_usd(v.fix_saving_usd)})" if v.fix_saving_usd is not None else ""
        lines.append(("Fix", v.fix + saving))
    if n.next_step:
        when = f" at {rfc3339(n.next_step_at)}" if n.next_step_at is not None else ""
        lines.append(("Next", f"{n.next_step}{when}"))
    else:
        lines.append(("Next", "nothing is done to the job; this notice repeats while it lasts"))
    if n.fallback_reason:
        lines.append(("Why you", n.fallback_reason))
    return lines


def render_owner_notice(n: OwnerNotice) -> Message:
    """The notice as e-mail text, HTML and Slack blocks (within Block Kit's limits, escaped)."""
    subject = f"GPU Warden: your job {n.job_id} ({n.policy})"
    if n.action and n.action.startswith("[dry run]"):
        subject = f"[dry run] {subject}"
    if n.verdict.waste_usd is not None:
        subject += f", {_usd(n.verdict.waste_usd)} wasted so far"
    lines = notice_lines(n)
    greeting = f"Hello {n.user}," if n.user else "Hello,"
    intro = f"GPU Warden's policy {n.policy} matched your job {n.job_id}."
    if n.action:
        intro += f" {n.action}"
    text = "\n".join(
        [greeting, "", intro, ""]
        + [f"{head}: {body}" for head, body in lines]
        + ([f"\nThe job's page: {n.report_url}"] if n.report_url else [])
    )
    rows = "".join(
        f"<tr><th align='left' valign='top'>{html.escape(h)}</th><td>{html.escape(b)}</td></tr>"
        for h, b in lines
    )
    link = (
        f'<p><a href="{html.escape(n.report_url, quote=True)}">The job\'s page</a></p>'
        if n.report_url
        else ""
    )
    body_html = (
        f"<html><body><p>{html.escape(greeting)}</p><p>{html.escape(intro)}</p>"
        f"<table>{rows}</table>{link}</body></html>"
    )
    page = f"<{escape(n.report_url)}|The job's page>" if n.report_url else None
    blocks = message_blocks(subject, intro, (field_text(h, b) for h, b in lines), page)
    return Message(
        subject=cut(subject, 998),
        text=text,
        html=body_html,
        slack_text=cut_escaped(f"{subject}: {lines[0][1]}", TEXT_MAX),
        slack_blocks=blocks,
    )


def message_of_notification(note: Notification) -> Message:
    """An alert's notification as a message for an e-mail or Slack DM channel."""
    lines = [note.condition(), f"since {rfc3339(note.fired_at or note.active_since)}"]
    for extra in (note.verdict.waste_words(), note.verdict.cause_words(), note.description):
        if extra:
            lines.append(extra)
    labels = note.alert_labels()
    lines += [f"{k}: {v}" for k, v in sorted(labels.items())]
    links = [(note.report_url, "Job report"), (note.alert_url, "Alert")]
    lines += [f"{label}: {url}" for url, label in links if url]
    slack = render(note)
    return Message(
        subject=cut(note.headline(), 998),
        text="\n".join(lines),
        html="<html><body><p>"
        + "<br>".join(html.escape(line) for line in lines)
        + "</p></body></html>",
        slack_text=slack["text"],
        slack_blocks=slack["blocks"],
    )
