"""Jobs, prices and cost reports over real HTTP on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import Engine, insert, select

from service.db.schema import gpus, job_gpus, jobs
from tests.integration.cost_data import (
    money_example_metrics,
    roll_up,
    store_series,
    worked_example_metrics,
)
from tests.support import FakeClock, auth, iso

T0 = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)  # the clock stands at 08:00


def put_prices(http: httpx.Client, tokens, rows=None) -> httpx.Response:
    rows = rows or [
        {
            "model_pattern": "*H100*",
            "usd_per_gpu_hour": 4.0,
            "effective_from": "2026-01-01T00:00:00Z",
        }
    ]
    return http.put("/api/v1/prices", json=rows, headers=auth(tokens["admin"]))


def post_job(
    http: httpx.Client, tokens, job_id: str, minutes: float, **fields: object
) -> httpx.Response:
    """POST job ``job_id`` on GPU-a0 from T0 for ``minutes``, with the other ``fields``."""
    body = {"id": job_id, **fields, "gpus": ["GPU-a0"], "started_at": iso(T0),
            "ended_at": iso(T0 + timedelta(minutes=minutes))}  # fmt: skip
    return http.post("/api/v1/jobs", json=body, headers=auth(tokens["admin"]))


@pytest.fixture
def worked(engine: Engine, clock: FakeClock) -> None:
    """GPU-a0 on node-a with the waste model's worked example over 06:00-07:00, rolled up."""
    store_series(engine, clock, uuid="GPU-a0", start=T0, metrics=worked_example_metrics())
    roll_up(engine)


def test_worked_example_job_summary(http: httpx.Client, tokens, worked):
    assert put_prices(http, tokens).status_code == 200
    r = post_job(http, tokens, "slurm:1", 60, user="alice", team="vision", project="p1")
    assert r.status_code == 201, r.text
    job = http.get("/api/v1/jobs/slurm:1", headers=auth(tokens["reader"])).json()
    s = job["summary"]
    assert s["allocated_seconds"] == pytest.approx(3600)
    assert s["idle_seconds"] == pytest.approx(1800)
    assert s["idle_held_seconds"] == pytest.approx(1800)
    assert s["unused_seconds"] == pytest.approx(2160)
    assert s["efficiency"] == pytest.approx(0.40)
    assert s["cost_usd"] == pytest.approx(4.00)
    # The idle half hour is waste in full; the second half ran on tensor cores: healthy, and
    # its 20% unused SM time is an activity figure, not dollars.
    assert s["idle_usd"] == pytest.approx(2.00)
    assert s["waste_usd"] == pytest.approx(2.00) and s["fixable_usd"] == pytest.approx(0.0)
    assert s["top_cause"] == "idle_held"
    assert [g["gpu_uuid"] for g in job["per_gpu"]] == ["GPU-a0"]
    assert job["per_gpu"][0]["cost_usd"] == pytest.approx(4.0)
    assert "tags" not in job and "dominant_waste_cause" not in job
    assert job["gpus"][0]["gpu_uuid"] == "GPU-a0" and job["gpus"][0]["source"] == "api"


