"""Proven savings' ledger (issue 46), a property on both stores: whatever runs a work has (more
or less starved, with or without progress, either side of a month's end), no realised saving is
more than the earlier run's waste, and each month of the ledger is the sum of its pairs, to the
cent."""

from __future__ import annotations

import itertools
from datetime import timedelta

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from service.costs.savings import cents
from service.settings import Settings
from service.usecases.savings import savings_ledger
from tests.hypothesis_support import examples
from tests.support import FakeClock, auth, iso, make_batch

_GPU = itertools.count()
STARVED = {"sm_active": 0.15, "gr_engine_active": 0.2, "tensor_active": 0.12,
           "fb_used_bytes": 20 * 2**30}  # fmt: skip
FIXED = {"sm_active": 0.95, "gr_engine_active": 0.97, "tensor_active": 0.9,
         "fb_used_bytes": 20 * 2**30}  # fmt: skip

RUN = st.tuples(
    st.integers(5, 40),  # minutes
    st.integers(0, 10),  # tenths of the run input-starved
    st.one_of(st.none(), st.integers(100, 5000)),  # steps, or no progress
)


@given(
    histories=st.lists(st.tuples(st.lists(RUN, min_size=2, max_size=3), st.sampled_from("ab"),
                                 st.integers(0, 48)), min_size=1, max_size=2),
)  # fmt: skip
@settings(
    max_examples=examples(10),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
def test_realised_never_exceeds_the_waste_and_months_add_up(
    http: httpx.Client,
    tokens: dict[str, str],
    engine: Engine,
    clock: FakeClock,
    histories: list[tuple[list[tuple[int, int, int | None]], str, int]],
) -> None:
    for runs, team, offset_hours in histories:
        gpu = f"GPU-p{next(_GPU)}"
        work = f"w-{gpu}"
        # Runs start either side of midnight, Nov 30 (the clock stands at Dec 2, 08:00).
        at = clock() - timedelta(hours=40 + offset_hours)
        for n, (minutes, starved_tenths, steps) in enumerate(runs):
            count = minutes * 6
            starved = count * starved_tenths // 10
            for part, (first, metrics) in enumerate(((0, STARVED), (starved, FIXED))):
                size = starved if part == 0 else count - starved
                if size:
                    batch = make_batch(gpu_uuids=(gpu,), start=at + timedelta(seconds=10 * first),
                                       count=size, metrics=metrics)  # fmt: skip
                    r = http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"]))
                    assert r.status_code == 200, r.text
            end = at + timedelta(minutes=minutes)
            job_id = f"manual:{work}-{n}"
            body = {"id": job_id, "user": "u", "team": team, "labels": {"work": work},
                    "gpus": [gpu], "started_at": iso(at), "ended_at": iso(end)}  # fmt: skip
            r = http.post("/api/v1/jobs", json=body, headers=auth(tokens["admin"]))
            assert r.status_code == 201, r.text
            if steps is not None:
                for t, value in ((at, 0.0), (end, float(steps))):
                    r = http.post(f"/api/v1/jobs/{job_id}/progress",
                                  json={"unit": "steps", "value": value, "at": iso(t)},
                                  headers=auth(tokens["admin"]))  # fmt: skip
                    assert r.status_code == 201, r.text
            at = end + timedelta(minutes=5)
    s = Settings(database_url="sqlite://", run_scheduler=False)
    with engine.connect() as conn:
        found = savings_ledger(conn, settings=s, start=clock() - timedelta(days=5),
                               end=clock(), now=clock(), group_by="team")  # fmt: skip
    for p in found.pairs:
        saving = p.saving
        if saving.realised_usd is None:
            continue
        r = http.get(f"/api/v1/jobs/{saving.compared_with}", headers=auth(tokens["reader"]))
        waste = r.json()["summary"]["waste_usd"]
        assert saving.realised_usd <= waste + 1e-9, (saving, waste)
    booked = found.as_dict()["pairs"]
    for month in {r.month for r in found.rows}:
        rows = [r for r in found.rows if r.month == month]
        in_month = [p for p in booked if p["booked"] and p["month"] == month]
        assert sum(r.realised_cents for r in rows) == sum(
            cents(p["realised_usd"]) for p in in_month
        )
        assert sum(r.promised_cents for r in rows) == sum(
            cents(p["promised_usd"] or 0.0) for p in in_month
        )
        assert sum(r.pairs for r in rows) == len(in_month)
