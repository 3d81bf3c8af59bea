"""The cost report grouped by Kubernetes namespace and by any job label (``group_by=namespace``,
``group_by=label:<key>``), as OpenCost groups workloads: through the REST API, CSV and the day
sums (read per job, then summed per namespace or label), equal to the report read from finer
data; jobs without the label in ``__unlabelled__``; on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, update

from service.costs.prices import PriceRow
from service.db import prices_repo
from service.db.schema import jobs
from service.settings import Settings
from service.usecases.costing import cost_days, cost_report, day_sums
from service.usecases.costing.dollars import ReadPath, forced
from tests.alerting_support import add_job
from tests.integration.cost_data import GIB, roll_up, store_series
from tests.support import FakeClock, auth, iso

START = datetime(2026, 11, 29, 0, 0, tzinfo=UTC)  # two whole days before the clock's day
END = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
KEY = "app.kubernetes.io/name"
MONEY = ("cost_usd", "waste_usd", "idle_usd", "fixable_usd", "nodata_usd")
SECONDS = ("held_seconds", "allocated_seconds", "idle_seconds", "waste_gpu_hours")


def _metrics(gpu: int, minute: int) -> dict[str, Any]:
    busy = (minute // 90 + gpu) % 3  # idle-held, busy with tensor cores, busy without
    return {
        "sm_active": (0.0, 0.9, 0.8)[busy],
        "tensor_active": (0.0, 0.6, 0.0)[busy],
        "gpu_util": 0.0 if busy == 0 else 1.0,
        "fb_used_bytes": 20 * GIB,
    }


def _label(engine: Engine, job_id: str, labels: dict[str, str]) -> None:
    with engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(labels=labels))


@pytest.fixture
def labelled(engine: Engine, clock: FakeClock) -> Settings:
    """Two H100s sampled every minute over 2.5 days at $4/GPU-hour, three jobs: a pod of
    namespace ml-team labelled trainer, a pod of ml-team without labels, and a Slurm job
    labelled trainer (no namespace); the rest of the time no job's; day sums written."""
    n = int((END - START).total_seconds() // 60)
    for g in (0, 1):
        store_series(
            engine, clock, uuid=f"GPU-l{g}", start=START, metrics=[_metrics(g, k) for k in range(n)],
            interval_seconds=60, index=g,
        )  # fmt: skip
    roll_up(engine)
    add_job(engine, "k8s:ml-team/train-1", ("GPU-l0",), started_at=START + timedelta(hours=3))
    add_job(engine, "k8s:ml-team/eval-2", ("GPU-l1",), started_at=START + timedelta(hours=5))
    _label(engine, "k8s:ml-team/train-1", {KEY: "trainer", "team": "x"})
    with engine.begin() as conn:
        from service.db import jobs_repo

        jobs_repo.end_job(conn, job_id="k8s:ml-team/eval-2", ended_at=START + timedelta(hours=30),
                          now=clock())  # fmt: skip
    add_job(engine, "slurm:42", ("GPU-l1",), started_at=START + timedelta(hours=31))
    _label(engine, "slurm:42", {KEY: "trainer"})
    with engine.begin() as conn:
        prices_repo.replace_prices(
            conn, rows=[PriceRow("*H100*", 4.0, datetime(2026, 1, 1, tzinfo=UTC))]
        )
    s = Settings(database_url=engine.url.render_as_string(hide_password=False), run_scheduler=False)
    cost_days.write_days(engine, settings=s, clock=clock, budget_seconds=1e9)
    return s


def _close(a: float | None, b: float | None, tol: float) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=tol)


