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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from service.core.diagnosis import IDLE_CAUSES
from service.costs.money import FIXABLE_CAUSES, SORT_BYS, SORT_FIELDS, SORT_HOURS, Money, rank
from service.costs.waste import Summary

# A bound is trusted this much less than it says: shares are products of floats.
_MARGIN = 1e-9
# Where the idle and the fixable causes sit in a Summary's USD per cause.
IDLE_AT = tuple(c.column for c in IDLE_CAUSES)
FIXABLE_AT = tuple(c.column for c in FIXABLE_CAUSES)
RankKey = tuple[bool, float, str]  # where a group sorts: ``money.rank``


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


def order_key(summary: Summary, money: Money, sort_by: str) -> RankKey:
    """Where a group sorts: largest ``sort_by`` dollars first, unpriced last (largest
    GPU-hours first), then by key."""
    return rank(
        getattr(money, SORT_FIELDS[sort_by]), summary.key, getattr(money, SORT_HOURS[sort_by])
    )


class Dollars(NamedTuple):
    """What bounds a group's ``sort_by`` dollars before its fix shares are known: its idle
    and its fixable causes' USD, its cost in USD, and whether every held second had a price.
    (A tuple: a report by job makes one per job, tens of thousands.)"""

    idle_usd: float
    fixable_usd: float
    cost_usd: float
    priced: bool

    @classmethod
    def of(cls, summary: Summary) -> Dollars:
        """A summary's dollars."""
        usd = summary.cause_cost_usd
        return cls(
            sum(map(usd.__getitem__, IDLE_AT)),
            sum(map(usd.__getitem__, FIXABLE_AT)),
            summary.cost_usd,
            summary.priced,
        )

    def plus(self, other: Dollars) -> Dollars:
        """The dollars of two parts of one group."""
        return Dollars(
            self.idle_usd + other.idle_usd,
            self.fixable_usd + other.fixable_usd,
            self.cost_usd + other.cost_usd,
            self.priced and other.priced,
        )

    def bounds(self, sort_by: str) -> tuple[float, float]:
        """The least and most the group's ``sort_by`` dollars can be (every fix share is in
        [0, 1])."""
        if sort_by == "cost":
            return self.cost_usd, self.cost_usd
        if sort_by == "idle":
            return self.idle_usd, self.idle_usd
        if sort_by == "fixable":
            return 0.0, self.fixable_usd
        return self.idle_usd, self.idle_usd + self.fixable_usd


def bounds(summary: Summary, sort_by: str) -> tuple[float, float]:
    """The least and most a priced group's ``sort_by`` dollars can be, from its causes' dollars
    alone."""
    return Dollars.of(summary).bounds(sort_by)


def page_of(
    summaries: Sequence[Summary], page: Page, money: Callable[[Summary], Money]
) -> list[Summary]:
    """The groups of ``page`` in report order; ``money`` is called for the groups that could be
    on it (every group when the page reaches the unpriced ones, or has no limit)."""
    stop = page.stop
    priced = {s.key: s for s in summaries if s.priced}
    if stop is None or stop >= len(priced):
        ranked = sorted(summaries, key=lambda s: order_key(s, money(s), page.sort_by))
        return ranked[page.offset : stop]

    def ranks(keys: Sequence[str]) -> dict[str, RankKey]:
        return {k: order_key(priced[k], money(priced[k]), page.sort_by) for k in keys}

    uppers = {k: bounds(s, page.sort_by)[1] for k, s in priced.items()}
    return [priced[k] for k in page_keys(uppers, page, ranks, first_batch=1)]


def page_keys(
    uppers: Mapping[str, float],
    page: Page,
    ranks: Callable[[Sequence[str]], Mapping[str, RankKey]],
    *,
    first_batch: int,
) -> list[str]:
    """The keys of ``page`` among priced groups whose ``sort_by`` dollars are at most
    ``uppers``, in report order. ``ranks`` gives the order keys of a batch of groups, asked
    for in order of their upper bound, the first ``first_batch`` at once and then batches
    twice as large each time, until no group left can reach the page (the page must end
    before the last priced group: ``page.stop < len(uppers)``)."""
    stop = page.stop
    if stop is None or stop >= len(uppers):
        raise ValueError("a walk by bounds needs a page that ends before the last priced group")
    if stop == 0:
        return []
    order = sorted(uppers, key=lambda k: -uppers[k])
    top: list[float] = []  # the ``stop`` largest values seen, smallest first
    seen: list[tuple[RankKey, str]] = []
    batch, i = max(1, first_batch), 0
    while i < len(order):
        chunk = order[i : i + batch]
        i, batch = i + batch, 2 * batch
        if _full_above(top, stop, uppers[chunk[0]]):
            break
        got = ranks(chunk)
        for key in chunk:
            if _full_above(top, stop, uppers[key]):
                i = len(order)
                break
            seen.append((got[key], key))
            value = -got[key][1]
            if len(top) < stop:
                heapq.heappush(top, value)
            elif value > top[0]:
                heapq.heapreplace(top, value)
    seen.sort()
    return [key for _, key in seen[page.offset : stop]]


def _full_above(top: list[float], stop: int, upper: float) -> bool:
    """Whether the page's ``stop`` places are all held by values above ``upper``."""
    return len(top) == stop and upper < top[0] - _MARGIN * max(1.0, abs(top[0]))
