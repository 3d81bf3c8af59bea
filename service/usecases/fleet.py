"""The fleet now, as the console's first page shows it: every GPU with its dollars of today."""

from __future__ import annotations

import difflib
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Connection

from service.core.buckets import floor_day
from service.core.diagnosis import (
    CAUSE_BY_NAME,
    CAUSE_NAMES,
    FIXABLE_CAUSES,
    STATE_NAMES,
    Cause,
    Decision,
    GpuState,
    Rung,
    gpu_state,
)
from service.costs.assumptions import fix_assumptions_of
from service.costs.money import SORT_FIELDS, SORT_HOURS, money_of, sample_waste_share
from service.costs.recommend import FixAssumptions, with_model
from service.costs.waste import Summary, summarize
from service.db import gpus_repo, jobs_repo
from service.db.rows import GpuHeld, GpuIndexRow
from service.errors import ValidationFailed
from service.settings import Settings
from service.usecases.costing.dollars import DollarsQuery, add_days, dollars, summed_until

# The money figures the fleet shows per GPU and sums over the fleet.
# A GPU row with the fields a fleet view states it by, and any row of a page.
HeldT = TypeVar("HeldT", bound=GpuHeld)
RowT = TypeVar("RowT")

GPU_MONEY: tuple[str, ...] = (
    "cost_usd", "waste_usd", "idle_usd", "fixable_usd", "lost_usd",
    "held_gpu_hours", "waste_gpu_hours",
)  # fmt: skip
FLEET_MONEY: tuple[str, ...] = (*GPU_MONEY, "nodata_usd")
# Past this many GPUs a fleet answer reads every GPU's row rather than bind each id.
PAGE_BY_IDS_MAX = 1000


@dataclass(frozen=True, slots=True)
class WastedToday:
    """Each GPU's money figures from ``day_start`` to ``until`` (now, or where today's sums
    end: ``from_sums``; USD, None: unpriced), and how priced; ``by_team`` the same per team,
    of the team's jobs' time only."""

    day_start: datetime
    until: datetime
    by_uuid: dict[str, dict[str, float | None]]
    price_source: str
    warnings: list[str]
    by_team: dict[str, dict[str, dict[str, float | None]]] = field(default_factory=dict)
    from_sums: bool = False


@dataclass
class WastedTodayCache:
    """The last WastedToday, reused within the same day: figures read from today's sums while a
    report would still read those sums (their end at most ``sums_lag_seconds`` before now),
    others for ``max_age_seconds`` (monotonic).

    The dollars come from rollups that move every rollup interval, or from today's sums that
    move once a cost-days round; ``refresh_wasted_today`` reads the new sums as they land, and
    the finer figures again each interval while pages ask within ``watched_seconds``, so no
    page waits for the fleet's money (1-1.5 s at 10,000 GPUs).
    """

    max_age_seconds: float
    sums_lag_seconds: float = 0.0
    watched_seconds: float = 0.0
    _entry: tuple[float, WastedToday] | None = None
    _asked: float | None = None  # when a page last asked (monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, day_start: datetime, now: datetime) -> WastedToday | None:
        """The cached figures of ``day_start`` if fresh enough at ``now``, else None."""
        self._asked = time.monotonic()
        entry = self._entry
        if entry is None or entry[1].day_start != day_start:
            return None
        made, value = entry
        if value.from_sums and (now - value.until).total_seconds() <= self.sums_lag_seconds:
            return value
        return value if time.monotonic() - made < self.max_age_seconds else None

    def watched(self) -> bool:
        """Whether a page asked for the figures within ``watched_seconds``."""
        asked = self._asked
        return asked is not None and time.monotonic() - asked <= self.watched_seconds

    def latest(self) -> WastedToday | None:
        """The figures last kept, however old."""
        entry = self._entry
        return None if entry is None else entry[1]

    def put(self, value: WastedToday) -> None:
        """Keep ``value`` as the latest figures."""
        with self._lock:
            self._entry = (time.monotonic(), value)


