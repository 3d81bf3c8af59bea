"""A page of a report by job whose whole days are summed, chosen in the database: each job's
bounding dollars are summed there (a few columns, so the statement runs in parallel), the
walk by bounds asks for the full sums of only the jobs that could reach the page, and the
totals are summed per GPU there too. Of a month of 50,000 jobs, a page of 100 reads about
150 jobs in full."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from service.costs.money import Money
from service.costs.paging import Dollars, Page, RankKey, order_key, page_keys
from service.costs.waste import UNALLOCATED, Summary
from service.usecases.costing import day_sums


@dataclass(slots=True)
class DayPage:
    """The page's groups in order, the total of every group kept, how many groups were kept,
    and the owner fields of the page's jobs read from the day sums."""

    rows: list[Summary]
    total: Summary
    count: int
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PageReads:
    """What a page reads of the summed days before it knows its edges: each job's bounding
    dollars, and the days' total."""

    dollars: dict[str, Dollars]
    total: Summary


def page_reads(
    conn: Connection, window: day_sums.DayWindow, *, who: day_sums.Who = day_sums.EVERYONE
) -> PageReads:
    """The ``PageReads`` of ``window`` for the time ``who`` counts."""
    return PageReads(
        day_sums.read_dollars(conn, window, who=who), day_sums.read_total(conn, window, who=who)
    )


def day_page(
    conn: Connection,
    window: day_sums.DayWindow,
    *,
    edges: dict[str, Summary],
    page: Page,
    money: Callable[[Summary], Money],
    who: day_sums.Who = day_sums.EVERYONE,
    reads: PageReads | None = None,
) -> DayPage | None:
    """The ``page`` of a report by job over the summed days of ``window`` plus the groups
    ``edges`` read from finer data (taken, not copied; ``reads``: the summed days' part where
    the caller read it already, taken too); None where the page reaches the unpriced jobs or
    has no limit, which only the whole report can order."""
    if reads is None:
        reads = page_reads(conn, window, who=who)
    summed = reads.dollars
    dollars = dict(summed)
    for key, s in edges.items():
        own = Dollars.of(s)
        dollars[key] = own.plus(summed[key]) if key in summed else own
    uppers = {k: d.bounds(page.sort_by)[1] for k, d in dollars.items() if d.priced}
    if page.stop is None or page.stop >= len(uppers):
        return None
    # The totals first: the walk merges the summed days into the edges' groups.
    total = Summary.total_of("__total__", list(edges.values()))
    total.merge(reads.total)
    total.job_ids.update(k for k in summed if k != UNALLOCATED)
    out = DayPage([], total, len(dollars))
    full: dict[str, Summary] = {}

    def ranks(keys: Sequence[str]) -> dict[str, RankKey]:
        wanted = [k for k in keys if k in summed]
        # No candidate with summed days (a fleet that arrived today): nothing to read.
        read = (
            day_sums.read_days(conn, window, group_by="job", who=who, job_ids=wanted)
            if wanted
            else day_sums.DaySums()
        )
        out.jobs.update(read.jobs)
        for key in keys:
            full[key] = _joined(key, edges.get(key), read.groups.get(key))
        return {k: order_key(full[k], money(full[k]), page.sort_by) for k in keys}

    # A page's candidates are usually under 1.5 times its length: one read, seldom two.
    chosen = page_keys(uppers, page, ranks, first_batch=page.stop + page.stop // 2 + 16)
    out.rows = [full[k] for k in chosen]
    return out


def _joined(key: str, edge: Summary | None, summed: Summary | None) -> Summary:
    """One job's group: its edges' part and its summed days' part, either of which may be
    missing (both, where the cost-days job re-wrote its days between the two reads: then an
    empty group, never an error)."""
    if edge is None:
        summed = summed if summed is not None else Summary(key)
        summed.key = key
        return summed
    if summed is not None:
        edge.merge(summed)
    return edge
