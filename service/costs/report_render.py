"""A periodic report rendered once for every channel: a subject, plain text, HTML (every value
escaped) and Slack Block Kit blocks (within Slack's limits, mrkdwn escaped).

Pure: a ``periodic.Report`` in, strings and a JSON-able dict out. Dollars are written to the
cent as ``$1,234.56``.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from service.core.slack_text import (
    BLOCKS_MAX,
    FIELD_MAX,
    HEADER_MAX,
    SECTION_MAX,
    Block,
    context_block,
    cut_escaped,
    escape,
    fields_block,
    header_block,
    section_block,
)
from service.costs.periodic import JobLine, Ranked, Report, Totals, change


@dataclass(frozen=True, slots=True)
class Rendered:
    """One report in every form a channel sends."""

    subject: str
    text: str
    html: str
    slack: dict[str, Any]


def usd(value: float | None) -> str:
    """Dollars to the cent, "$1,234.56"; "n/a" when unpriced."""
    return "n/a" if value is None else f"${value:,.2f}"


def _span(report: Report) -> str:
    return {"weekly": "week", "daily": "day"}.get(report.period.name, "period")


def _whose(report: Report) -> str:
    return "the fleet" if report.kind == "admins" else f"{report.kind} {report.name}"


def subject(report: Report) -> str:
    """The mail's subject, e.g. "GPU Warden weekly report, user alice: $12.00 of $40.00 wasted"."""
    kind = {"week": "weekly", "day": "daily"}.get(_span(report), "periodic")
    head = f"GPU Warden {kind} report, {_whose(report)}, {report.period.label()}"
    t = report.totals
    if t is None:
        return f"{head}: no GPU jobs"
    if t.cost_usd is None and t.waste_usd is None:  # no prices: GPU-hours
        return f"{head}: {t.waste_gpu_hours:,.2f} of {t.gpu_hours:,.2f} GPU-h wasted"
    return f"{head}: {usd(t.waste_usd)} of {usd(t.cost_usd)} wasted"


def no_jobs_line(report: Report) -> str:
    """The whole report of a user or team that ran no job in the period."""
    period = report.period
    when = {"weekly": f"in the {period.label()}", "daily": f"on {period.label()}"}.get(
        period.name, f"from {period.label()}"
    )
    return f"{_whose(report).capitalize()} ran no GPU jobs {when} ({report.page_url})."


def _summary_lines(report: Report, t: Totals) -> list[str]:
    lines = [
        f"GPU-hours: {t.gpu_hours:,.2f} over {t.jobs} job{'s' if t.jobs != 1 else ''}",
        f"Cost: {usd(t.cost_usd)}",
        f"Waste: {usd(t.waste_usd)} = idle {usd(t.idle_usd)} + fixable {usd(t.fixable_usd)}"
        " (estimated)",
        f"Waste in GPU-hours: {t.waste_gpu_hours:,.2f} of {t.gpu_hours:,.2f} = idle "
        f"{t.idle_gpu_hours:,.2f} + fixable {t.fixable_gpu_hours:,.2f} (estimated)",
    ]
    if t.cost_usd is None and t.waste_usd is None:  # no prices: the GPU-hours alone
        del lines[1:3]
    if t.waste_by_cause_usd:
        causes = ", ".join(f"{c} {usd(v)}" for c, v in t.waste_by_cause_usd.items())
        lines.append(f"Waste by cause: {causes}")
    if t.realised_usd:  # only where fixes were applied and measured: other reports read as before
        lines.append(
            f"Fixes applied this {_span(report)} saved {usd(t.realised_usd)}, measured against "
            f"the runs before them ({usd(t.promised_usd)} promised)"
        )
    p = report.previous
    if p is None:
        lines.append(f"Change since the {_span(report)} before: no jobs then")
    elif t.cost_usd is None and t.waste_usd is None:
        lines.append(
            f"Change since the {_span(report)} before: held {t.gpu_hours - p.gpu_hours:+,.2f} "
            f"GPU-h, waste {t.waste_gpu_hours - p.waste_gpu_hours:+,.2f} GPU-h"
        )
    else:
        lines.append(
            f"Change since the {_span(report)} before: cost {change(t.cost_usd, p.cost_usd)}, "
            f"waste {change(t.waste_usd, p.waste_usd)}"
        )
    return lines