@pytest.mark.parametrize(
    ("group_by", "keys"),
    [
        ("namespace", {"ml-team", "__no_namespace__", "__unallocated__"}),
        (f"label:{KEY}", {"trainer", "__unlabelled__", "__unallocated__"}),
    ],
)
def test_day_sums_group_by_namespace_and_label_as_finer_data_does(
    engine: Engine, clock: FakeClock, labelled: Settings, group_by: str, keys: set[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    read_as: list[str] = []
    original = day_sums.read_days

    def spy(*args: Any, **kwargs: Any) -> day_sums.DaySums:
        read_as.append(kwargs["group_by"])
        return original(*args, **kwargs)

    monkeypatch.setattr(day_sums, "read_days", spy)
    with engine.connect() as conn:
        with forced(ReadPath(edges="raw")):
            fast = cost_report.cost_report(
                conn, settings=labelled, start=START, end=END, now=clock(), group_by=group_by
            )
        with forced(ReadPath(edges="raw", day_sums=False)):
            slow = cost_report.cost_report(
                conn,
                settings=labelled,
                start=START,
                end=fast["end"],
                now=clock(),
                group_by=group_by,
            )
    assert read_as == ["job"]  # whole days came from the day sums, read per job
    rows = {r["key"]: r for r in slow["rows"]}
    assert {r["key"] for r in fast["rows"]} == set(rows) == keys
    for got in [*fast["rows"], fast["totals"]]:
        want = rows.get(got["key"], slow["totals"])
        for f in MONEY:
            assert _close(got[f], want[f], 0.005), (got["key"], f, got[f], want[f])
        for f in SECONDS:
            assert _close(got[f], want[f], 1e-6), (got["key"], f, got[f], want[f])
        assert got["jobs"] == want["jobs"], got["key"]
    # The trainer label spans a pod and a Slurm job; ml-team both pods.
    if group_by == "namespace":
        assert rows["ml-team"]["jobs"] == 2 and rows["__no_namespace__"]["jobs"] == 1
    else:
        assert rows["trainer"]["jobs"] == 2 and rows["__unlabelled__"]["jobs"] == 1
    assert fast["totals"]["cost_usd"] == pytest.approx(
        4.0 * 2 * (fast["end"] - START).total_seconds() / 3600
    )


def test_group_by_label_over_rest_and_csv_and_a_bad_key_is_422(
    http: httpx.Client, tokens: dict[str, str], labelled: Settings
) -> None:
    params = {"start": iso(START), "end": iso(END), "group_by": f"label:{KEY}"}
    r = http.get("/api/v1/reports/cost", params=params, headers=auth(tokens["reader"]))
    assert r.status_code == 200, r.text
    rep = r.json()
    assert rep["group_by"] == f"label:{KEY}"
    assert {row["key"] for row in rep["rows"]} == {"trainer", "__unlabelled__", "__unallocated__"}
    text = http.get(
        "/api/v1/reports/cost", params=params | {"format": "csv"}, headers=auth(tokens["reader"])
    ).text
    table = list(csv.reader(io.StringIO(text)))
    assert table[0][0] == f"label:{KEY}"
    assert {line[0] for line in table[1:]} == {
        "trainer", "__unlabelled__", "__unallocated__", "__total__",
    }  # fmt: skip
    # A label set later regroups the report: groups follow the jobs as they are now.
    body = {"labels": {KEY: "evaluator"}}
    http.patch(
        "/api/v1/jobs/k8s:ml-team%2Feval-2", json=body, headers=auth(tokens["admin"])
    ).raise_for_status()
    again = http.get("/api/v1/reports/cost", params=params, headers=auth(tokens["reader"])).json()
    assert {row["key"] for row in again["rows"]} == {"trainer", "evaluator", "__unallocated__"}
    ns = http.get(
        "/api/v1/reports/cost", params=params | {"group_by": "namespace"},
        headers=auth(tokens["reader"]),
    ).json()  # fmt: skip
    assert {row["key"] for row in ns["rows"]} == {"ml-team", "__no_namespace__", "__unallocated__"}
    for bad in ("label:", "label:" + "k" * 64, "labels"):
        r = http.get(
            "/api/v1/reports/cost", params=params | {"group_by": bad},
            headers=auth(tokens["reader"]),
        )  # fmt: skip
        assert r.status_code == 422 and "group_by" in r.text, (bad, r.text)


@pytest.mark.parametrize("key", ['tëam"x', "a\\b", "$.x[0]", "app.kubernetes.io/name"])
def test_a_label_key_with_any_characters_groups_alike_on_both_stores(
    engine: Engine, clock: FakeClock, key: str
) -> None:
    t0 = clock() - timedelta(hours=2)
    store_series(engine, clock, uuid="GPU-k0", start=t0, metrics=[_metrics(0, 0)] * 360)
    add_job(engine, "k8s:ns/a", ("GPU-k0",), started_at=t0)
    _label(engine, "k8s:ns/a", {key: "found", "other": "x"})
    s = Settings(database_url=engine.url.render_as_string(hide_password=False), run_scheduler=False)
    with engine.connect() as conn:
        rep = cost_report.cost_report(
            conn, settings=s, start=t0, end=clock(), now=clock(), group_by=f"label:{key}"
        )
    assert [r["key"] for r in rep["rows"]] == ["found"]