def test_the_money_models_worked_example(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock
):
    """One H100 held an hour at $4: 30 min idle holding 20 GiB, 20 min fp32 GEMMs, 10 min no
    data -> cost $4.00 = idle_held $2.00 + compute_no_tensor $1.33 + nodata $0.67; waste $3.17
    = idle $2.00 + fixable $1.17 (the tensor-core fix saves SM activity 0.96 x (1 - 7.32/85.49)
    = 0.878 of the fp32 time: the speed-up measured on an H100, 11.7x, never the datasheet's
    14.8x, issue 50); efficiency 0.38."""
    store_series(engine, clock, uuid="GPU-a0", start=T0, metrics=money_example_metrics())
    roll_up(engine)
    put_prices(http, tokens).raise_for_status()
    post_job(http, tokens, "slurm:9", 60).raise_for_status()
    job = http.get("/api/v1/jobs/slurm:9", headers=auth(tokens["reader"])).json()
    s = job["summary"]
    assert s["held_seconds"] == pytest.approx(3600)
    assert s["cost_usd"] == pytest.approx(4.00)
    assert s["causes"]["idle_held"]["usd"] == pytest.approx(2.00)
    assert s["causes"]["compute_no_tensor"]["usd"] == pytest.approx(4 / 3)
    assert s["nodata_usd"] == pytest.approx(2 / 3) and s["lost_usd"] == 0
    assert s["cost_usd"] == pytest.approx(
        sum(c["usd"] for c in s["causes"].values()) + s["nodata_usd"] + s["lost_usd"]
    )
    share = 0.96 * (1 - 7.32 / 85.49)
    assert (s["waste_usd"], s["idle_usd"], s["fixable_usd"]) == (
        pytest.approx(2.00 + 4 / 3 * share), pytest.approx(2.00), pytest.approx(4 / 3 * share)
    )  # fmt: skip
    assert round(s["waste_usd"], 2) == 3.17 and round(s["fixable_usd"], 2) == 1.17
    assert s["efficiency"] == pytest.approx(0.96 * 20 / 50)
    assert s["top_cause"] == "idle_held"
    fixes = job["recommendations"]
    assert [f["cause"] for f in fixes] == ["idle_held", "compute_no_tensor"]
    assert round(sum(f["saving_usd"] for f in fixes), 2) == round(s["waste_usd"], 2) == 3.17
    (tensor,) = [f for f in fixes if f["cause"] == "compute_no_tensor"]
    assert "11.7x faster" in tensor["assumption"] and "H100 80GB HBM3" in tensor["assumption"]
    assert "14.8x" in tensor["assumption"]
    assert job["savings_usd"] == pytest.approx(s["waste_usd"])