def _job_lines(report: Report) -> list[tuple[str, str | None]]:
    """Each costly job as (its line, its fix line or None)."""
    out = []
    for i, j in enumerate(report.top_jobs, 1):
        owner = f" ({j.user})" if report.kind != "user" and j.user else ""
        line = (
            f"{i}. {j.job_id}{owner}: {usd(j.cost_usd)} for {j.gpu_hours:,.2f} GPU-h, "
            f"waste {usd(j.waste_usd)}, top cause {j.top_cause or 'none'}; "
            f"{j.waste_gpu_hours:,.2f} GPU-h wasted"
        )
        out.append((line, f"fix: {_fix_text(j)}" if j.fix else None))
    return out


def _fix_text(j: JobLine) -> str:
    """A job's top fix and its saving, e.g. "... (saves about $2.00)"; empty without one."""
    if not j.fix:
        return ""
    saving = f" (saves about {usd(j.fix_saving_usd)})" if j.fix_saving_usd is not None else ""
    return j.fix + saving


def _ranked_line(i: int, r: Ranked) -> str:
    return (
        f"{i}. {r.name}: waste {usd(r.waste_usd)} of {usd(r.cost_usd)}, "
        f"top cause {r.top_cause or 'none'}; {r.waste_gpu_hours:,.2f} GPU-h wasted"
    )


def render_text(report: Report) -> str:
    """The plain-text body."""
    t = report.totals
    if t is None:
        return no_jobs_line(report) + "\n"
    out = [
        f"GPU Warden report for {_whose(report)}, {report.period.label()} "
        f"({report.period.start:%Y-%m-%d %H:%M}Z to {report.period.end:%Y-%m-%d %H:%M}Z)",
        "",
        *_summary_lines(report, t),
    ]
    if report.top_jobs:
        out += ["", "Costliest jobs:"]
        for job, (line, fix) in zip(report.top_jobs, _job_lines(report), strict=True):
            out += [line, *([f"   {fix}"] if fix else []), f"   {job.url}"]
    for title, ranked in _rankings(report):
        out += ["", f"{title} (by waste):", *(_ranked_line(i, r) for i, r in enumerate(ranked, 1))]
    out += ["", f"Details: {report.page_url}"]
    return "\n".join(out) + "\n"


def _rankings(report: Report) -> list[tuple[str, list[Ranked]]]:
    return [
        (title, ranked)
        for title, ranked in (
            ("Worst users", report.worst_users),
            ("Worst teams", report.worst_teams),
        )
        if ranked
    ]


# Mail clients lay a message out in about 600 px (phones in 320-400): one column, no wide
# table. Each job is a block of short lines that wrap, and every long word (a job id, a URL) may
# break anywhere, so nothing scrolls sideways.
_BODY = (
    "margin:0;padding:0;font-family:Helvetica,Arial,sans-serif;color:#101828;font-size:14px;"
    "line-height:1.45"
)
_WRAP = "overflow-wrap:anywhere;word-break:break-word"
_BLOCK = f"padding:8px 0;border-bottom:1px solid #e4e7ec;{_WRAP}"
_MUTED = "color:#475467"


def _stack(items: list[tuple[str, list[str]]]) -> str:
    """A column of blocks: each an already escaped head line and its detail lines."""
    return "".join(
        f"<div style='{_BLOCK}'><div><strong>{head}</strong></div>"
        + "".join(f"<div style='{_MUTED}'>{line}</div>" for line in lines)
        + "</div>"
        for head, lines in items
    )


