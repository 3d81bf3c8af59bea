"""``GET /api/v1/actions``: the ladders' audit log, filtered, paged and as CSV, on both stores.

Rows are written the way the ladder writes them (``actions_repo.record_action``).
"""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta

import pytest
from sqlalchemy import Engine

from service.db import actions_repo
from service.db.rows import NewAction
from tests.alerting_support import auth
from tests.integration.actions_support import STEPS, get, outcomes, record_skip, record_steps
from tests.support import FakeClock, iso


@pytest.fixture
def steps(engine: Engine, clock: FakeClock) -> list[int]:
    return record_steps(engine, clock())


def test_every_step_newest_first_with_its_figures(http, tokens, steps, clock) -> None:
    r = get(http, tokens["reader"])
    assert outcomes(r) == ["skipped", "would", "failed", "reclaimed", "warned", "warned"]
    newest, would = r.json()[0], r.json()[1]
    assert newest["id"] == steps[-1] and newest["step"] is None
    assert newest["reason"] == "exempt: user bo" and newest["dry_run"] is False
    assert would["dry_run"] is True and would["driver"] == "slurm"
    assert would["at"] == iso(clock() - timedelta(minutes=60))
    assert (would["value"], would["threshold"], would["waste_usd"]) == (0.01, 0.05, 12.5)
    assert would["since"] == iso(clock() - timedelta(minutes=260))


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"job": "slurm:1"}, ["reclaimed", "warned", "warned"]),
        ({"job": "k8s:ml/train-0"}, ["would"]),
        ({"user": "bo"}, ["skipped", "failed"]),
        ({"team": "vision"}, ["would", "reclaimed", "warned", "warned"]),
        ({"policy": "held-dry"}, ["skipped", "would"]),
        ({"outcome": "warned"}, ["warned", "warned"]),
        ({"policy": "gpu-idle", "user": "bo"}, ["failed"]),
        ({"since": "2h"}, ["skipped", "would", "failed"]),
        ({"start": "-140m", "end": "-60m"}, ["failed", "reclaimed"]),
        ({"user": "nobody"}, []),
    ],
)
def test_filters_filter(http, tokens, steps, params: dict[str, str], expected: list[str]) -> None:
    assert outcomes(get(http, tokens["reader"], **params)) == expected


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"outcome": "cancelled"}, "outcome"),
        ({"start": "yesterday-ish"}, "start"),
        ({"since": "forever"}, "since"),
        ({"start": "-1h", "since": "1h"}, "since"),
        ({"start": "now", "end": "-1h"}, "start"),
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"before": "0"}, "before"),
        ({"format": "xml"}, "format"),
        ({"jobs": "slurm:1"}, "jobs"),
    ],
)
def test_a_bad_filter_is_a_422_naming_it(http, tokens, params: dict[str, str], field: str) -> None:
    r = get(http, tokens["reader"], **params)
    assert r.status_code == 422, r.text
    assert [d["loc"][-1] for d in r.json()["detail"]] == [field], r.text


def test_a_full_page_links_the_next_until_the_last(http, tokens, steps) -> None:
    seen: list[int] = []
    r = get(http, tokens["reader"], limit=4, team="vision")
    while True:
        assert r.status_code == 200, r.text
        seen += [a["id"] for a in r.json()]
        link = r.headers.get("link")
        if link is None:
            break
        found = re.fullmatch(r'<(/api/v1/actions\?[^>]+)>; rel="next"', link)
        assert found is not None, link
        assert "team=vision" in found.group(1) and "limit=4" in found.group(1)
        r = http.get(found.group(1), headers=auth(tokens["reader"]))
    vision = [i for i, s in zip(steps, STEPS, strict=True) if s[4] == "vision"]
    assert seen == sorted(vision, reverse=True)
    # A page that is exactly full links one more, which is empty and links none.
    r = get(http, tokens["reader"], limit=2, before=steps[2])
    assert [a["id"] for a in r.json()] == [steps[1], steps[0]] and "link" in r.headers
    r = get(http, tokens["reader"], limit=2, before=steps[0])
    assert r.json() == [] and "link" not in r.headers


def test_steps_at_the_same_moment_page_without_loss(http, tokens, engine, clock) -> None:
    ids = []
    with engine.begin() as conn:
        for i in range(5):
            row_id = actions_repo.record_action(
                conn,
                NewAction(
                    at=clock() - timedelta(minutes=1), policy="p", job_id=f"slurm:{i}",
                    action="notify_owner", outcome="warned", dry_run=False,
                ),
            )  # fmt: skip
            ids.append(row_id)
    first = get(http, tokens["reader"], limit=3).json()
    rest = get(http, tokens["reader"], limit=3, before=first[-1]["id"]).json()
    assert [a["id"] for a in first + rest] == sorted(ids, reverse=True)


def test_a_step_recorded_this_second_is_listed_without_an_end(http, tokens, engine, clock) -> None:
    with engine.begin() as conn:
        actions_repo.record_action(
            conn,
            NewAction(
                at=clock(), policy="p", job_id="slurm:1", action="notify_owner",
                outcome="warned", dry_run=False,
            ),
        )  # fmt: skip
    assert outcomes(get(http, tokens["reader"])) == ["warned"]
    assert outcomes(get(http, tokens["reader"], end=iso(clock()))) == []  # end is exclusive


def test_csv_has_the_columns_and_quotes_formulas(http, tokens, steps, engine, clock) -> None:
    evil = '=HYPERLINK("http://evil.example")'
    record_skip(
        engine, at=clock() - timedelta(minutes=10), job_id="slurm:5", user="bo", reason=evil
    )
    r = get(http, tokens["reader"], format="csv", user="bo")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "text/csv; charset=utf-8"
    assert "gpuwarden-actions.csv" in r.headers["content-disposition"]
    assert r.content.count(b"\r\n") == 4 and not r.content.startswith(b"\xef\xbb\xbf")
    rows = list(csv.DictReader(io.StringIO(r.text, newline="")))
    assert [row["outcome"] for row in rows] == ["skipped", "skipped", "failed"]
    formula, skipped, failed = rows
    assert formula["reason"] == '\'=HYPERLINK("http://evil.example")'  # read as text
    assert skipped["reason"] == "exempt: user bo"
    assert skipped["step"] == "" and failed["step"] == "2"
    assert failed["detail"] == "scancel 2: timed out" and failed["dry_run"] == "False"
    assert failed["job_id"] == "slurm:2" and failed["waste_usd"] == "12.5"
    assert list(rows[0]) == [
        "id", "at", "policy", "job_id", "user", "team", "alert_id", "step", "action",
        "outcome", "reason", "dry_run", "driver", "mode", "detail", "value", "threshold",
        "since", "waste_usd", "idle_usd",
    ]  # fmt: skip


def test_readers_read_node_tokens_do_not(http, tokens, steps, engine) -> None:
    from tests.conftest import make_token

    assert get(http, tokens["reader"]).status_code == 200
    assert get(http, tokens["admin"]).status_code == 200
    assert get(http, tokens["agent"]).status_code == 403
    assert get(http, make_token(engine, "agent", "node-b")).status_code == 403
    assert http.get("/api/v1/actions").status_code == 401
