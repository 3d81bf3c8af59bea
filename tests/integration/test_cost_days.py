"""Cost day sums: a report reading whole days from cost_job_1d / cost_gpu_1d says what the same
report reading every second from the rollups says, to the cent, for random jobs, shared GPUs,
price changes, late data and owner changes; and a day that goes stale is read from finer data
until the cost-days job has written it again."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, delete, func, select, update

from service.api.app import create_app
from service.core.buckets import DAY, ceil_day, floor_day
from service.costs.prices import PriceRow
from service.costs.waste import UNALLOCATED, summarize
from service.db import jobs_repo, prices_repo
from service.db.costing import costs_repo
from service.db.schema import (
    cost_day_dirty,
    cost_gpu_1d,
    cost_job_1d,
    cost_job_day_1d,
    gpus,
    jobs,
    rollup_dirty,
    shared_1h,
    tenant_1d,
    tenant_1h,
    tenant_1m,
)
from service.roles import JobScope
from service.settings import Settings
from service.usecases import fleet, price_table
from service.usecases.costing import cost_days, cost_report, day_sums, report_pages
from service.usecases.costing.dollars import DollarsQuery, ReadPath, dollars, forced
from tests.conftest import make_token, truncate_all
from tests.integration.cost_data import GIB, roll_up, store_series
from tests.support import FakeClock, live_server

START = datetime(2026, 11, 27, 18, 0, tzinfo=UTC)  # three whole days, Nov 28-30, and edges
END = datetime(2026, 12, 1, 6, 0, tzinfo=UTC)
NOW = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
GPUS = (("GPU-d0", "node-a", "NVIDIA H100 80GB HBM3", 0), ("GPU-d1", "node-a",
        "NVIDIA H100 80GB HBM3", 1), ("GPU-d2", "node-b", "NVIDIA A100-SXM4-80GB", 0))  # fmt: skip
GAP = (datetime(2026, 11, 29, 10, 0, tzinfo=UTC), datetime(2026, 11, 29, 13, 0, tzinfo=UTC))
STEP = 60.0
RAW = ReadPath(edges="raw")  # edges from raw samples, whole days from the day sums
FINER_RAW = ReadPath(edges="raw", day_sums=False)  # every second from finer data
TODAY_UNTIL = NOW - timedelta(minutes=2)  # today's sums end a settling time before NOW
MONEY = ("cost_usd", "waste_usd", "idle_usd", "fixable_usd", "nodata_usd", "lost_usd")
SECONDS = ("held_seconds", "allocated_seconds", "nodata_seconds", "idle_seconds",
           "unused_seconds", "unpriced_seconds", "energy_used_joules")  # fmt: skip


def _metrics(gpu: int, minute: int) -> dict[str, Any]:
    """A sample's metrics: the GPU changes what it does every 37 minutes, in a fixed cycle."""
    phase = (minute // 37 + 3 * gpu) % 5
    sm = (0.0, 0.02, 0.9, 0.6, 0.3)[phase]
    return {
        "sm_active": sm, "gr_engine_active": min(1.0, sm + 0.05), "gpu_util": 1.0 if sm else 0.0,
        "tensor_active": 0.5 if phase == 2 else 0.0, "dram_active": 0.2 if phase == 4 else 0.05,
        "fb_used_bytes": (0 if phase == 0 else 20) * GIB + GIB // 4,
        "power_watts": 90.0 + 400.0 * sm,
    }  # fmt: skip


def _store_all(engine: Engine) -> None:
    clock = FakeClock(NOW)
    n = int((END - START).total_seconds() // STEP)
    for g, (uuid, node, model, index) in enumerate(GPUS):
        minutes = [k for k in range(n)
                   if not (g == 1 and GAP[0] <= START + timedelta(minutes=k) < GAP[1])]  # fmt: skip
        runs: list[list[int]] = []
        for k in minutes:
            if runs and runs[-1][-1] == k - 1:
                runs[-1].append(k)
            else:
                runs.append([k])
        for run in runs:
            store_series(
                engine, clock, uuid=uuid, start=START + timedelta(minutes=run[0]) + timedelta(
                    seconds=7 * g), metrics=[_metrics(g, k) for k in run], interval_seconds=STEP,
                hostname=node, model=model, index=index,
            )  # fmt: skip
    roll_up(engine)


@pytest.fixture(scope="module")
def loaded(migrated_engine: Engine) -> Iterator[Engine]:
    """Three GPUs' samples over 3.5 days (one GPU with a 3 h gap), rolled up; no jobs yet."""
    truncate_all(migrated_engine)
    _store_all(migrated_engine)
    yield migrated_engine
    truncate_all(migrated_engine)


def _reset(engine: Engine) -> None:
    """Forget the previous example's jobs, tenant rows, prices and day sums (samples stay)."""
    with engine.begin() as conn:
        for table in (jobs, tenant_1m, tenant_1h, tenant_1d, shared_1h, rollup_dirty,
                      cost_gpu_1d, cost_job_1d, cost_job_day_1d):  # fmt: skip
            conn.execute(delete(table))
        conn.execute(delete(cost_day_dirty))


def _prices(h100: float, change: tuple[datetime, float] | None) -> list[PriceRow]:
    rows = [PriceRow("*H100*", h100, datetime(2026, 1, 1, tzinfo=UTC)),
            PriceRow("*A100*", 1.79, datetime(2026, 1, 1, tzinfo=UTC))]  # fmt: skip
    if change is not None:
        rows.append(PriceRow("*H100*", change[1], change[0]))
    return rows


def _close(a: float | None, b: float | None, tol: float) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=tol)


def _assert_same(engine: Engine, s: Settings, start: datetime, end: datetime, group_by: str,
                 **filters: Any) -> datetime:  # fmt: skip
    """The report with day sums equals the minute-level report (edges raw in both) over the
    window it read, which ends where today's sums do if it reads them; returns that end."""
    with engine.connect() as conn:
        with forced(RAW):
            fast = cost_report.cost_report(
                conn, settings=s, start=start, end=end, now=NOW, group_by=group_by, **filters
            )
        with forced(FINER_RAW):
            slow = cost_report.cost_report(
                conn,
                settings=s,
                start=start,
                end=fast["end"],
                now=NOW,
                group_by=group_by,
                **filters,
            )
    rows = {r["key"]: r for r in slow["rows"]}
    assert sorted(r["key"] for r in fast["rows"]) == sorted(rows)
    for got in [*fast["rows"], fast["totals"]]:
        want = rows.get(got["key"], slow["totals"])
        for f in MONEY:
            assert _close(got[f], want[f], 0.005), (group_by, got["key"], f, got[f], want[f])
        for f in SECONDS:
            assert _close(got[f], want[f], 1e-6), (group_by, got["key"], f, got[f], want[f])
        for f in ("gpus", "jobs", "top_cause", "user", "team"):
            assert got.get(f) == want.get(f), (group_by, got["key"], f)
        for cause, figures in want["causes"].items():
            assert _close(got["causes"][cause]["usd"], figures["usd"], 0.005), (cause, got["key"])
    assert fast["warnings"] == slow["warnings"]
    read_until: datetime = fast["end"]
    return read_until


def _same_fixes(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """The same fixes, their figures equal but for float rounding (totals are summed in
    another order when a page is chosen in the database)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x.keys() != y.keys():
            return False
        for k, v in x.items():
            same = _close(v, y[k], 1e-6) if isinstance(v, float) else v == y[k]
            if not same and k not in ("assumption", "base"):  # texts that print the figures
                return False
    return True


def _assert_pages(engine: Engine, s: Settings, start: datetime, end: datetime,
                  sorts: tuple[str, ...], **filters: Any) -> int:  # fmt: skip
    """Every page of the report by job (chosen in the database from the summed days' bounds
    where it can be) is the whole report's rows sliced, with its totals and row count; returns
    how many pages were chosen in the database."""
    chosen_in_db = 0
    original = report_pages.day_page

    def spy(*args: Any, **kwargs: Any) -> report_pages.DayPage | None:
        nonlocal chosen_in_db
        out = original(*args, **kwargs)
        chosen_in_db += out is not None
        return out

    with engine.connect() as conn, pytest.MonkeyPatch.context() as mp, forced(RAW):
        mp.setattr(report_pages, "day_page", spy)
        for sort in sorts:
            whole = cost_report.cost_report(
                conn,
                settings=s,
                start=start,
                end=end,
                now=NOW,
                group_by="job",
                sort_by=sort,
                **filters,
            )
            n = whole["row_count"]
            for offset, limit in ((0, 1), (1, 2), (max(n - 1, 0), 1)):
                page = cost_report.cost_report(
                    conn, settings=s, start=start, end=end, now=NOW, group_by="job",
                    sort_by=sort, offset=offset, limit=limit, **filters,
                )  # fmt: skip
                want = whole["rows"][offset : offset + limit]
                assert [r["key"] for r in page["rows"]] == [r["key"] for r in want], sort
                assert page["row_count"] == n
                for got, row in [*zip(page["rows"], want, strict=True),
                                 (page["totals"], whole["totals"])]:  # fmt: skip
                    for f in (*MONEY, *SECONDS):
                        assert _close(got[f], row[f], 1e-6), (sort, got["key"], f)
                    for f in ("gpus", "jobs", "top_cause", "user", "team"):
                        assert got.get(f) == row.get(f), (sort, got["key"], f)
                    assert _same_fixes(got["fixes"], row["fixes"]), (sort, got["key"])
    return chosen_in_db


def _assert_jobs_only(engine: Engine, s: Settings, start: datetime, end: datetime) -> None:
    """The report by job of jobs only is the report by job without its unallocated row: the
    same rows in the same order, its totals less that row's."""
    with engine.connect() as conn, forced(RAW):
        every, jobs_only = (
            cost_report.cost_report(
                conn, settings=s, start=start, end=end, now=NOW, group_by="job", jobs_only=only,
            )
            for only in (False, True)
        )  # fmt: skip
    kept = [r for r in every["rows"] if r["key"] != UNALLOCATED]
    assert [r["key"] for r in jobs_only["rows"]] == [r["key"] for r in kept]
    assert jobs_only["row_count"] == len(kept)
    left = [r for r in every["rows"] if r["key"] == UNALLOCATED]
    for f in SECONDS:
        want = every["totals"][f] - sum(r[f] for r in left)
        assert _close(jobs_only["totals"][f], want, 1e-6), f


def _summed_everywhere(engine: Engine, s: Settings, start: datetime, end: datetime) -> bool:
    """Whether every GPU's whole days of [start, end) are read from the day sums."""
    window = day_sums.whole_days(start, min(end, NOW))
    if window is None:
        return True
    with engine.connect() as conn:
        table = price_table.effective_prices(conn, s).rows
        stale, _ = day_sums.stale_in(
            conn, gpus=costs_repo.load_gpus(conn), start=window[0], end=window[1],
            basis=day_sums.basis_of(table, s),
        )  # fmt: skip
    return not stale


def _write_days(engine: Engine, s: Settings) -> None:
    cost_days.write_days(engine, settings=s, clock=lambda: NOW, budget_seconds=1e9)


instants = st.integers(0, int((END - START).total_seconds())).map(
    lambda x: START + timedelta(seconds=x)
)
job_st = st.tuples(
    st.sets(st.integers(0, 2), min_size=1, max_size=2),  # GPUs
    instants,
    st.integers(600, 60 * 3600),  # seconds held
    st.booleans(),  # still open
    st.sampled_from(("vision", "nlp", None)),
)


@given(
    job_list=st.lists(job_st, min_size=1, max_size=5),
    change=st.one_of(st.none(), st.tuples(instants, st.sampled_from((2.5, 6.0)))),
    window=st.tuples(st.integers(-6 * 3600, 86400), st.integers(2 * 86400, 4 * 86400)),
    late=st.tuples(st.integers(0, 170), st.integers(1, 10)),
    group_by=st.sampled_from(("job", "team", "user", "gpu", "node")),
)
@settings(
    max_examples=8,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
def test_day_sums_equal_the_minute_level_reading(
    loaded: Engine,
    job_list: list[tuple[set[int], datetime, int, bool, str | None]],
    change: tuple[datetime, float] | None,
    window: tuple[int, int],
    late: tuple[int, int],
    group_by: str,
) -> None:
    engine = loaded
    # Today (Dec 1, to NOW) is summed so far too: three GPUs are fleet enough.
    s = Settings(database_url="sqlite://", run_scheduler=False, cost_today_min_gpus=0)
    _reset(engine)
    with engine.begin() as conn:
        prices_repo.replace_prices(conn, rows=_prices(4.0, change))
        for n, (gpu_set, begin, held, still_open, team) in enumerate(job_list):
            end = None if still_open else min(begin + timedelta(seconds=held), NOW)
            jobs_repo.upsert_job(
                conn, job_id=f"slurm:{n}", fields={"user": f"u{n % 2}", "team": team},
                gpu_uuids=[GPUS[g][0] for g in sorted(gpu_set)], started_at=begin, ended_at=None,
                now=NOW,
            )  # fmt: skip
            if end is not None:
                jobs_repo.end_job(conn, job_id=f"slurm:{n}", ended_at=end, now=NOW)
    roll_up(engine)  # the shared minutes' tenant rows
    start = START + timedelta(seconds=window[0])
    stop = min(start + timedelta(seconds=window[1]), NOW)
    _write_days(engine, s)
    assert _summed_everywhere(engine, s, start, stop)
    read_until = _assert_same(engine, s, start, stop, group_by)
    # A window reaching the present from before midnight ends where today's sums end.
    assert read_until == (TODAY_UNTIL if start <= floor_day(NOW) and stop == NOW else stop)
    _assert_same(engine, s, start, stop, "job", team="vision")
    # The jobs list's reading: the report by job without time no job held, paged alike.
    _assert_jobs_only(engine, s, start, stop)
    if len(job_list) >= 3:
        assert _assert_pages(engine, s, start, stop, ("waste", "fixable")) > 0
        _assert_pages(engine, s, start, stop, ("waste",), jobs_only=True)
    _assert_pages(engine, s, start, stop, ("idle",), user="u0")
    # A person's scope (their own jobs and their team's): the same from sums and minutes, paged
    # alike, and nobody else's job in it.
    scope = JobScope(users=frozenset({"u1"}), teams=frozenset({"vision"}))
    _assert_same(engine, s, start, stop, "team", scope=scope)
    _assert_pages(engine, s, start, stop, ("waste",), scope=scope)
    with engine.connect() as conn:
        scoped = cost_report.cost_report(
            conn, settings=s, start=start, end=stop, now=NOW, group_by="job", scope=scope
        )
    assert all(r["user"] == "u1" or r["team"] == "vision" for r in scoped["rows"])

    # Late data: samples inside GPU-d1's gap, on a day already summed.
    at = GAP[0] + timedelta(minutes=late[0])
    store_series(engine, FakeClock(NOW), uuid=GPUS[1][0], start=at,
                 metrics=[_metrics(1, k) for k in range(late[1])], interval_seconds=STEP,
                 hostname=GPUS[1][1], model=GPUS[1][2], index=1)  # fmt: skip
    roll_up(engine)
    _assert_same(engine, s, start, stop, group_by)  # that GPU's days from the rollups
    _write_days(engine, s)
    assert _summed_everywhere(engine, s, start, stop)
    _assert_same(engine, s, start, stop, group_by)

    # A price change: every day is priced anew before it is read from the sums again.
    with engine.begin() as conn:
        prices_repo.replace_prices(conn, rows=_prices(3.1, change))
    assert not _summed_everywhere(engine, s, start, stop) or stop - start < timedelta(days=2)
    _assert_same(engine, s, start, stop, group_by)
    _write_days(engine, s)
    _assert_same(engine, s, start, stop, group_by)

    # A new owner is read at once (owners are joined when read, never stored in the sums).
    with engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == "slurm:0").values(team="moved"))
    _assert_same(engine, s, start, stop, "team")


def test_a_job_change_marks_its_days_and_the_job_re_writes_them(loaded: Engine) -> None:
    """Registering a job that started days ago, ending it, and a GPU lost: each leaves a stale
    range over the days it changes; those GPUs are read from finer data until re-written."""
    engine = loaded
    s = Settings(database_url="sqlite://", run_scheduler=False)
    _reset(engine)
    with engine.begin() as conn:
        prices_repo.replace_prices(conn, rows=_prices(4.0, None))
    _write_days(engine, s)
    with engine.connect() as conn:
        n_days = conn.execute(select(func.count()).select_from(cost_gpu_1d)).scalar_one()
    # Every GPU-day from its first sample's day up to yesterday: Nov 27 (part) .. Nov 30.
    assert n_days == 3 * 4
    begin = datetime(2026, 11, 28, 5, 30, 17, tzinfo=UTC)
    with engine.begin() as conn:
        jobs_repo.upsert_job(
            conn, job_id="slurm:late", fields={"team": "vision"}, gpu_uuids=[GPUS[0][0]],
            started_at=begin, ended_at=None, now=NOW,
        )  # fmt: skip
        ranges = conn.execute(select(cost_day_dirty.c.gpu_id, cost_day_dirty.c.lo)).all()
    assert ranges and {g for g, _ in ranges} == {1}  # GPU-d0 is id 1
    assert not _summed_everywhere(engine, s, START, NOW)
    _assert_same(engine, s, START, NOW, "team")
    _write_days(engine, s)
    assert _summed_everywhere(engine, s, START, NOW)
    _assert_same(engine, s, START, NOW, "team")
    with engine.begin() as conn:
        jobs_repo.end_job(conn, job_id="slurm:late", ended_at=begin + timedelta(days=1), now=NOW)
        conn.execute(update(gpus).where(gpus.c.id == 3).values(lost_at=datetime(
            2026, 11, 30, 20, 0, tzinfo=UTC)))  # fmt: skip
        stale = {g for (g,) in conn.execute(select(cost_day_dirty.c.gpu_id))}
    assert stale == {1, 3}
    _assert_same(engine, s, START, NOW, "gpu")
    _write_days(engine, s)
    assert _summed_everywhere(engine, s, START, NOW)
    for group_by in ("gpu", "team", "job"):
        _assert_same(engine, s, START, NOW, group_by)
    with engine.begin() as conn:
        conn.execute(update(gpus).where(gpus.c.id == 3).values(lost_at=None))


def _one_job_per_gpu(engine: Engine) -> None:
    """Forget the last test's jobs; one job of team vision holds each GPU from START on."""
    _reset(engine)
    with engine.begin() as conn:
        prices_repo.replace_prices(conn, rows=_prices(4.0, None))
        for k, (uuid, *_) in enumerate(GPUS):
            jobs_repo.upsert_job(
                conn, job_id=f"slurm:{k}", fields={"team": "vision"}, gpu_uuids=[uuid],
                started_at=START, ended_at=None, now=NOW,
            )  # fmt: skip


def test_the_door_reads_summed_days_for_the_fleet_and_finer_data_for_chosen_gpus(
    loaded: Engine,
) -> None:
    """``dollars`` reads the fleet's whole days from the day sums and only their edges from
    finer data; a query of chosen GPUs, or a forced read without sums, reads finer data alone,
    and the three agree on the dollars."""
    engine = loaded
    s = Settings(database_url=engine.url.render_as_string(hide_password=False),
                 run_scheduler=False)  # fmt: skip
    _one_job_per_gpu(engine)
    _write_days(engine, s)
    query = DollarsQuery(START, END, edges="raw")
    with engine.connect() as conn:
        fleet = dollars(conn, query, settings=s, now=NOW)
        gpu_ids = tuple(sorted(fleet.attribution.gpus))
        chosen = dollars(conn, replace(query, gpu_ids=gpu_ids), settings=s, now=NOW)
        with forced(ReadPath(day_sums=False)):
            finer = dollars(conn, query, settings=s, now=NOW)
        summed = fleet.summed(conn, group_by="job")
    assert fleet.window is not None
    assert (fleet.window.start, fleet.window.end) == (ceil_day(START), floor_day(END))
    assert fleet.window.excluded == frozenset()
    assert chosen.window is None and finer.window is None and finer.end == END
    # The fleet's finer lines are the edges alone: [START, Nov 28) and [Dec 1, END) of each
    # GPU (each is held from its first sample, up to 14 s after START).
    edges, every, one = (
        summarize(read.attribution.lines, lambda ln: "all", jobs_only=False)["all"]
        for read in (fleet, finer, chosen)
    )
    assert edges.held_seconds == pytest.approx(3 * 12 * 3600, abs=60)
    assert every.held_seconds == pytest.approx(3 * (END - START).total_seconds(), abs=60)
    assert one.held_seconds == pytest.approx(every.held_seconds)
    days_usd = sum(g.cost_usd for g in summed.groups.values())
    assert edges.cost_usd + days_usd == pytest.approx(every.cost_usd, rel=1e-9)
    assert one.cost_usd == pytest.approx(every.cost_usd, rel=1e-9)


@pytest.mark.parametrize(
    ("reading", "window"),
    [
        # A page by job: its rows are chosen in the database, then its totals are read.
        ("read_total", {"end": NOW.isoformat(), "group_by": "job", "limit": "2"}),
        # A window cut inside its days: on PostgreSQL the summed days are read on a second
        # connection, beside the edges, after which days are current is checked.
        ("stale_in", {"end": END.isoformat(), "group_by": "team"}),
    ],
)
def test_a_report_read_while_its_days_are_re_written_is_one_snapshot(
    loaded: Engine, reading: str, window: dict[str, str]
) -> None:
    """A report's reads are one snapshot, on every connection it reads on: the cost-days job
    committing new day sums between the request's reads (just before ``day_sums.<reading>``)
    changes none of that answer; the next request sees them."""
    engine = loaded
    s = Settings(database_url=engine.url.render_as_string(hide_password=False),
                 run_scheduler=False)  # fmt: skip
    _one_job_per_gpu(engine)
    _write_days(engine, s)
    original = getattr(day_sums, reading)
    rewrites = []

    def days_re_written_then_read(*args: Any, **kwargs: Any) -> Any:
        rewrites.append(1)
        # The job writes each (job, day)'s sums with its rows, in the same transaction.
        with engine.begin() as other:
            for table in (cost_job_1d, cost_job_day_1d, cost_gpu_1d):
                usd = {c: c * 2 for c in table.c if c.name.endswith("_usd")}
                other.execute(update(table).values(usd))
        return original(*args, **kwargs)

    app = create_app(s, engine=engine, clock=FakeClock(NOW))
    auth = {"Authorization": f"Bearer {make_token(engine, 'reader')}"}
    params = {"start": START.isoformat(), **window}
    with live_server(app) as base, httpx.Client(base_url=base, headers=auth, timeout=60) as http:

        def report() -> dict[str, Any]:
            r = http.get("/api/v1/reports/cost", params=params)
            assert r.status_code == 200, r.text
            return dict(r.json())

        before = report()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(day_sums, reading, days_re_written_then_read)
            during = report()
        after = report()
    assert rewrites == [1]  # the rewrite came between the request's reads
    assert during == before
    assert after["totals"]["cost_usd"] > before["totals"]["cost_usd"] + 1.0


def _today_rows(engine: Engine, day: datetime) -> list[tuple[int, datetime | None]]:
    """The (GPU id, held_until) of ``day``'s summed rows."""
    g = cost_gpu_1d.c
    with engine.connect() as conn:
        rows = conn.execute(select(g.gpu_id, g.held_until).where(g.day == day)).all()
    return sorted((int(gpu), None if until is None else _as_utc(until)) for gpu, until in rows)


def _as_utc(value: Any) -> datetime:
    parsed = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def test_today_is_summed_so_far_and_a_report_reaching_now_ends_there(loaded: Engine) -> None:
    """In a fleet large enough, today is summed up to a settled minute; a report reaching
    the present reads it and ends there, equal to the minute-level reading of that window; a
    window from after midnight, a smaller fleet or sums grown old read through now; late data
    before the sums' end marks them stale, minutes after it do not; the next day re-writes
    today's rows as a whole day."""
    engine = loaded
    today = floor_day(NOW)
    small = Settings(database_url="sqlite://", run_scheduler=False)  # 1,000 GPUs at least
    s = small.model_copy(update={"cost_today_min_gpus": 3})
    _one_job_per_gpu(engine)
    _write_days(engine, small)
    assert _today_rows(engine, today) == []
    _write_days(engine, s)
    assert _today_rows(engine, today) == [(1, TODAY_UNTIL), (2, TODAY_UNTIL), (3, TODAY_UNTIL)]
    for group_by in ("job", "team", "gpu"):
        assert _assert_same(engine, s, START, NOW, group_by) == TODAY_UNTIL
    # The fleet's dollars of today: from the same sums, per GPU and per team and GPU.
    with engine.connect() as conn:
        wasted = fleet.wasted_today(conn, settings=s, now=NOW)
        with forced(FINER_RAW):
            by_gpu = cost_report.cost_report(
                conn, settings=s, start=today, end=TODAY_UNTIL, now=NOW, group_by="gpu"
            )
    assert wasted.until == TODAY_UNTIL and len(by_gpu["rows"]) == 3
    for row in by_gpu["rows"]:
        for f in ("cost_usd", "waste_usd", "idle_usd", "fixable_usd", "nodata_usd"):
            assert _close(wasted.by_uuid[row["key"]][f], row[f], 0.005), (row["key"], f)
            # Each GPU is held all day by one job of team vision.
            assert _close(wasted.by_team["vision"][row["key"]][f], row[f], 0.005), f
    # A window from after midnight has no day to read: it ends now.
    assert _assert_same(engine, s, today + timedelta(hours=1), NOW, "job") == NOW
    # Sums older than the settling time and three rounds of the job are not read.
    late = NOW + timedelta(seconds=day_sums.today_lag_seconds(s) + 60)
    with engine.connect() as conn:
        old = cost_report.cost_report(conn, settings=s, start=START, end=late, now=late,
                                      group_by="team")  # fmt: skip
    assert old["end"] == late

    # A sample after the sums' end (and the gap one covers at most: it may end the cover of
    # the sample before it) marks nothing; one before it marks its GPU stale.
    for at, marked in ((TODAY_UNTIL + timedelta(seconds=70), set()),
                       (TODAY_UNTIL - timedelta(minutes=9), {1})):  # fmt: skip
        store_series(engine, FakeClock(NOW), uuid=GPUS[0][0], start=at,
                     metrics=[_metrics(0, 5)], interval_seconds=STEP, hostname=GPUS[0][1],
                     model=GPUS[0][2], index=0)  # fmt: skip
        roll_up(engine)
        with engine.connect() as conn:
            assert {g for (g,) in conn.execute(select(cost_day_dirty.c.gpu_id))} == marked
    assert _assert_same(engine, s, START, NOW, "job") == TODAY_UNTIL  # GPU-d0 read finer
    _write_days(engine, s)
    assert _summed_everywhere(engine, s, START, today)
    assert _assert_same(engine, s, START, NOW, "job") == TODAY_UNTIL

    # Tomorrow: today is re-written as a whole day, tomorrow summed so far.
    tomorrow = NOW + timedelta(days=1)
    cost_days.write_days(engine, settings=s, clock=lambda: tomorrow, budget_seconds=1e9)
    assert _today_rows(engine, today) == [(1, None), (2, None), (3, None)]
    assert {until for _, until in _today_rows(engine, today + DAY)} == {
        TODAY_UNTIL + timedelta(days=1)
    }


def test_the_fleet_dollars_are_read_again_only_as_today_s_sums_move(loaded: Engine) -> None:
    """The fleet's dollars of today are read into the cache when today's sums end past those
    kept, and only then; without sums (a small fleet) nothing is read ahead of a page."""
    engine = loaded
    small = Settings(database_url="sqlite://", run_scheduler=False)
    s = small.model_copy(update={"cost_today_min_gpus": 3})
    _one_job_per_gpu(engine)
    cache = fleet.WastedTodayCache(
        max_age_seconds=0, sums_lag_seconds=day_sums.today_lag_seconds(s)
    )
    _write_days(engine, small)
    with engine.connect() as conn:
        assert not fleet.refresh_wasted_today(conn, settings=small, now=NOW, cache=cache)
    assert cache.latest() is None
    _write_days(engine, s)
    with engine.connect() as conn:
        assert fleet.refresh_wasted_today(conn, settings=s, now=NOW, cache=cache)
        read = cache.get(floor_day(NOW), NOW)
        assert read == fleet.wasted_today(conn, settings=s, now=NOW)
        assert read is not None and read.from_sums and read.until == TODAY_UNTIL
        # The same sums a minute on: kept, not read again, and still served.
        later = NOW + timedelta(minutes=1)
        assert not fleet.refresh_wasted_today(conn, settings=s, now=later, cache=cache)
        assert cache.get(floor_day(NOW), later) is read
    # The cost-days job sums a minute more: read again, ending there.
    later = NOW + timedelta(minutes=1)
    cost_days.write_days(engine, settings=s, clock=lambda: later, budget_seconds=1e9)
    with engine.connect() as conn:
        assert fleet.refresh_wasted_today(conn, settings=s, now=later, cache=cache)
    again = cache.latest()
    assert again is not None and again.until == TODAY_UNTIL + timedelta(minutes=1)
    assert again.by_uuid["GPU-d0"]["cost_usd"] > read.by_uuid["GPU-d0"]["cost_usd"]  # type: ignore[operator]


def test_without_sums_the_fleet_dollars_are_read_ahead_while_pages_ask(loaded: Engine) -> None:
    """Where no sums answer today (a small fleet), the fleet's dollars are read ahead of a
    page only once a page has asked, then again at each refresh, so a write between two
    refreshes shows in the figures kept; each read equals the page's own read."""
    engine = loaded
    s = Settings(database_url="sqlite://", run_scheduler=False)
    _one_job_per_gpu(engine)
    _write_days(engine, s)
    cache = fleet.WastedTodayCache(max_age_seconds=0, watched_seconds=3600)
    with engine.connect() as conn:
        assert not fleet.refresh_wasted_today(conn, settings=s, now=NOW, cache=cache)
    assert cache.latest() is None  # no page asked: nothing read ahead
    assert cache.get(floor_day(NOW), NOW) is None  # a page asks (and reads them itself)
    with engine.connect() as conn:
        assert fleet.refresh_wasted_today(conn, settings=s, now=NOW, cache=cache)
        first = cache.latest()
        assert first == fleet.wasted_today(conn, settings=s, now=NOW)
        assert first is not None and not first.from_sums
    with engine.begin() as conn:  # a write between two reads: the H100s cost twice as much
        prices_repo.replace_prices(conn, rows=_prices(8.0, None))
    with engine.connect() as conn:
        assert fleet.refresh_wasted_today(conn, settings=s, now=NOW, cache=cache)
        again = cache.latest()
        assert again == fleet.wasted_today(conn, settings=s, now=NOW)
    assert again is not None and again != first
    assert again.by_uuid["GPU-d0"]["cost_usd"] == 2 * first.by_uuid["GPU-d0"]["cost_usd"]  # type: ignore[operator]


def _today_if_stale(engine: Engine, s: Settings, now: datetime) -> int:
    return cost_days.write_today_if_stale(engine, settings=s, clock=lambda: now)


def test_today_s_sums_are_written_as_soon_as_they_are_missing_or_stale(loaded: Engine) -> None:
    """The today-sums check writes today's sums where there are none (a fleet that just
    arrived, a start after a stop), leaves current ones alone, and writes them again where a
    tenth of the GPUs would be read from finer data or before a report would stop reading
    them; writing today forgets the stale marks of today it covers."""
    engine = loaded
    small = Settings(database_url="sqlite://", run_scheduler=False)  # 1,000 GPUs at least
    s = small.model_copy(update={"cost_today_min_gpus": 3})
    _one_job_per_gpu(engine)
    _write_days(engine, small)  # the days before today, not today
    assert _today_rows(engine, floor_day(NOW)) == []
    assert _today_if_stale(engine, s, NOW) == 3
    assert _today_rows(engine, floor_day(NOW)) == [(g, TODAY_UNTIL) for g in (1, 2, 3)]
    a_minute_on = NOW + timedelta(minutes=1)
    assert _today_if_stale(engine, s, a_minute_on) == 0  # fresh: read, nothing written
    assert _today_rows(engine, floor_day(NOW)) == [(g, TODAY_UNTIL) for g in (1, 2, 3)]
    # A late sample before their end marks its GPU's today stale: a third of the GPUs would
    # be read from minutes, so today is written again at once, with it, and the mark goes.
    store_series(engine, FakeClock(NOW), uuid=GPUS[0][0], start=TODAY_UNTIL - timedelta(minutes=9),
                 metrics=[_metrics(0, 5)], interval_seconds=STEP, hostname=GPUS[0][1],
                 model=GPUS[0][2], index=0)  # fmt: skip
    roll_up(engine)
    with engine.connect() as conn:
        assert {g for (g,) in conn.execute(select(cost_day_dirty.c.gpu_id))} == {1}
    assert _today_if_stale(engine, s, a_minute_on) == 3
    summed_until = TODAY_UNTIL + timedelta(minutes=1)
    assert _today_rows(engine, floor_day(NOW)) == [(g, summed_until) for g in (1, 2, 3)]
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(cost_day_dirty)).scalar_one() == 0
    assert _today_if_stale(engine, s, a_minute_on) == 0  # current again
    # Read for today_lag_seconds: written again a rollup interval before they would not be.
    later = summed_until + timedelta(
        seconds=day_sums.today_lag_seconds(s) - s.rollup_interval_seconds + 1
    )
    assert _today_if_stale(engine, s, later) == 3
    with engine.connect() as conn:
        report = cost_report.cost_report(
            conn, settings=s, start=START, end=later, now=later, group_by="job"
        )
    until = (later - timedelta(minutes=2)).replace(second=0, microsecond=0)
    assert report["end"] == until  # today read from the sums written


def test_the_service_checks_today_s_sums_every_rollup_interval(app: Any) -> None:
    """The today-sums check is a background job of its own, at the rollup's pace (the
    cost-days job, a minute apart, would leave the pages reading minutes until it runs)."""
    from service.scheduler import build_scheduler

    ctx = app.state.ctx
    jobs = {job.id: job for job in build_scheduler(ctx).get_jobs()}
    every = jobs["today_sums"].trigger.interval.total_seconds()
    assert every == ctx.settings.rollup_interval_seconds < ctx.settings.cost_days_interval_seconds
    for hook in ctx.shutdown_hooks:
        hook()
