"""The cost report: a window's attributed cost grouped by job, user, team, node, GPU model or
GPU, with the waste model's figures and top fixes per row.

This is the edge that reads the database; the arithmetic lives in ``waste`` and ``money``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection

from service.core import diagnosis
from service.core.diagnosis import CAUSE_BY_NAME
from service.costs import job_groups
from service.costs.assumptions import fix_assumptions_of
from service.costs.money import SORT_BYS, Money, figures, money_of
from service.costs.paging import Page, page_of
from service.costs.recommend import FixAssumptions, cause_fixes, with_model
from service.costs.waste import GROUP_BYS, HARDWARE_GROUP_BYS, UNALLOCATED, Line, Summary, summarize
from service.db import jobs_repo, savings_repo
from service.errors import ValidationFailed
from service.roles import JobScope
from service.settings import Settings
from service.usecases.costing import day_sums as day_sums_mod
from service.usecases.costing.attribution import Attribution
from service.usecases.costing.dollars import DollarsQuery, Who, add_days, dollars
from service.usecases.costing.job_faults import JobFault, report_faults
from service.usecases.gc_pause import gc_paused
from service.usecases.opencost_prices import opencost_problem

UNKNOWN = day_sums_mod.UNKNOWN  # a job without the user or team a report groups by
JOULES_PER_KWH = 3.6e6
TOP_FIXES = 3  # fixes a report row names


def add_energy(row: dict[str, Any], settings: Settings) -> None:
    """Add to ``row`` its energy in kWh and that energy's cost at ``energy_usd_per_kwh``."""
    kwh = float(row["energy_used_joules"]) / JOULES_PER_KWH
    row["energy_kwh"] = kwh
    row["energy_usd"] = kwh * settings.energy_usd_per_kwh


def _for_gpus(a: FixAssumptions, att: Attribution, summary: Summary) -> FixAssumptions:
    """``a`` for the summary's GPUs: their model where they share one."""
    models = {att.gpus[g].model for g in summary.gpu_ids if g in att.gpus}
    return _with_one_model(a, models.pop()) if len(models) == 1 else a


@lru_cache(maxsize=64)
def _with_one_model(a: FixAssumptions, model: str) -> FixAssumptions:
    """``with_model`` for one model, kept: a report asks for each of its rows."""
    return with_model(a, [model])


def report_row(summary: Summary, settings: Settings, a: FixAssumptions) -> dict[str, Any]:
    """A report row: the summary's figures, its energy and its top fixes by USD saved (their
    savings add up to the row's waste_usd)."""
    fixes = cause_fixes(summary, a)
    # The fixes' saving fractions are the causes' waste shares: worked out once, not twice.
    shares = {
        cause: f.saving_fraction
        for f in fixes
        if f.cause is not None and (cause := CAUSE_BY_NAME[f.cause]) in diagnosis.WASTE_CAUSES
    }
    row = figures(summary, a, shares)
    add_energy(row, settings)
    row["fixes"] = [f.as_dict() for f in fixes[:TOP_FIXES]]
    return row


def _key_fn(
    att: Attribution, group_by: str, labels: dict[str, dict[str, str]] | None = None
) -> Any:
    def key(line: Line) -> str:
        if group_by == "node":
            return att.gpus[line.gpu_id].node
        if group_by == "gpu_model":
            return att.gpus[line.gpu_id].model
        if group_by == "gpu":
            return att.gpus[line.gpu_id].uuid
        assert line.job_id is not None
        if group_by == "job":
            return line.job_id
        if labels is not None:
            return job_groups.group_key(group_by, line.job_id, labels.get(line.job_id, {}))
        value = att.jobs.get(line.job_id, {}).get(group_by)
        return value if value else UNKNOWN

    return key


def check_range(settings: Settings, *, start: datetime, end: datetime, now: datetime) -> None:
    """Refuse a start after end, or a start older than any data kept (1h rollup retention)."""
    if start.tzinfo is None or end.tzinfo is None:
        raise ValidationFailed("start", "timestamps need a timezone, e.g. 2026-12-02T08:00:00Z")
    if start >= end:
        raise ValidationFailed("start", "must be before end")
    oldest = now - timedelta(days=settings.retention_1h_days)
    if start < oldest:
        raise ValidationFailed(
            "start",
            f"{start.isoformat()} is older than the retention of the data "
            f"(1h rollups keep {settings.retention_1h_days:g} days, so no earlier than "
            f"{oldest.isoformat()})",
        )