def wasted_today(conn: Connection, *, settings: Settings, now: datetime) -> WastedToday:
    """Each GPU's cost, waste, idle, fixable, nodata and lost USD since midnight UTC: the cost
    report's figures grouped by GPU (whole 1m buckets at the job edges, as long reports read
    them), through ``until``: now, or where today's sums end when the report reads them."""
    day_start = floor_day(now)
    read = dollars(conn, DollarsQuery(day_start, now, edges="minute"), settings=settings, now=now)
    att = read.attribution
    by_gpu = summarize(att.lines, lambda line: att.gpus[line.gpu_id].uuid, jobs_only=False)
    team_of = {job_id: job.get("team") for job_id, job in att.jobs.items()}
    teams_lines = [ln for ln in att.lines if ln.job_id is not None and team_of.get(ln.job_id)]
    by_team_gpu = summarize(
        teams_lines, lambda ln: f"{team_of[ln.job_id or '']}\0{att.gpus[ln.gpu_id].uuid}"
    )
    if read.window is not None:
        add_days(by_gpu, read.summed(conn, group_by="gpu"), att, "gpu")
        for (team, gpu_id), summed in read.summed_team_gpus(conn).items():
            key = f"{team}\0{att.gpus[gpu_id].uuid}"
            if key in by_team_gpu:
                by_team_gpu[key].merge(summed)
            else:
                by_team_gpu[key] = summed
    a = fix_assumptions_of(settings)

    def money(s: Summary) -> dict[str, float | None]:
        m = money_of(s, with_model(a, [att.gpus[g].model for g in s.gpu_ids]))
        return {name: getattr(m, name) for name in FLEET_MONEY}

    by_team: dict[str, dict[str, dict[str, float | None]]] = {}
    for key, s in by_team_gpu.items():
        team, uuid = key.split("\0", 1)
        by_team.setdefault(team, {})[uuid] = money(s)
    until = read.sums_end
    return WastedToday(
        day_start,
        until or now,
        {uuid: money(s) for uuid, s in by_gpu.items()},
        att.price_source,
        att.warnings,
        by_team,
        from_sums=until is not None,
    )


def refresh_wasted_today(
    conn: Connection, *, settings: Settings, now: datetime, cache: WastedTodayCache
) -> bool:
    """Read the fleet's dollars of today into ``cache`` when today's sums end past those kept,
    or, where no sums answer them, while pages ask for them (``cache.watched``: a page then
    finds them read at most an interval ago instead of reading them itself); True if it read
    them."""
    end = summed_until(conn, settings=settings, now=now)
    kept = cache.latest()
    if end is None:
        if not cache.watched():
            return False
    elif kept is not None and kept.from_sums and kept.until == end:
        return False
    cache.put(wasted_today(conn, settings=settings, now=now))
    return True


def with_states(
    conn: Connection, gpus: list[HeldT], *, now: datetime, settings: Settings
) -> list[HeldT]:
    """The GPUs (as ``gpus_repo.list_gpus`` or ``fleet_index`` has them), each with its
    ``state`` now; a busy GPU whose fix would recover a large share of its time (its latest
    sample's own signal) is ``underused``, not ``working`` (``diagnosis.gpu_state``)."""
    fixable: list[Mapping[str, Any]] = [
        g for g in gpus if g["cause"] is not None and CAUSE_BY_NAME[g["cause"]] in FIXABLE_CAUSES
    ]
    ids = [g["gpu_id"] for g in fixable if "latest" not in g and "gpu_id" in g]
    signals = gpus_repo.latest_signals(conn, gpu_ids=ids) if ids else {}
    a = fix_assumptions_of(settings)
    for gpu in gpus:
        seen = gpu["last_seen_at"]
        cause = None if gpu["cause"] is None else CAUSE_BY_NAME[gpu["cause"]]
        gpu["state"] = gpu_state(
            cause=cause,
            lost=gpu["lost"],
            age_seconds=None if seen is None else (now - seen).total_seconds(),
            fixable_share=_fixable_share(gpu, cause, signals, a),
        ).value
    return gpus


