"""The one door to the money: the dollars of some jobs or GPUs over [start, end), read from
whichever source answers them (day sums for whole days that are summed and current, today's
sums so far, minute rollups and raw samples at the edges); no caller chooses the source.

The cost report, the fleet page, job verdicts (alerts and ladder steps), job pages and the
periodic reports all read through ``dollars``; only the day sums' own writer
(``cost_days``) calls ``attribute`` directly, since it makes one of the sources.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Connection

from service.core.buckets import ceil_day, floor_day
from service.costs.money import Money
from service.costs.paging import Page
from service.costs.waste import Line, Summary
from service.db import shared_snapshot
from service.db.costing import costs_repo
from service.settings import Settings
from service.usecases.costing import day_sums as day_sums_mod
from service.usecases.costing import report_pages
from service.usecases.costing.attribution import Attribution, attribute, unpriced_warning
from service.usecases.costing.day_sums import EVERYONE
from service.usecases.costing.day_sums import Who as Who  # the door's own: callers import it here
from service.usecases.price_table import effective_prices

# How the seconds at a share's edges are read: from raw samples while raw retention holds them
# ("raw"), pro rata from their 1m bucket ("minute"), or raw while few spans have such an edge
# ("auto", ``report_raw_edge_spans``).
EdgeRule = Literal["raw", "minute", "auto"]
Source = Literal["day_sums", "finer"]
_RAW_EDGES: dict[EdgeRule, bool | None] = {"raw": True, "minute": False, "auto": None}


@dataclass(frozen=True, slots=True)
class ReadPath:
    """A forced way of reading, for benchmarks and tests only: ``edges`` over the query's own
    rule where given, no day sums without ``day_sums`` (every second from finer data), and no
    seconds per cause summed without ``causes`` (they read 0; finer data only)."""

    edges: EdgeRule | None = None
    day_sums: bool = True
    causes: bool = True


_PLAIN = ReadPath()
_FORCED: ContextVar[ReadPath | None] = ContextVar("costing_read_path", default=None)


@contextmanager
def forced(path: ReadPath) -> Iterator[None]:
    """Read every query inside the block by ``path`` (a benchmark's or test's switch)."""
    token = _FORCED.set(path)
    try:
        yield
    finally:
        _FORCED.reset(token)


@dataclass(frozen=True, slots=True)
class DollarsQuery:
    """The dollars of the GPUs ``gpu_ids`` (every GPU without) over [start, end), of the time
    ``who`` counts, with edges read as ``edges`` says and, with ``cause_energy``, the energy
    per cause summed too. ``days_by``: the grouping the caller will read the summed days by
    (``DollarsRead.summed``); ``page_ahead``: the caller will choose a page by job from them
    (``DollarsRead.summed_page``); either is read beside the finer data where the database
    allows."""

    start: datetime
    end: datetime
    gpu_ids: tuple[int, ...] | None = None
    who: Who = EVERYONE
    edges: EdgeRule = "auto"
    cause_energy: bool = False
    days_by: str | None = None
    page_ahead: bool = False


@dataclass(frozen=True, slots=True)
class SourcePlan:
    """Which source answers which part of a window: the days [start, end) of ``days`` from the
    day sums (None: none), each part of ``finer`` (start, end, GPU ids or None for all) from
    rollups, tenant rows and raw edges; the window ends at ``end`` (today's sums' end where
    the report reads them, else the end asked)."""

    days: tuple[datetime, datetime] | None
    finer: tuple[tuple[datetime, datetime, tuple[int, ...] | None], ...]
    end: datetime

    def source_of(self, at: datetime) -> Source:
        """The source of the instant ``at`` for a GPU not excluded from the days."""
        if self.days is not None and self.days[0] <= at < self.days[1]:
            return "day_sums"
        return "finer"


def may_read_sums(start: datetime, end: datetime, now: datetime) -> bool:
    """Whether a window may read any day sums: it holds a whole UTC day before now, or it
    reaches today from midnight (today's sums so far)."""
    return (
        day_sums_mod.whole_days(start, min(end, now)) is not None or start <= floor_day(now) <= end
    )


def plan_sources(
    start: datetime,
    end: datetime,
    now: datetime,
    *,
    sums_until: datetime | None,
    stale: frozenset[int] = frozenset(),
) -> SourcePlan:
    """The plan of [start, end) at ``now``: whole days from the sums (and today up to
    ``sums_until``, where today's sums so far are current and the window reaches them), their
    edges from finer data, and the ``stale`` GPUs' days from finer data too."""
    days: tuple[datetime, datetime] | None
    if sums_until is not None:
        end, days = sums_until, (ceil_day(start), sums_until)
    else:
        days = day_sums_mod.whole_days(start, min(end, now))
    if days is None:
        return SourcePlan(None, ((start, end, None),), end)
    d0, d1 = days
    parts: list[tuple[datetime, datetime, tuple[int, ...] | None]] = [
        (start, d0, None),
        (d1, end, None),
    ]
    if stale:
        parts.append((d0, d1, tuple(sorted(stale))))
    return SourcePlan(days, tuple((a, b, ids) for a, b, ids in parts if a < min(b, now)), end)


@dataclass(slots=True)
class DollarsRead:
    """A query's dollars: the lines read from finer data (``attribution``), and the summed
    days (``window``, None where none was read), which ``summed``, ``summed_page`` and
    ``summed_team_gpus`` read grouped in the database."""

    query: DollarsQuery
    attribution: Attribution
    window: day_sums_mod.DayWindow | None
    # The summed days read beside the finer data, by grouping (``DollarsQuery.days_by``),
    # and a page's first reads of them (``DollarsQuery.page_ahead``).
    ahead: dict[str, day_sums_mod.DaySums] = field(default_factory=dict)
    page_ahead: report_pages.PageReads | None = None

    @property
    def sums_end(self) -> datetime | None:
        """Where today's sums end, when the figures end there instead of the end asked."""
        return None if self.window is None else self.window.report_end

    @property
    def end(self) -> datetime:
        """Where the figures end: today's sums' end, or the end asked."""
        return self.sums_end or self.query.end

    def lines(self) -> list[Line]:
        """The finer data's lines of the time the query's ``who`` counts."""
        att, who = self.attribution, self.query.who
        if who.everyone:
            return [ln for ln in att.lines if ln.job_id is not None] if who.jobs_only else att.lines

        def keep(line: Line) -> bool:
            if line.job_id is None:
                return False
            job = att.jobs.get(line.job_id, {})
            return (
                (who.user is None or job.get("user") == who.user)
                and (who.team is None or job.get("team") == who.team)
                and (who.scope is None or who.scope.allows(job.get("user"), job.get("team")))
            )

        return [ln for ln in att.lines if keep(ln)]

    def summed(self, conn: Connection, *, group_by: str) -> day_sums_mod.DaySums:
        """The summed days grouped by ``group_by`` (empty where none were read)."""
        if self.window is None:
            return day_sums_mod.DaySums()
        # Read ahead once: the report takes its summaries without copying them.
        ahead = self.ahead.pop(group_by, None)
        if ahead is not None:
            return ahead
        return day_sums_mod.read_days(conn, self.window, group_by=group_by, who=self.query.who)

    def summed_page(
        self,
        conn: Connection,
        *,
        edges: dict[str, Summary],
        page: Page,
        money: Callable[[Summary], Money],
    ) -> report_pages.DayPage | None:
        """A report page by job chosen in the database (``report_pages.day_page``): None where
        no days were read, or only the whole report can order the page."""
        if self.window is None:
            return None
        reads, self.page_ahead = self.page_ahead, None  # taken once, as the days' groups
        return report_pages.day_page(
            conn, self.window, edges=edges, page=page, money=money, who=self.query.who,
            reads=reads,
        )  # fmt: skip

    def summed_team_gpus(self, conn: Connection) -> dict[tuple[str, int], Summary]:
        """The summed days per (team, GPU id) of the jobs with a team (none: empty)."""
        return {} if self.window is None else day_sums_mod.read_team_gpus(conn, self.window)


def dollars(
    conn: Connection, query: DollarsQuery, *, settings: Settings, now: datetime
) -> DollarsRead:
    """The dollars ``query`` asks for at ``now``, each part from the source that answers it:
    a window of every GPU reads the days of every GPU whose days are all summed and current
    (``day_sums.stale_in``) from the day sums, and today from today's sums where they are
    current and the window reaches them (the window then ends where they do); the days'
    edges, the other GPUs' days, and any query of chosen GPUs read finer data."""
    path = _FORCED.get() or _PLAIN
    raw_edges = _RAW_EDGES[path.edges or query.edges]
    start, asked_end = query.start, query.end
    basis = None
    whole_fleet = query.gpu_ids is None and path.day_sums and path.causes
    if whole_fleet and may_read_sums(start, asked_end, now):
        basis = day_sums_mod.basis_of(effective_prices(conn, settings).rows, settings)
    if basis is None:
        gpu_ids = None if query.gpu_ids is None else list(query.gpu_ids)
        att = attribute(
            conn, settings=settings, start=start, end=asked_end, now=now, raw_edges=raw_edges,
            gpu_ids=gpu_ids, causes=path.causes, cause_energy=query.cause_energy,
        )  # fmt: skip
        return DollarsRead(query, att, None)
    until = day_sums_mod.today_until(
        conn, start=start, end=asked_end, now=now, basis=basis, settings=settings
    )
    plan = plan_sources(start, asked_end, now, sums_until=until)
    if plan.days is None:
        att = attribute(
            conn, settings=settings, start=start, end=asked_end, now=now, raw_edges=raw_edges
        )
        return DollarsRead(query, att, None)
    d0, d1 = plan.days
    gpus = costs_repo.load_gpus(conn)
    with _beside(conn) as beside:
        # Where each GPU's rollups end (a statement per GPU), read beside the days' check.
        rolled = beside(costs_repo.rolled_until, gpu_ids=None) if len(plan.finer) > 1 else None
        stale, unpriced = day_sums_mod.stale_in(conn, gpus=gpus, start=d0, end=d1, basis=basis)
        if len(stale) >= len(gpus):
            att = attribute(
                conn, settings=settings, start=start, end=asked_end, now=now,
                raw_edges=raw_edges, gpu_info=gpus,
            )  # fmt: skip
            return DollarsRead(query, att, None)
        window = day_sums_mod.DayWindow(d0, d1, frozenset(stale))
        plan = plan_sources(start, asked_end, now, sums_until=until, stale=frozenset(stale))
        # The summed days the caller will read, read beside the finer data (where there is
        # none, a second connection would only add its round trips).
        by = query.days_by if plan.finer else None
        ahead = {} if by is None else {
            by: beside(day_sums_mod.read_days, window, group_by=by, who=query.who)
        }  # fmt: skip
        page = (
            beside(report_pages.page_reads, window, who=query.who)
            if query.page_ahead and plan.finer
            else None
        )
        att = _merged(conn, plan, gpus, unpriced, stale, settings=settings, now=now,
                      raw_edges=raw_edges, rolled=rolled.result() if rolled else None)  # fmt: skip
    days = {k: f.result() for k, f in ahead.items()}
    return DollarsRead(query, att, window, days, page.result() if page else None)


Beside = Callable[..., "Future[Any]"]


@contextmanager
def _beside(conn: Connection) -> Iterator[Beside]:
    """A way to run reads ``fn(connection, *args, **kwargs)`` beside the caller's: on
    PostgreSQL in order on a connection of their own that reads ``conn``'s snapshot, while the
    caller reads on; elsewhere (SQLite: a second connection to one file measured slower) at
    once on ``conn``. Their futures are done when the block ends."""
    if conn.dialect.name != "postgresql":

        def at_once(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
            done: Future[Any] = Future()
            done.set_result(fn(conn, *args, **kwargs))
            return done

        yield at_once
        return
    with ExitStack() as stack:
        opened: list[tuple[Connection, ThreadPoolExecutor]] = []  # at the first read, if any

        def submit(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
            if not opened:
                # The snapshot is shared here, on the caller's thread: a connection is never
                # used by two threads at once. The thread ends before the connection closes.
                other = stack.enter_context(shared_snapshot.connect_beside(conn))
                opened.append((other, stack.enter_context(ThreadPoolExecutor(1))))
            other, thread = opened[0]
            return thread.submit(fn, other, *args, **kwargs)

        yield submit


def _merged(
    conn: Connection,
    plan: SourcePlan,
    gpus: dict[int, costs_repo.GpuInfo],
    unpriced: set[int],
    stale: set[int],
    *,
    settings: Settings,
    now: datetime,
    raw_edges: bool | None,
    rolled: dict[int, datetime | None] | None = None,
) -> Attribution:
    """The finer data of every part of ``plan``, as one Attribution (``rolled``: every GPU's
    ``costs_repo.rolled_until``, where the caller read it already)."""
    if rolled is None and len(plan.finer) > 1:
        # Where the rollups of each GPU end: read once for every part (a statement per GPU).
        rolled = costs_repo.rolled_until(conn, gpu_ids=None)
    atts = [
        attribute(
            conn, settings=settings, start=a, end=b, now=now, raw_edges=raw_edges,
            gpu_ids=None if ids is None else list(ids), gpu_info=gpus, rolled=rolled,
        )
        for a, b, ids in plan.finer
    ]  # fmt: skip
    warnings = {w for att in atts for w in att.warnings}
    if not atts or atts[0].price_source != "none":
        warnings |= {
            unpriced_warning(gpus[g].model) for g in unpriced if g in gpus and g not in stale
        }
    return Attribution(
        [line for att in atts for line in att.lines],
        gpus,
        {k: v for att in atts for k, v in att.jobs.items()},
        sorted(warnings),
        atts[0].price_source if atts else effective_prices(conn, settings).source,
        {rule for att in atts for rule in att.split_rules},
    )


def summed_until(conn: Connection, *, settings: Settings, now: datetime) -> datetime | None:
    """Where the dollars of today from midnight to ``now`` end when today's sums so far answer
    them (``day_sums.today_until``); None where finer data does."""
    start = floor_day(now)
    if not may_read_sums(start, now, now):
        return None
    basis = day_sums_mod.basis_of(effective_prices(conn, settings).rows, settings)
    return day_sums_mod.today_until(
        conn, start=start, end=now, now=now, basis=basis, settings=settings
    )


def add_days(
    groups: dict[str, Summary], days: day_sums_mod.DaySums, att: Attribution, group_by: str
) -> None:
    """Merge the summed days (grouped already, or per GPU for hardware) into ``groups``."""
    pieces = list(days.groups.items())
    for gpu_id, summary in days.by_gpu.items():
        info = att.gpus[gpu_id]
        pieces.append(({"node": info.node, "gpu_model": info.model}.get(group_by, info.uuid),
                       summary))  # fmt: skip
    for key, summary in pieces:
        group = groups.get(key)
        if group is None:
            # The day sums are read for this report alone: taken as they are, not copied.
            summary.key = key
            groups[key] = summary
        else:
            group.merge(summary)