def _check_query(group_by: str, sort_by: str, cause: str | None) -> None:
    """Refuse an unknown group_by, sort or waste cause."""
    if group_by not in GROUP_BYS and job_groups.label_key(group_by) is None:
        raise ValidationFailed(
            "group_by",
            f"unknown group_by {group_by!r}; one of {GROUP_BYS} or label:<key> "
            "(e.g. label:app.kubernetes.io/name)",
        )
    problem = job_groups.label_key_problem(group_by)
    if problem is not None:
        raise ValidationFailed("group_by", problem)
    if sort_by not in SORT_BYS:
        raise ValidationFailed("sort", f"unknown sort {sort_by!r}; one of {SORT_BYS}")
    waste_causes = tuple(c.label for c in diagnosis.WASTE_CAUSES)
    if cause is not None and cause not in waste_causes:
        raise ValidationFailed("cause", f"unknown cause {cause!r}; one of {waste_causes}")


@dataclass(frozen=True, slots=True)
class ReportRequest:
    """What a cost report covers: [start, end) read at ``now``, grouped by ``group_by``, of the
    jobs ``user``, ``team`` and ``scope`` let through."""

    start: datetime
    end: datetime
    now: datetime
    group_by: str
    user: str | None = None
    team: str | None = None
    scope: JobScope | None = None


@gc_paused()
def cost_report(
    conn: Connection,
    *,
    settings: Settings,
    start: datetime,
    end: datetime,
    now: datetime,
    group_by: str,
    user: str | None = None,
    team: str | None = None,
    cause: str | None = None,
    sort_by: str = "waste",
    limit: int | None = None,
    offset: int = 0,
    jobs_only: bool = False,
    scope: JobScope | None = None,
) -> dict[str, Any]:
    """The cost report over [start, end) grouped by ``group_by``: USD and seconds, largest
    ``sort_by`` dollars first (waste by default), only the groups whose top cause is ``cause``
    if given, with totals over every row kept. The dollars are read through
    ``dollars.dollars``, which picks their sources (a report reaching today may end where
    today's sums do). Only the rows [offset, offset + limit) of that order are built (all from
    ``offset`` without ``limit``); the totals and ``row_count`` cover every row the filters
    keep (with ``jobs_only`` no time no job held). With ``scope``, only the jobs it allows (a
    person's own and their teams') count, rows and totals alike; grouping by hardware is
    refused then."""
    _check_query(group_by, sort_by, cause)
    if scope is not None and group_by in HARDWARE_GROUP_BYS:
        raise ValidationFailed(
            "group_by",
            "a person's report groups their own and their teams' jobs by job, user, "
            "team or project; node and GPU model reports show the whole fleet",
        )
    check_range(settings, start=start, end=end, now=now)
    page = Page(sort_by, offset, limit)
    who = Who(user=user, team=team, jobs_only=jobs_only, scope=scope)
    # What the report reads of the summed days, read beside its edges: a page's first reads,
    # or the days grouped as the report groups them.
    by_page = group_by == "job" and cause is None and limit is not None
    days_by = None if by_page else "job" if job_groups.by_job_labels(group_by) else group_by
    query = DollarsQuery(start, end, who=who, days_by=days_by, page_ahead=by_page)
    read = dollars(conn, query, settings=settings, now=now)
    att, end = read.attribution, read.end
    lines = read.lines()
    # Namespaces and labels are read from the jobs (the day sums group by job, then by these).
    labels = None
    if job_groups.by_job_labels(group_by):
        labels = jobs_repo.job_labels(
            conn,
            job_ids={ln.job_id for ln in lines if ln.job_id},
            keys=job_groups.label_keys_of(group_by),
        )
    groups = summarize(
        lines, _key_fn(att, group_by, labels), jobs_only=group_by not in HARDWARE_GROUP_BYS
    )
    assumptions = fix_assumptions_of(settings)
    money = _money_of(att, assumptions)
    paged = None
    if by_page:
        paged = read.summed_page(conn, edges=groups, page=page, money=money)
    if paged is not None:
        att.jobs.update(paged.jobs)
        chosen, total, count = paged.rows, paged.total, paged.count
    else:
        if read.window is not None:
            days = read.summed(conn, group_by="job" if labels is not None else group_by)
            att.jobs.update(days.jobs)
            if labels is not None:
                days.groups = _regrouped(conn, days.groups, group_by, labels)
            add_days(groups, days, att, group_by)
        chosen, total, count = _choose(groups, money, cause=cause, page=page)
    faults = report_faults(conn, att, start=start, end=end, now=now, settings=settings,
                           gpu_ids=_job_gpus(chosen)) if (
        group_by == "job"
    ) else {}  # fmt: skip
    rows = [
        _row(summary, att, settings, assumptions, group_by=group_by, faults=faults)
        for summary in chosen
    ]
    if group_by == "job":
        _without_applied_fixes(conn, rows)
    return {
        "start": start,
        "end": end,
        "group_by": group_by,
        "sort": sort_by,
        "rows": rows,
        "row_count": count,
        "offset": page.offset,
        "limit": page.limit,
        "totals": report_row(total, settings, _for_gpus(assumptions, att, total)),
        "price_source": att.price_source,
        "unit": unit_of(att.price_source),
        "split_rule": settings.cost_split_rule,
        "warnings": att.warnings
        + _explanations(att, total, settings)
        + split_rule_notes(att.split_rules, settings.cost_split_rule),
    }


