"""A page of a report's groups in the order the report lists them (largest ``sort_by`` dollars
first, unpriced last, then by key), working out a group's money only where it could be on the
page.

Pure. Sorting by waste or fixable dollars needs each group's fix shares, the costly part of a
report by job (tens of thousands of rows). Every share is in [0, 1], so a group's waste lies
between its idle dollars and its idle plus fixable causes' dollars: groups are visited by that
upper bound, and once the page's last place is held by a value above every bound still to
visit, no later group can reach the page.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from service.core.diagnosis import IDLE_CAUSES
from service.costs.money import FIXABLE_CAUSES, SORT_BYS, SORT_FIELDS, Money, rank
from service.costs.waste import Summary

# A bound is trusted this much less than it says: shares are products of floats.
_MARGIN = 1e-9
# Where the idle and the fixable causes sit in a Summary's USD per cause.
_IDLE_AT = tuple(int(c) - 1 for c in IDLE_CAUSES)
_FIXABLE_AT = tuple(int(c) - 1 for c in FIXABLE_CAUSES)


@dataclass(frozen=True, slots=True)
class Page:
    """Which rows of a report: [offset, offset + limit) in ``sort_by`` order (to the end
    without ``limit``)."""

    sort_by: str = "waste"
    offset: int = 0
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.sort_by not in SORT_BYS:
            raise ValueError(f"sort_by {self.sort_by!r} is not one of {SORT_BYS}")
        if self.offset < 0 or (self.limit is not None and self.limit < 0):
            raise ValueError("offset and limit are counts: 0 or more")

    @property
    def stop(self) -> int | None:
        """The index after the page's last row; None without a limit."""
        return None if self.limit is None else self.offset + self.limit


def order_key(summary: Summary, money: Money, sort_by: str) -> tuple[bool, float, str]:
    """Where a group sorts: largest ``sort_by`` dollars first, unpriced last, then by key."""
    return rank(getattr(money, SORT_FIELDS[sort_by]), summary.key)


def bounds(summary: Summary, sort_by: str) -> tuple[float, float]:
    """The least and most a priced group's ``sort_by`` dollars can be, from its causes' dollars
    alone (every fix share is in [0, 1])."""
    usd = summary.cause_cost_usd
    idle = sum(map(usd.__getitem__, _IDLE_AT))
    fixable = sum(map(usd.__getitem__, _FIXABLE_AT))
    if sort_by == "cost":
        return summary.cost_usd, summary.cost_usd
    if sort_by == "idle":
        return idle, idle
    if sort_by == "fixable":
        return 0.0, fixable
    return idle, idle + fixable


def page_of(
    summaries: Sequence[Summary], page: Page, money: Callable[[Summary], Money]
) -> list[Summary]:
    """The groups of ``page`` in report order; ``money`` is called for the groups that could be
    on it (every group when the page reaches the unpriced ones, or has no limit)."""
    stop = page.stop
    priced = [s for s in summaries if s.priced]
    if stop is None or stop >= len(priced):
        ranked = sorted(summaries, key=lambda s: order_key(s, money(s), page.sort_by))
        return ranked[page.offset : stop]
    if stop == 0:
        return []
    candidates = _candidates(priced, page.sort_by, stop, money)
    candidates.sort(key=lambda pair: pair[0])
    return [s for _, s in candidates[page.offset : stop]]


def _candidates(
    priced: Sequence[Summary], sort_by: str, stop: int, money: Callable[[Summary], Money]
) -> list[tuple[tuple[bool, float, str], Summary]]:
    """The priced groups that could be among the first ``stop``, each with its order key."""
    by_upper = sorted(((bounds(s, sort_by)[1], s) for s in priced), key=lambda p: -p[0])
    top: list[float] = []  # the ``stop`` largest values seen, smallest first
    out = []
    for upper, summary in by_upper:
        if len(top) == stop and upper < top[0] - _MARGIN * max(1.0, abs(top[0])):
            break
        key = order_key(summary, money(summary), sort_by)
        out.append((key, summary))
        value = -key[1]
        if len(top) < stop:
            heapq.heappush(top, value)
        elif value > top[0]:
            heapq.heapreplace(top, value)
    return out