def _fixable_share(
    gpu: Mapping[str, Any],
    cause: Cause | None,
    signals: Mapping[int, gpus_repo.LatestSignals],
    a: FixAssumptions,
) -> float | None:
    """The share of the latest sample's time its fix would recover, for a cause of
    FIXABLE_CAUSES (None: another cause, or the sample's signals are not at hand)."""
    if cause not in FIXABLE_CAUSES:
        return None
    if "latest" in gpu:  # a full row: the latest sample's values are in it
        if gpu["activity"] is None or gpu["activity_rung"] is None:
            return None
        rung = Rung[gpu["activity_rung"].upper()]
        decision = Decision(gpu["activity"], rung, cause)
        return sample_waste_share(decision, gpu["latest"], gpu["model"], a)
    got = signals.get(gpu.get("gpu_id", -1))
    if got is None:
        return None
    return sample_waste_share(got.decision, got.values, gpu["model"], a)


def nearest(value: str, known: Sequence[str]) -> str:
    """What an unknown name's error adds: the closest known name, or the known names."""
    close = difflib.get_close_matches(value, known, n=1, cutoff=0.5)
    if close:
        return f"; did you mean {close[0]!r}?"
    if not known:
        return "; none is known yet"
    shown = ", ".join(sorted(known)[:8])
    return f"; known: {shown}" + (", ..." if len(known) > 8 else "")


@dataclass(frozen=True, slots=True)
class FleetFilter:
    """Which GPUs a fleet view shows: a node's, a model's, a team's (held today or now), a
    user's (held now), those in a state, those whose latest sample has a cause."""

    node: str | None = None
    model: str | None = None
    team: str | None = None
    user: str | None = None
    state: str | None = None
    cause: str | None = None


def _check_filter(conn: Connection, f: FleetFilter, gpus: list[GpuIndexRow]) -> None:
    """ValidationFailed naming the filter and the nearest known value, for a name not known."""
    if f.state is not None and f.state not in STATE_NAMES:
        raise ValidationFailed(
            "state", f"unknown state {f.state!r}" + nearest(f.state, STATE_NAMES)
        )
    if f.cause is not None and f.cause not in CAUSE_NAMES:
        raise ValidationFailed(
            "cause", f"unknown cause {f.cause!r}" + nearest(f.cause, CAUSE_NAMES)
        )
    nodes = sorted({g["node"] for g in gpus})
    if f.node is not None and f.node not in nodes:
        raise ValidationFailed("node", f"no GPU on node {f.node!r}" + nearest(f.node, nodes))
    models = sorted({g["model"] for g in gpus})
    if f.model is not None and f.model not in models:
        raise ValidationFailed("model", f"no GPU of model {f.model!r}" + nearest(f.model, models))
    if f.team is not None:
        # Read only when asked: every job's distinct team is no cost a plain page should pay.
        teams = jobs_repo.team_names(conn)
        if f.team not in teams:
            raise ValidationFailed("team", f"no job of team {f.team!r}" + nearest(f.team, teams))


def _shown(gpu: GpuIndexRow, f: FleetFilter, team_usd: dict[str, Any]) -> bool:
    return (
        (f.node is None or gpu["node"] == f.node)
        and (f.model is None or gpu["model"] == f.model)
        and (f.team is None or gpu["uuid"] in team_usd or gpu["team"] == f.team)
        and (f.user is None or gpu["user"] == f.user)
        and (f.state is None or gpu["state"] == f.state)
        and (f.cause is None or (gpu["cause"] == f.cause and gpu["state"] != GpuState.NO_DATA))
    )


@dataclass(frozen=True, slots=True)
class FleetPage:
    """Which GPUs of the sorted view a fleet answer carries in full: from ``offset``, at most
    ``limit`` (all without)."""

    offset: int = 0
    limit: int | None = None

    def of(self, rows: list[RowT]) -> list[RowT]:
        """The page's part of ``rows``."""
        return rows[self.offset :] if self.limit is None else rows[self.offset :][: self.limit]