DEFAULT_PRICES_NOTE = (
    "prices are GPU Warden's shipped defaults (approximate public on-demand prices, see "
    "docs/costs.md); set yours with PUT /api/v1/prices or prices: in the config file"
)


NO_PRICES_NOTE = (
    "no prices (GPUWARDEN_PRICES=none): figures are GPU-hours (held, waste = idle + fixable); "
    "every *_usd is null"
)


def unit_of(price_source: str) -> str:
    """A report's headline unit: GPU-hours for a site without prices, else USD."""
    return "gpu_hours" if price_source == "none" else "usd"


def _explanations(att: Attribution, total: Summary, settings: Settings) -> list[str]:
    """What a first report needs said: why it may be empty, and whose prices it uses (samples
    not rolled up yet are read raw, so they need no word)."""
    out = []
    if not att.gpus:
        out.append(
            "no GPU has reported yet: start an agent on a GPU node (gpuwarden agent) "
            "or try gpuwarden demo"
        )
    if att.price_source == "default" and total.held_seconds > 0:
        out.append(DEFAULT_PRICES_NOTE)
    if att.price_source == "none":
        out.append(NO_PRICES_NOTE)
    problem = opencost_problem(settings)
    if problem is not None:
        out.append(problem)
    return out


def split_rule_notes(stored: set[str], current: str) -> list[str]:
    """What a report says when some shared minutes were split by another rule than today's."""
    other = sorted(stored - {current})
    if not other:
        return []
    return [
        f"some minutes of shared GPUs were split by the rule {', '.join(other)} (the rule in "
        f"force when they were rolled up); the rule now is {current}"
    ]


def _row(
    summary: Summary,
    att: Attribution,
    settings: Settings,
    assumptions: FixAssumptions,
    *,
    group_by: str,
    faults: dict[str, list[JobFault]],
) -> dict[str, Any]:
    """One report row; a job's with its user, team, project and faults."""
    row = report_row(summary, settings, _for_gpus(assumptions, att, summary))
    # The FOCUS export names a row's GPU model as its SKU; the JSON and CSV leave it out.
    row["gpu_models"] = sorted({att.gpus[g].model for g in summary.gpu_ids if g in att.gpus})
    if group_by == "job" and summary.key != UNALLOCATED:
        job = att.jobs.get(summary.key, {})
        row.update(
            user=job.get("user"),
            team=job.get("team"),
            project=job.get("project"),
            faults=[f.as_dict() for f in faults.get(summary.key, [])],
        )
    return row


def _without_applied_fixes(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Drop from each job row the fix its run already applies, by its stored saving (a fixed
    run is never told the fix it applies; docs/savings.md)."""
    applied = savings_repo.applied_fix_causes(conn, job_ids=[str(r["key"]) for r in rows])
    for row in rows:
        cause = applied.get(str(row["key"]))
        if cause is not None:
            row["fixes"] = [f for f in row["fixes"] if f.get("cause") != cause]


def _regrouped(
    conn: Connection,
    by_job: dict[str, Summary],
    group_by: str,
    labels: dict[str, dict[str, str]],
) -> dict[str, Summary]:
    """Day sums read per job, summed per namespace or label (``labels`` gains the jobs'
    labels it did not have); time no job held stays ``__unallocated__``."""
    wanted = set(by_job) - set(labels) - {UNALLOCATED}
    labels.update(
        jobs_repo.job_labels(conn, job_ids=wanted, keys=job_groups.label_keys_of(group_by))
    )
    out: dict[str, Summary] = {}
    for job_id, summary in by_job.items():
        key = (
            UNALLOCATED
            if job_id == UNALLOCATED
            else job_groups.group_key(group_by, job_id, labels.get(job_id, {}))
        )
        if key not in out:
            out[key] = Summary(key)
        out[key].merge(summary)
    return out


def _job_gpus(summaries: list[Summary]) -> set[int]:
    """The GPUs of the job rows among ``summaries`` (time no job held has no faults to show)."""
    return set().union(*(s.gpu_ids for s in summaries if s.key != UNALLOCATED))


def _money_of(att: Attribution, assumptions: FixAssumptions) -> Callable[[Summary], Money]:
    """A group's money under the assumptions for its GPUs."""

    def money(summary: Summary) -> Money:
        return money_of(summary, _for_gpus(assumptions, att, summary))

    return money


def _choose(
    groups: dict[str, Summary],
    money: Callable[[Summary], Money],
    *,
    cause: str | None,
    page: Page,
) -> tuple[list[Summary], Summary, int]:
    """The groups of the page in order (those whose top cause is ``cause`` where given), the
    summary of every group kept, and how many were kept."""
    kept = list(groups.values())
    if cause is not None:
        kept = [s for s in kept if money(s).top_cause == cause]
    total = Summary.total_of("__total__", kept)
    return page_of(kept, page, money), total, len(kept)
