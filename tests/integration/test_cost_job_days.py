"""The (job, day) sums (cost_job_day_1d) give what the (job, GPU, day) rows they are written
from give: per job, user, team and in total, with GPUs left out (stale), owner filters and a
page's job ids, on random fleets, on SQLite and PostgreSQL; and they follow their rows when
days are replaced or pruned."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, delete, func, insert, select

from service.db.costing import cost_days_reads, cost_days_repo
from service.db.costing.cost_days_repo import UNALLOCATED_JOB
from service.db.schema import COST_SUM_FIELDS, cost_job_1d, cost_job_day_1d, jobs

DAY0 = datetime(2026, 11, 20, tzinfo=UTC)
FIELDS = ("held_seconds", "cost_usd", "idle_empty_usd", "compute_tensor_usd", "covered_seconds")
OWNERS = {"j0": ("alice", "vision"), "j1": ("bob", "vision"), "j2": ("alice", "nlp"),
          "j3": ("carol", None), "j4": (None, "nlp")}  # fmt: skip


def _load(engine: Engine, rows: dict[tuple[int, int, str], tuple[float, ...]]) -> None:
    """Replace the jobs and day sums with ``rows`` and their (job, day) sums."""
    with engine.begin() as conn:
        for table in (cost_job_day_1d, cost_job_1d, jobs):
            conn.execute(delete(table))
        conn.execute(
            insert(jobs),
            [{"id": k, "user": u, "team": t, "project": None, "labels": {}, "source": "api",
              "started_at": DAY0, "created_at": DAY0, "updated_at": DAY0}
             for k, (u, t) in OWNERS.items()],
        )  # fmt: skip
        new = [
            {"day": DAY0 + timedelta(days=d), "gpu_id": g, "job_id": j,
             **dict(zip(FIELDS, v, strict=True))}
            for (d, g, j), v in rows.items()
        ]  # fmt: skip
        if new:
            conn.execute(insert(cost_job_1d), new)
        cost_days_repo.sum_job_days(conn, [DAY0 + timedelta(days=d) for d in range(5)])


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-9)


def _reference(
    rows: dict[tuple[int, int, str], tuple[float, ...]], *, days: range, excluded: set[int],
    user: str | None, team: str | None, jobs_only: bool,
) -> dict[str, tuple[set[int], list[float]]]:  # fmt: skip
    """What the (job, GPU, day) rows give per job: its GPUs and sums (the reading before)."""
    out: dict[str, tuple[set[int], list[float]]] = {}
    for (d, g, j), values in rows.items():
        owner = OWNERS.get(j, (None, None))
        if d not in days or g in excluded:
            continue
        if (user is not None or team is not None or jobs_only) and j == UNALLOCATED_JOB:
            continue
        if (user is not None and owner[0] != user) or (team is not None and owner[1] != team):
            continue
        gpus, sums = out.setdefault(j, (set(), [0.0] * len(FIELDS)))
        gpus.add(g)
        for i, v in enumerate(values):
            sums[i] += v
    return out


@given(
    rows=st.dictionaries(
        st.tuples(st.integers(0, 4), st.integers(1, 6), st.sampled_from(["", *OWNERS])),
        st.tuples(*(st.floats(0.0, 86400.0, allow_nan=False) for _ in FIELDS)),
        max_size=40,
    ),
    days=st.tuples(st.integers(0, 4), st.integers(1, 5)),
    excluded=st.sets(st.integers(1, 6), max_size=3),
    owner=st.sampled_from(
        [
            (None, None, False),
            (None, None, True),
            ("alice", None, False),
            (None, "vision", False),
            ("alice", "nlp", False),
        ]
    ),
    group_by=st.sampled_from(("job", "user", "team")),
)
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_the_job_day_sums_read_as_their_rows(
    engine: Engine,
    rows: dict[tuple[int, int, str], tuple[float, ...]],
    days: tuple[int, int],
    excluded: set[int],
    owner: tuple[str | None, str | None, bool],
    group_by: str,
) -> None:
    _load(engine, rows)
    first, n = days
    window = range(first, min(first + n, 5))
    start, end = DAY0 + timedelta(days=window.start), DAY0 + timedelta(days=window.stop)
    user, team, jobs_only = owner
    want = _reference(rows, days=window, excluded=excluded, user=user, team=team,
                      jobs_only=jobs_only)  # fmt: skip
    args: dict[str, Any] = dict(start=start, end=end, excluded=excluded, user=user, team=team,
                                jobs_only=jobs_only)  # fmt: skip
    with engine.connect() as conn:
        groups = cost_days_reads.group_sums(conn, fields=FIELDS, group_by=group_by, **args)
        dollars = cost_days_reads.job_dollars(
            conn, idle_fields=("idle_empty_usd",), fixable_fields=("compute_tensor_usd",), **args
        )
        gpu_ids, totals = cost_days_reads.total_sums(conn, fields=FIELDS, **args)
        some = sorted(want)[::2]
        page = cost_days_reads.group_sums(conn, fields=FIELDS, group_by="job", job_ids=some,
                                         **args)  # fmt: skip

    _check_groups(groups, want, group_by)
    assert {k for k, *_ in dollars} == set(want)
    for k, idle, fixable, cost, _unpriced in dollars:
        sums = want[k][1]
        assert _close(idle, sums[2]) and _close(fixable, sums[3]) and _close(cost, sums[1])

    assert set(gpu_ids) == set().union(*(g for g, _ in want.values()))
    for n, value in enumerate(totals):
        assert _close(float(value or 0.0), sum(s[n] for _, s in want.values())), FIELDS[n]

    assert sorted(str(row[1]) for row in page) == some
    for row in page:
        job_id = str(row[1])
        assert set(row[3]) == want[job_id][0]
        assert all(_close(a, b) for a, b in zip(row[5], want[job_id][1], strict=True))


def _check_groups(
    groups: list[tuple[bool, str | None, dict[str, Any], list[int], list[str], tuple[Any, ...]]],
    want: dict[str, tuple[set[int], list[float]]],
    group_by: str,
) -> None:
    """``groups`` (``group_sums``) are the per-job reference ``want`` grouped by ``group_by``:
    the same groups, GPUs, jobs and sums."""
    expected: dict[tuple[bool, str | None], tuple[set[int], set[str], list[float]]] = {}
    for job_id, (gpus, sums) in want.items():
        no_job = job_id == UNALLOCATED_JOB
        owner = OWNERS.get(job_id, (None, None))
        key = job_id if group_by == "job" else {"user": owner[0], "team": owner[1]}[group_by]
        acc = expected.setdefault(
            (no_job, None if no_job else key), (set(), set(), [0.0] * len(FIELDS))
        )
        acc[0].update(gpus)
        if not no_job:
            acc[1].add(job_id)
        for n, v in enumerate(sums):
            acc[2][n] += v
    got = {(no_job, None if no_job else k): (set(g), set(ids), v)
           for no_job, k, _, g, ids, v in groups}  # fmt: skip
    assert set(got) == set(expected)
    for group, (gpus, ids, sums) in expected.items():
        assert got[group][:2] == (gpus, ids), group
        assert all(_close(a, b) for a, b in zip(got[group][2], sums, strict=True)), group


def test_replacing_and_pruning_days_keeps_the_job_day_sums_on_their_rows(engine: Engine) -> None:
    """replace_days, replace_day and delete_days_before leave cost_job_day_1d the per (job,
    day) sums of cost_job_1d: no row of a job that no longer holds a GPU that day."""

    def row(day: int, gpu: int, job: str, usd: float) -> dict[str, Any]:
        return {"day": DAY0 + timedelta(days=day), "gpu_id": gpu, "job_id": job,
                **dict.fromkeys(COST_SUM_FIELDS, 0.0), "cost_usd": usd}  # fmt: skip

    def job_days() -> dict[tuple[datetime, str], tuple[set[int], float]]:
        with engine.connect() as conn:
            t = cost_job_day_1d.c
            return {
                (d.replace(tzinfo=UTC) if d.tzinfo is None else d, j):
                    (cost_days_reads.gpu_set(ids), float(usd))
                for d, j, ids, usd in conn.execute(select(t.day, t.job_id, t.gpu_ids, t.cost_usd))
            }  # fmt: skip

    with engine.begin() as conn:
        cost_days_repo.replace_days(conn, keys=[(1, DAY0), (2, DAY0), (1, DAY0 + timedelta(days=1))],
                                    gpu_rows=[], job_rows=[row(0, 1, "j0", 2.0), row(0, 2, "j0", 3.0),
                                                           row(0, 2, "", 1.0), row(1, 1, "j1", 4.0)])  # fmt: skip
    assert job_days() == {(DAY0, "j0"): ({1, 2}, 5.0), (DAY0, ""): ({2}, 1.0),
                          (DAY0 + timedelta(days=1), "j1"): ({1}, 4.0)}  # fmt: skip
    with engine.begin() as conn:  # GPU 2 of day 0 re-written: j0 left it
        cost_days_repo.replace_days(conn, keys=[(2, DAY0)], gpu_rows=[],
                                    job_rows=[row(0, 2, "", 7.0)])  # fmt: skip
    assert job_days()[(DAY0, "j0")] == ({1}, 2.0)
    assert job_days()[(DAY0, "")] == ({2}, 7.0)
    with engine.begin() as conn:  # today so far, replaced whole
        cost_days_repo.replace_day(conn, day=DAY0 + timedelta(days=1), gpu_rows=[],
                                   job_rows=[row(1, 3, "j2", 1.5)])  # fmt: skip
    assert job_days()[(DAY0 + timedelta(days=1), "j2")] == ({3}, 1.5)
    assert (DAY0 + timedelta(days=1), "j1") not in job_days()
    with engine.begin() as conn:
        cost_days_repo.delete_days_before(conn, cutoff=DAY0 + timedelta(days=1))
        left = conn.execute(select(func.count()).select_from(cost_job_day_1d)).scalar_one()
    assert left == 1
