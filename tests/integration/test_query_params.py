"""Query parameters as people write them, the same on every route: times, durations, unknown names."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from service.cli.main import main
from tests.alerting_support import auth
from tests.support import FakeClock, make_batch, query_field


def test_every_route_refuses_an_unknown_query_parameter(app, http, tokens):
    checked = 0
    for template, methods in app.openapi()["paths"].items():
        path = re.sub(r"\{[^}]+\}", "1", template)
        for method in methods:
            r = http.request(
                method, path, params={"group-by": "team"}, headers=auth(tokens["admin"])
            )
            assert query_field(r) == "group-by", (method, path)
            assert "unknown query parameter 'group-by'" in r.json()["detail"][0]["msg"]
            checked += 1
    assert checked > 20


def test_every_optional_parameter_left_empty_reads_as_absent(app, http, tokens):
    """``?end=`` is what a form or a script sends for "not given": it means the default."""
    h = auth(tokens["admin"])
    http.post("/api/v1/ingest", json=make_batch(start=app.state.ctx.clock()),
              headers=auth(tokens["agent"])).raise_for_status()  # fmt: skip
    checked = 0
    for template, methods in app.openapi()["paths"].items():
        path = re.sub(r"\{uuid\}", "GPU-a0", template)
        for method, op in methods.items():
            optional = [p["name"] for p in op.get("parameters", [])
                        if p["in"] == "query" and not p.get("required")]  # fmt: skip
            # Single sign-on's routes redirect to the provider (404 where none is set up).
            if method != "get" or not optional or "{" in path or path.startswith("/api/v1/auth/"):
                continue
            required = {"metric": "sm_active"} if path.endswith("/series") else {}
            if path.endswith("/gpus/series"):
                required["gpu"] = "GPU-a0"
            plain = http.get(path, params=required, headers=h)
            assert plain.status_code == 200, (path, plain.text)
            # The batch series read needs a job or a GPU: its one GPU is the given one.
            for name in (n for n in optional if n not in required):
                r = http.get(path, params={**required, name: ""}, headers=h)
                assert r.status_code == 200, (path, name, r.text)
                checked += 1
    assert checked >= 20


def test_a_misspelt_report_parameter_is_refused_not_ignored(http, tokens):
    h = auth(tokens["reader"])
    r = http.get("/api/v1/reports/cost", params={"group-by": "team"}, headers=h)
    assert query_field(r) == "group-by" and "group_by" in r.json()["detail"][0]["msg"]
    assert (
        http.get("/api/v1/reports/cost", params={"group_by": "team"}, headers=h).status_code == 200
    )


def test_report_and_jobs_windows_read_since_relative_times_and_dates(http, tokens, clock):
    h = auth(tokens["reader"])
    now = clock()
    for path in ("/api/v1/reports/cost", "/api/v1/jobs"):
        r = http.get(path, params={"since": "1h"}, headers=h)
        assert r.status_code == 200, r.text
        if path.endswith("cost"):
            body = r.json()
            assert body["start"] == (now - timedelta(hours=1)).isoformat().replace("+00:00", "Z")
        r = http.get(path, params={"start": "-2h", "end": "now"}, headers=h)
        assert r.status_code == 200, r.text
        r = http.get(path, params={"start": "2026-12-01", "end": "2026-12-02"}, headers=h)
        assert r.status_code == 200, r.text
        if path.endswith("cost"):
            assert r.json()["start"].startswith("2026-12-01T00:00:00")
        assert query_field(http.get(path, params={"since": "1.5h"}, headers=h)) == "since"
        assert query_field(http.get(path, params={"start": "yesterday"}, headers=h)) == "start"
        assert (
            query_field(http.get(path, params={"since": "1h", "start": "-1h"}, headers=h))
            == "since"
        )


def test_series_reads_step_as_a_duration_and_start_relative(http, tokens, clock: FakeClock):
    start = clock() - timedelta(minutes=10)
    batch = make_batch(start=start, count=60, interval_seconds=10)
    http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"])).raise_for_status()
    h = auth(tokens["reader"])
    r = http.get(
        "/api/v1/gpus/GPU-a0/series",
        params={"metric": "sm_active", "start": "-10m", "end": "now", "step": "10s"},
        headers=h,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["step_seconds"] == 10 and len(body["points"]) == 60


@pytest.mark.parametrize(
    ("flag", "value"), [("--since", "1.5h"), ("--start", "2026-12-01T00:00:00")]
)
def test_cli_names_the_flag_of_a_bad_time(capsys, server, tokens, flag, value):
    code = main(["report", "cost", "--url", server, "--token", tokens["reader"], flag, value])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"gpuwarden: {flag}: ") and "{" not in err


def test_cli_prints_a_server_422_as_one_readable_line(capsys, server, tokens):
    code = main(
        ["report", "cost", "--url", server, "--token", tokens["reader"], "--start", "2020-01-01"]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and "{" not in err and "'loc'" not in err
    assert "(422): start: " in err and "retention" in err


def test_cli_takes_a_relative_start_as_written(capsys, server, tokens):
    # argparse alone would read "-2h" as an option
    code = main(
        ["report", "cost", "--url", server, "--token", tokens["reader"], "--start", "-2h", "--json"]
    )
    out = capsys.readouterr().out
    assert code == 0 and '"group_by": "job"' in out