def _job_blocks(report: Report) -> str:
    e = html.escape
    items = []
    for i, j in enumerate(report.top_jobs, 1):
        owner = f" ({e(j.user)})" if report.kind != "user" and j.user else ""
        head = f"{i}. <a href='{e(j.url, quote=True)}'>{e(j.job_id)}</a>{owner}"
        lines = [
            f"{e(usd(j.cost_usd))} for {j.gpu_hours:,.2f} GPU-h, waste {e(usd(j.waste_usd))},"
            f" top cause {e(j.top_cause or 'none')}; {j.waste_gpu_hours:,.2f} GPU-h wasted"
        ]
        if j.fix:
            lines.append(f"fix: {e(_fix_text(j))}")
        items.append((head, lines))
    return _stack(items)


def _ranked_blocks(ranked: list[Ranked]) -> str:
    e = html.escape
    return _stack(
        [
            (
                f"{i}. <a href='{e(r.url, quote=True)}'>{e(r.name)}</a>",
                [
                    f"waste {e(usd(r.waste_usd))} of {e(usd(r.cost_usd))}, top cause"
                    f" {e(r.top_cause or 'none')}; {r.waste_gpu_hours:,.2f} GPU-h wasted"
                ],
            )
            for i, r in enumerate(ranked, 1)
        ]
    )


def render_html(report: Report) -> str:
    """The HTML body: the same figures as the text, every value escaped, in one column of at
    most 600 px that wraps down to a phone's width."""
    e = html.escape
    t = report.totals
    link = f"<a href='{e(report.page_url, quote=True)}'>{e(report.page_url)}</a>"
    if t is None:
        body = f"<p>{e(no_jobs_line(report))}</p>"
    else:
        title = f"GPU Warden report for {_whose(report)}, {report.period.label()}"
        summary = "".join(
            f"<p style='margin:4px 0'>{e(line)}</p>" for line in _summary_lines(report, t)
        )
        body = f"<h1 style='font-size:18px;margin:0 0 8px'>{e(title)}</h1>{summary}"
        if report.top_jobs:
            body += "<h2 style='font-size:15px;margin:16px 0 4px'>Costliest jobs</h2>"
            body += _job_blocks(report)
        for title_, ranked in _rankings(report):
            body += f"<h2 style='font-size:15px;margin:16px 0 4px'>{e(title_)} (by waste)</h2>"
            body += _ranked_blocks(ranked)
        body += f"<p style='margin:16px 0 0'>Details: {link}</p>"
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>{e(subject(report))}</title></head>"
        f"<body style='{_BODY}'><div style='max-width:600px;margin:0 auto;padding:12px;"
        f"box-sizing:border-box;{_WRAP}'>{body}</div></body></html>"
    )


def _link(url: str, label: str) -> str:
    # A link's label ends at "|" and the link at ">": both escaped or cut away.
    return f"<{escape(url)}|{escape(label.replace('|', '/'))[:200]}>"


def render_slack(report: Report) -> dict[str, Any]:
    """The Slack message (``text`` and ``blocks``), within Block Kit's limits."""
    head = subject(report)
    blocks: list[Block] = [header_block(head[:HEADER_MAX])]
    t = report.totals
    lines = [no_jobs_line(report)] if t is None else _summary_lines(report, t)
    blocks.append(_section("\n".join(lines)))
    for job, (line, fix) in zip(report.top_jobs, _job_lines(report), strict=True):
        text = cut_escaped(line + (f"\n{fix}" if fix else ""), SECTION_MAX - 250)
        blocks.append(section_block(text + "\n" + _link(job.url, "job page")))
    for title, ranked in _rankings(report):
        fields = (cut_escaped(_ranked_line(i, r), FIELD_MAX) for i, r in enumerate(ranked, 1))
        blocks += [_section(f"{title} (by waste)"), fields_block(fields)]
    blocks.append(context_block(_link(report.page_url, "Details")))
    return {"text": cut_escaped(head, SECTION_MAX), "blocks": blocks[:BLOCKS_MAX]}


def _section(text: str) -> Block:
    return section_block(cut_escaped(text, SECTION_MAX))


def render(report: Report) -> Rendered:
    """The report in every form, rendered once."""
    return Rendered(subject(report), render_text(report), render_html(report), render_slack(report))
