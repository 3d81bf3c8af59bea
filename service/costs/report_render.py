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
    FIELDS_MAX,
    HEADER_MAX,
    SECTION_MAX,
    cut_escaped,
    escape,
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
    ]
    if t.waste_by_cause_usd:
        causes = ", ".join(f"{c} {usd(v)}" for c, v in t.waste_by_cause_usd.items())
        lines.append(f"Waste by cause: {causes}")
    p = report.previous
    if p is None:
        lines.append(f"Change since the {_span(report)} before: no jobs then")
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
            f"waste {usd(j.waste_usd)}, top cause {j.top_cause or 'none'}"
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
        f"top cause {r.top_cause or 'none'}"
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


_CELL = "padding:4px 10px;border-bottom:1px solid #e4e7ec;text-align:left"


def _table(head: list[str], rows: list[list[str]]) -> str:
    """An HTML table of already escaped cells."""
    th = "".join(f"<th style='{_CELL}'>{h}</th>" for h in head)
    trs = "".join(
        "<tr>" + "".join(f"<td style='{_CELL}'>{c}</td>" for c in row) + "</tr>" for row in rows
    )
    return (
        f"<table style='border-collapse:collapse'><thead><tr>{th}</tr></thead>"
        f"<tbody>{trs}</tbody></table>"
    )


def render_html(report: Report) -> str:
    """The HTML body: the same figures as the text, every value escaped."""
    e = html.escape
    t = report.totals
    link = f"<a href='{e(report.page_url, quote=True)}'>{e(report.page_url)}</a>"
    if t is None:
        body = f"<p>{e(no_jobs_line(report))}</p>"
    else:
        title = f"GPU Warden report for {_whose(report)}, {report.period.label()}"
        summary = "".join(f"<li>{e(line)}</li>" for line in _summary_lines(report, t))
        body = f"<h1 style='font-size:18px'>{e(title)}</h1><ul>{summary}</ul>"
        if report.top_jobs:
            rows = [
                [
                    f"<a href='{e(j.url, quote=True)}'>{e(j.job_id)}</a>", e(j.user or ""),
                    f"{j.gpu_hours:,.2f}", e(usd(j.cost_usd)), e(usd(j.waste_usd)),
                    e(j.top_cause or "none"), e(_fix_text(j)),
                ]
                for j in report.top_jobs
            ]  # fmt: skip
            head = ["job", "user", "GPU-h", "cost", "waste", "top cause", "fix"]
            body += "<h2 style='font-size:15px'>Costliest jobs</h2>" + _table(head, rows)
        for title_, ranked in _rankings(report):
            rows = [
                [f"<a href='{e(r.url, quote=True)}'>{e(r.name)}</a>", e(usd(r.waste_usd)),
                 e(usd(r.cost_usd)), e(r.top_cause or "none")]
                for r in ranked
            ]  # fmt: skip
            body += f"<h2 style='font-size:15px'>{e(title_)} (by waste)</h2>"
            body += _table(["name", "waste", "cost", "top cause"], rows)
        body += f"<p>Details: {link}</p>"
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{e(subject(report))}</title></head>"
        f"<body style='font-family:sans-serif;color:#101828'>{body}</body></html>"
    )


def _link(url: str, label: str) -> str:
    # A link's label ends at "|" and the link at ">": both escaped or cut away.
    return f"<{escape(url)}|{escape(label.replace('|', '/'))[:200]}>"


def render_slack(report: Report) -> dict[str, Any]:
    """The Slack message (``text`` and ``blocks``), within Block Kit's limits."""
    head = subject(report)
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": head[:HEADER_MAX]}}
    ]
    t = report.totals
    lines = [no_jobs_line(report)] if t is None else _summary_lines(report, t)
    blocks.append(_section("\n".join(lines)))
    for job, (line, fix) in zip(report.top_jobs, _job_lines(report), strict=True):
        text = cut_escaped(line + (f"\n{fix}" if fix else ""), SECTION_MAX - 250)
        blocks.append(_section_raw(text + "\n" + _link(job.url, "job page")))
    for title, ranked in _rankings(report):
        fields = [
            {"type": "mrkdwn", "text": cut_escaped(_ranked_line(i, r), FIELD_MAX)}
            for i, r in enumerate(ranked, 1)
        ][:FIELDS_MAX]
        blocks += [_section(f"{title} (by waste)"), {"type": "section", "fields": fields}]
    blocks.append(
        {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": _link(report.page_url, "Details")}],
        }
    )
    return {"text": cut_escaped(head, SECTION_MAX), "blocks": blocks[:BLOCKS_MAX]}


def _section(text: str) -> dict[str, Any]:
    return _section_raw(cut_escaped(text, SECTION_MAX))


def _section_raw(mrkdwn: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": mrkdwn}}


def render(report: Report) -> Rendered:
    """The report in every form, rendered once."""
    return Rendered(subject(report), render_text(report), render_html(report), render_slack(report))