def test_report_groups_totals_unallocated_and_csv(http: httpx.Client, tokens, worked):
    put_prices(http, tokens)
    # The job holds the GPU for the first 45 minutes only; the rest is unallocated.
    post_job(http, tokens, "j1", 45, team="vision").raise_for_status()
    params = {"start": iso(T0), "end": iso(T0 + timedelta(hours=2)), "group_by": "team"}
    rep = http.get("/api/v1/reports/cost", params=params, headers=auth(tokens["reader"])).json()
    rows = {r["key"]: r for r in rep["rows"]}
    assert set(rows) == {"vision", "__unallocated__"}
    # vision: 30 min idle + 15 min at 0.8 on tensor cores -> cost $3, waste the idle $2
    assert rows["vision"]["cost_usd"] == pytest.approx(3.0)
    assert rows["vision"]["waste_usd"] == pytest.approx(2.0)
    # The last sample (06:59:50) covers max_gap, to 07:00:40; after that no samples: nodata,
    # never idle and never waste, but the GPU is held all the two hours: it costs.
    assert rows["__unallocated__"]["allocated_seconds"] == pytest.approx(900 + 50)
    assert rows["__unallocated__"]["nodata_seconds"] == pytest.approx(4500 - 950)
    assert rows["__unallocated__"]["nodata_usd"] == pytest.approx(4.0 * (4500 - 950) / 3600)
    assert rep["totals"]["cost_usd"] == pytest.approx(4.0 * 2)
    assert rep["totals"]["waste_usd"] == pytest.approx(2.0)
    assert rep["warnings"] == []

    r = http.get(
        "/api/v1/reports/cost", params={**params, "format": "csv"}, headers=auth(tokens["reader"])
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    lines = list(csv.DictReader(io.StringIO(r.text)))
    assert [ln["team"] for ln in lines] == ["vision", "__unallocated__", "__total__"]
    assert float(lines[-1]["cost_usd"]) == pytest.approx(4.0 * 2)
    assert float(lines[-1]["waste_usd"]) == pytest.approx(2.0)
    assert float(lines[0]["idle_held_waste_usd"]) == pytest.approx(2.0)
    # Sorted by cost, the unallocated hour and a quarter comes first.
    by_cost = http.get(
        "/api/v1/reports/cost", params={**params, "sort": "cost"}, headers=auth(tokens["reader"])
    ).json()
    assert [r["key"] for r in by_cost["rows"]] == ["__unallocated__", "vision"]


def test_report_by_node_model_user_and_job(http: httpx.Client, tokens, worked):
    put_prices(http, tokens)
    post_job(http, tokens, "j1", 60, user="alice").raise_for_status()
    params = {"start": iso(T0), "end": iso(T0 + timedelta(hours=1))}
    for group_by, key in [
        ("node", "node-a"),
        ("gpu_model", "NVIDIA H100 80GB HBM3"),
        ("user", "alice"),
        ("job", "j1"),
    ]:
        rep = http.get(
            "/api/v1/reports/cost",
            params={**params, "group_by": group_by},
            headers=auth(tokens["reader"]),
        ).json()
        assert [r["key"] for r in rep["rows"]] == [key], group_by
        assert rep["rows"][0]["waste_usd"] == pytest.approx(2.0)
    rep = http.get(
        "/api/v1/reports/cost", params={**params, "group_by": "job"}, headers=auth(tokens["reader"])
    ).json()
    assert "tags" not in rep["rows"][0]
    assert rep["rows"][0]["user"] == "alice"
    # Cause filter: only the groups whose top cause it is.
    for cause, keys in [("idle_held", ["j1"]), ("compute_no_tensor", [])]:
        rep = http.get(
            "/api/v1/reports/cost", params={**params, "cause": cause},
            headers=auth(tokens["reader"]),
        ).json()  # fmt: skip
        assert [r["key"] for r in rep["rows"]] == keys

    listed = http.get("/api/v1/jobs", params=params, headers=auth(tokens["reader"])).json()
    assert [(j["id"], j["top_cause"]) for j in listed] == [("j1", "idle_held")]
    assert listed[0]["waste_usd"] == pytest.approx(2.0) and "tags" not in listed[0]


def test_report_by_project(http: httpx.Client, tokens, worked):
    put_prices(http, tokens)
    post_job(http, tokens, "j1", 30, project="llm").raise_for_status()
    params = {"start": iso(T0), "end": iso(T0 + timedelta(hours=1)), "group_by": "project"}
    rep = http.get("/api/v1/reports/cost", params=params, headers=auth(tokens["reader"])).json()
    rows = {r["key"]: r for r in rep["rows"]}
    assert set(rows) == {"llm", "__unallocated__"}
    assert rows["llm"]["waste_usd"] == pytest.approx(2.0)


def test_post_merges_into_observed_job_and_counts_overlap_once(
    http: httpx.Client, tokens, worked, engine: Engine, clock: FakeClock
):
    put_prices(http, tokens)
    with engine.begin() as conn:
        gpu_id = conn.execute(select(gpus.c.id)).scalar_one()
        conn.execute(
            insert(jobs).values(
                id="slurm:7",
                user="obs-user",
                labels={},
                source="observed",
                started_at=T0,
                created_at=clock(),
                updated_at=clock(),
            )
        )
        conn.execute(
            insert(job_gpus).values(
                job_id="slurm:7",
                gpu_id=gpu_id,
                started_at=T0,
                ended_at=T0 + timedelta(minutes=40),
                source="observed",
            )
        )
    r = http.post(
        "/api/v1/jobs",
        json={
            "id": "slurm:7",
            "user": "bob",
            "team": "nlp",
            "labels": {"qos": "high"},
            "gpus": ["GPU-a0"],
            "started_at": iso(T0 + timedelta(minutes=20)),
            "ended_at": iso(T0 + timedelta(hours=1)),
        },
        headers=auth(tokens["admin"]),
    )
    assert r.status_code == 200, r.text  # merged, not created
    body = r.json()
    assert (body["user"], body["team"], body["labels"]) == ("bob", "nlp", {"qos": "high"})
    assert body["started_at"] == iso(T0)
    assert sorted(g["source"] for g in body["gpus"]) == ["api", "observed"]
    s = http.get("/api/v1/jobs/slurm:7", headers=auth(tokens["reader"])).json()["summary"]
    # 0-40 min observed and 20-60 min api overlap: the union is one hour, counted once.
    assert s["held_seconds"] == pytest.approx(3600)
    assert s["cost_usd"] == pytest.approx(4.0)


def test_patch_ends_job_and_open_job_runs_until_now(
    http: httpx.Client, tokens, worked, clock: FakeClock
):
    put_prices(http, tokens)
    http.post(
        "/api/v1/jobs",
        json={"id": "run", "gpus": ["GPU-a0"], "started_at": iso(T0)},
        headers=auth(tokens["admin"]),
    ).raise_for_status()
    open_job = http.get("/api/v1/jobs/run", headers=auth(tokens["reader"])).json()
    assert open_job["ended_at"] is None and open_job["gpus"][0]["ended_at"] is None
    assert open_job["summary"]["held_seconds"] == pytest.approx(2 * 3600)  # until the clock, 08:00
    # Every held second costs: the samples (plus max_gap) cover 06:00-07:00:40, the rest
    # is nodata, still the job's.
    assert open_job["summary"]["cost_usd"] == pytest.approx(4.0 * 2)
    assert open_job["summary"]["nodata_usd"] == pytest.approx(4.0 * (7200 - 3650) / 3600)
    r = http.patch(
        "/api/v1/jobs/run",
        json={"ended_at": iso(T0 + timedelta(minutes=30)), "team": "t"},
        headers=auth(tokens["admin"]),
    )
    assert r.status_code == 200, r.text
    assert r.json()["ended_at"] == iso(T0 + timedelta(minutes=30)) and r.json()["team"] == "t"
    s = http.get("/api/v1/jobs/run", headers=auth(tokens["reader"])).json()["summary"]
    assert s["cost_usd"] == pytest.approx(2.0) and s["efficiency"] == pytest.approx(0.0)


def test_unpriced_gpu_has_null_cost_and_a_warning(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock
):
    store_series(
        engine,
        clock,
        uuid="GPU-x",
        model="Mystery Accelerator 9000",
        start=T0,
        metrics=[{"sm_active": 0.5}] * 60,
    )
    roll_up(engine)
    rep = http.get(
        "/api/v1/reports/cost",
        params={"start": iso(T0), "end": iso(T0 + timedelta(hours=1)), "group_by": "gpu_model"},
        headers=auth(tokens["reader"]),
    ).json()
    row = rep["rows"][0]
    assert row["cost_usd"] is None and row["waste_usd"] is None
    assert row["unpriced_seconds"] == pytest.approx(3600)  # every held second, covered or not
    assert rep["totals"]["cost_usd"] is None
    assert "Mystery Accelerator 9000" in rep["warnings"][0]


def test_prices_default_then_put_then_reset(http: httpx.Client, tokens):
    r = http.get("/api/v1/prices", headers=auth(tokens["reader"]))
    assert r.status_code == 200
    default = r.json()
    assert {p["source"] for p in default} == {"default"}
    assert {"*H100*", "*H200*", "*B200*", "*L40S*", "*L4", "*A100*40GB*", "*A100*80GB*"} <= {
        p["model_pattern"] for p in default
    }
    assert all(p["note"] for p in default)
    assert put_prices(http, tokens).json()[0]["source"] == "api"
    assert (
        http.get("/api/v1/prices", headers=auth(tokens["reader"])).json()[0]["usd_per_gpu_hour"]
        == 4.0
    )
    assert (
        http.put("/api/v1/prices", json=[], headers=auth(tokens["admin"])).json()[0]["source"]
        == "default"
    )
    assert put_prices(http, tokens | {"admin": tokens["reader"]}).status_code == 403


def bad_status(r: httpx.Response, status: int, *words: str) -> None:
    assert r.status_code == status, r.text
    text = r.text
    for w in words:
        assert w in text, (w, text)


def test_bad_input_is_a_4xx_that_names_the_problem(
    http: httpx.Client, tokens, worked, clock: FakeClock
):
    rd, ad = auth(tokens["reader"]), auth(tokens["admin"])
    rep = "/api/v1/reports/cost"
    bad_status(http.get(rep, params={"group_by": "planet"}, headers=rd), 422, "group_by", "planet")
    bad_status(
        http.get(rep, params={"start": iso(T0), "end": iso(T0 - timedelta(hours=1))}, headers=rd),
        422,
        "start",
        "before end",
    )
    bad_status(
        http.get(rep, params={"start": iso(clock() - timedelta(days=800))}, headers=rd),
        422,
        "start",
        "retention",
    )
    bad_status(http.get(rep, params={"cause": "lazy"}, headers=rd), 422, "cause", "lazy")
    bad_status(http.get(rep, params={"sort": "lazy"}, headers=rd), 422, "sort", "lazy")
    bad_status(http.get("/api/v1/jobs", params={"sort": "x"}, headers=rd), 422, "sort", "x")
    bad_status(http.get("/api/v1/fleet", params={"sort": "x"}, headers=rd), 422, "sort", "x")
    bad_status(http.get(rep, params={"format": "xml"}, headers=rd), 422, "format")
    bad_status(http.get(rep, params={"start": "2026-12-01T00:00:00"}, headers=rd), 422, "timezone")
    bad_status(
        http.get(
            "/api/v1/jobs",
            params={"start": iso(T0), "end": iso(T0 - timedelta(hours=1))},
            headers=rd,
        ),
        422,
        "start",
    )
    job = {"id": "x", "gpus": ["GPU-a0", "GPU-nope"], "started_at": iso(T0)}
    bad_status(http.post("/api/v1/jobs", json=job, headers=ad), 422, "gpus", "GPU-nope")
    bad_status(
        http.post(
            "/api/v1/jobs", json={**job, "gpus": [], "ended_at": iso(T0 - timedelta(1))}, headers=ad
        ),
        422,
        "ended_at",
    )
    bad_status(http.patch("/api/v1/jobs/none", json={"ended_at": iso(T0)}, headers=ad), 404, "none")
    bad_status(http.get("/api/v1/jobs/none", headers=rd), 404, "none")
    prices = [
        {"model_pattern": "*H100*", "usd_per_gpu_hour": 4, "effective_from": iso(T0)},
        {"model_pattern": "*RTX 9999*", "usd_per_gpu_hour": 1, "effective_from": iso(T0)},
    ]
    bad_status(
        http.put("/api/v1/prices", json=prices, headers=ad),
        422,
        "RTX 9999",
        "matches no GPU",
        '"loc":["body",1,"model_pattern"]',
    )
    bad_status(
        http.put("/api/v1/prices", json=[{**prices[0], "usd_per_gpu_hour": -1}], headers=ad),
        422,
        "usd_per_gpu_hour",
    )
    bad_status(http.post("/api/v1/jobs", json={**job, "gpus": ["GPU-a0"]}, headers=rd), 403)


def test_agent_token_registers_jobs_only_on_its_own_node(
    http: httpx.Client, tokens, worked, engine: Engine, clock: FakeClock
):
    store_series(
        engine, clock, uuid="GPU-b0", hostname="node-b", start=T0, metrics=[{"sm_active": 0.1}]
    )
    start = clock()  # agents date starts after their GPUs were first seen (stored at 08:00)
    ag = auth(tokens["agent"])  # writes for node-a
    r = http.post(
        "/api/v1/jobs", json={"id": "s:1", "gpus": ["GPU-b0"], "started_at": iso(start)}, headers=ag
    )
    assert r.status_code == 403 and "node-a" in r.text
    r = http.post(
        "/api/v1/jobs", json={"id": "s:1", "gpus": ["GPU-a0"], "started_at": iso(start)}, headers=ag
    )
    assert r.status_code == 201, r.text
    r = http.patch(
        "/api/v1/jobs/s:1", json={"ended_at": iso(start + timedelta(minutes=5))}, headers=ag
    )
    assert r.json()["ended_at"] == iso(start + timedelta(minutes=5))


def test_report_pages_with_limit_and_offset(http: httpx.Client, tokens, worked):
    """A page is the whole report's rows sliced, with the totals and row count of all of them;
    a bad count is a 422 that names it."""
    put_prices(http, tokens)
    for i, minutes in enumerate((10, 25, 40)):
        post_job(http, tokens, f"j{i}", minutes, user=f"u{i}").raise_for_status()
    params = {"start": iso(T0), "end": iso(T0 + timedelta(hours=2)), "group_by": "job"}
    head = auth(tokens["reader"])
    for sort in ("waste", "cost", "fixable"):
        whole = http.get("/api/v1/reports/cost", params={**params, "sort": sort}, headers=head)
        assert whole.status_code == 200, whole.text
        full = whole.json()
        assert full["row_count"] == len(full["rows"]) == 4  # three jobs and the unallocated time
        for offset, limit in ((0, 1), (1, 2), (3, 5), (4, 1), (0, 0)):
            r = http.get(
                "/api/v1/reports/cost",
                params={**params, "sort": sort, "offset": offset, "limit": limit},
                headers=head,
            )
            assert r.status_code == 200, r.text
            page = r.json()
            assert [x["key"] for x in page["rows"]] == [
                x["key"] for x in full["rows"][offset : offset + limit]
            ]
            assert page["rows"] == full["rows"][offset : offset + limit]
            assert (page["row_count"], page["offset"], page["limit"]) == (4, offset, limit)
            assert page["totals"] == full["totals"]
    r = http.get(
        "/api/v1/reports/cost", params={**params, "limit": 1, "format": "csv"}, headers=head
    )
    lines = list(csv.DictReader(io.StringIO(r.text)))
    first = http.get("/api/v1/reports/cost", params=params, headers=head).json()["rows"][0]
    assert [ln["job"] for ln in lines] == [first["key"], "__total__"]
    for bad in ({"limit": -1}, {"offset": -3}, {"limit": "ten"}):
        r = http.get("/api/v1/reports/cost", params={**params, **bad}, headers=head)
        assert r.status_code == 422 and next(iter(bad)) in r.text, r.text


def test_pages_of_the_jobs_list_join_to_the_whole_list_without_time_no_job_held(
    http: httpx.Client, tokens, worked
):
    # GPU-a0 idles 06:00-06:30 and works 06:30-07:00; 06:00-06:05 is held by no job.
    put_prices(http, tokens)
    for job_id, first, last in [("j1", 5, 8), ("j2", 8, 30), ("j3", 30, 40), ("j4", 40, 60)]:
        body = {"id": job_id, "user": "ann", "gpus": ["GPU-a0"],
                "started_at": iso(T0 + timedelta(minutes=first)),
                "ended_at": iso(T0 + timedelta(minutes=last))}  # fmt: skip
        http.post("/api/v1/jobs", json=body, headers=auth(tokens["admin"])).raise_for_status()
    window = {"start": iso(T0), "end": iso(T0 + timedelta(hours=1))}
    rd = auth(tokens["reader"])

    def listed(**params: str | int) -> tuple[list[str], int]:
        r = http.get("/api/v1/jobs", params={**window, **params}, headers=rd)
        assert r.status_code == 200, r.text
        assert datetime.fromisoformat(r.headers["X-Report-Start"]) == T0
        assert datetime.fromisoformat(r.headers["X-Report-End"]) == T0 + timedelta(hours=1)
        return [j["id"] for j in r.json()], int(r.headers["X-Total-Count"])

    # The unallocated five minutes would rank second by waste; the list holds jobs only.
    report = http.get("/api/v1/reports/cost", params={**window, "group_by": "job"}, headers=rd)
    assert [r["key"] for r in report.json()["rows"]][:3] == ["j2", "__unallocated__", "j1"]
    assert listed() == (["j2", "j1", "j3", "j4"], 4)
    assert listed(sort="cost") == (["j2", "j4", "j3", "j1"], 4)
    for sort in ("waste", "cost"):
        whole, _ = listed(sort=sort)
        pages = [listed(sort=sort, limit=3, offset=offset) for offset in (0, 3, 6)]
        assert [ids for ids, _ in pages] == [whole[:3], whole[3:], []]
        assert {total for _, total in pages} == {4}
    assert listed(user="bob") == ([], 0)
    for bad in ({"offset": -1}, {"limit": 0}):
        r = http.get("/api/v1/jobs", params={**window, **bad}, headers=rd)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", next(iter(bad))]