def fleet_now(
    conn: Connection,
    *,
    settings: Settings,
    now: datetime,
    cache: WastedTodayCache | None = None,
    only: FleetFilter | None = None,
    sort_by: str = "waste",
    page: FleetPage | None = None,
) -> dict[str, Any]:
    """The GPUs ``only`` lets through (a team's dollars then only its jobs'), largest
    ``sort_by`` dollars of today first: counted per state and summed over all of them, and
    the ``page`` of them in full (as ``GET /gpus`` has them, with state and dollars), with the
    whole fleet's nodes, models and teams to filter by. ValidationFailed for a node, model,
    team, state or cause not known."""
    f = only or FleetFilter()
    p = page or FleetPage()
    day_start = floor_day(now)
    wasted = cache.get(day_start, now) if cache is not None else None
    if wasted is None:
        wasted = wasted_today(conn, settings=settings, now=now)
        if cache is not None:
            cache.put(wasted)
    skew = settings.ingest_max_future_seconds
    # Filter, sort and sum over the light index; read only the page's GPUs in full.
    every = with_states(
        conn,
        gpus_repo.fleet_index(conn, now=now, start_skew_seconds=skew),
        now=now,
        settings=settings,
    )
    _check_filter(conn, f, every)
    usd = wasted.by_uuid if f.team is None else wasted.by_team.get(f.team, {})
    shown = [g for g in every if _shown(g, f, usd)]
    # A team's view counts a GPU none of its jobs held today as 0 dollars, not unpriced.
    no_figures: dict[str, float | None] = dict.fromkeys(GPU_MONEY, None if f.team is None else 0.0)
    field, hours = SORT_FIELDS[sort_by], SORT_HOURS[sort_by]
    rank = {name: i for i, name in enumerate(STATE_NAMES)}

    def order(g: GpuIndexRow) -> tuple[bool, float, int]:
        figures = usd.get(g["uuid"], no_figures)
        value = figures.get(field)
        if value is None:  # unpriced (a site without prices): by GPU-hours, after the priced
            return (True, -(figures.get(hours) or 0.0), rank[g["state"]])
        return (False, -value, rank[g["state"]])

    # Stable: GPUs of equal dollars go worst state first, then in node and index order.
    shown.sort(key=order)
    chosen = [
        g | {n: usd.get(g["uuid"], no_figures).get(n) for n in GPU_MONEY} for g in p.of(shown)
    ]
    totals: dict[str, float | None] = {**_summed(usd[g["uuid"]] for g in shown if g["uuid"] in usd)}
    if wasted.price_source == "none":  # no prices: the fleet's dollars are null, never $0
        totals.update(dict.fromkeys((n for n in FLEET_MONEY if n.endswith("_usd")), None))
    return {
        "start": day_start,
        "now": now,
        "dollars_until": wasted.until,
        "sort": sort_by,
        "gpu_count": len(shown),
        "fleet_gpu_count": len(every),
        "offset": p.offset,
        "limit": p.limit,
        "state_counts": dict.fromkeys(STATE_NAMES, 0) | Counter(g["state"] for g in shown),
        "gpus": _in_full(conn, chosen, now=now, start_skew_seconds=skew),
        **totals,
        "choices": {
            "node": sorted({g["node"] for g in every}),
            "model": sorted({g["model"] for g in every}),
            "team": sorted({g["team"] for g in every if g["team"]} | set(wasted.by_team)),
        },
        "price_source": wasted.price_source,
        "warnings": wasted.warnings,
    }


def _summed(figures: Iterable[dict[str, float | None]]) -> dict[str, float]:
    """The ``FLEET_MONEY`` dollars summed over GPUs' ``figures`` (a missing one counts 0)."""
    totals = dict.fromkeys(FLEET_MONEY, 0.0)
    for one in figures:
        for name in FLEET_MONEY:
            totals[name] += one.get(name) or 0.0
    return totals


def _in_full(
    conn: Connection, chosen: list[dict[str, Any]], *, now: datetime, start_skew_seconds: float
) -> list[dict[str, Any]]:
    """The ``chosen`` index rows, in their order, as ``gpus_repo.list_gpus`` has them, with the
    state and dollars the index rows carry."""
    if not chosen:
        return []
    # A page is read by its ids; a view of many GPUs (the CLI's whole fleet) in one scan, not
    # with thousands of bound ids.
    ids = [g["gpu_id"] for g in chosen] if len(chosen) <= PAGE_BY_IDS_MAX else None
    full = {
        g["uuid"]: g
        for g in gpus_repo.list_gpus(
            conn, now=now, start_skew_seconds=start_skew_seconds, gpu_ids=ids
        )
    }
    out = []
    for g in chosen:
        row = full.get(g["uuid"])
        if row is None:  # the index and the rows are read in one snapshot: cannot happen
            continue
        row["state"] = g["state"]
        out.append(row | {name: g[name] for name in GPU_MONEY})
    return out
