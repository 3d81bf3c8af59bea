"""The web console in a real browser: Debian's Chromium driven by Playwright, against `gpuwarden demo`.

The demo (simulated fleet, an hour of history, default policies) is the seeded database; an admin
token adds a job whose user and label carry markup. The test logs in, opens every page, checks
the figures on each against the API, checks the markup shows as text and runs nowhere, creates
and expires a silence through the page (the CSRF path), and saves the screenshots that
docs/console.md and the README show (to a temporary folder; into docs/console with
``GPUWARDEN_SCREENSHOT_DIR=docs/console``). Without Chromium or Playwright it fails under CI=true and
skips elsewhere.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.integration.browser_support import ARGS, CHROMIUM, SHOTS, Console, _need_browser, expect
from tests.process_support import stop, wait_until
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]
DOC_SHOTS = ROOT / "docs" / "console"
EVIL_USER = '<img src=x onerror="window.__xss=1">'
EVIL_LABEL = "<script>window.__xss=1</script>"
# A job id (namespace/pod, under a prefix of no scheduler GPU Warden drives, so not held to
# one's spelling) with the characters that break a raw link.
ODD_JOB = "ray:ml team/train-7f9c|run?1#a%b ü"
# Live data moves between the page's read and the test's: a GPU at $4/h earns 2 cents in 20 s.
USD_TOLERANCE = 0.25


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`gpuwarden demo` in a fresh folder on a free port, with a reader and an admin token."""
    _need_browser()
    folder = tmp_path_factory.mktemp("console-demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    env["PYTHONPATH"] = str(ROOT)
    port = free_port()
    log = folder / "demo.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "demo", "--port", str(port)],
            cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        tokens_file = folder / "gpuwarden-data" / "demo-tokens.json"

        def up() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                return tokens_file.exists() and httpx.get(f"{base}/healthz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_until("the demo to serve", up, timeout=90)
        reader = json.loads(tokens_file.read_text())["reader"]
        reader = reader if isinstance(reader, str) else reader["secret"]
        made = subprocess.run(
            [sys.executable, "-m", "service.cli", "token", "create", "--role", "admin",
             "--name", "console test"],
            cwd=folder, env=env, capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        admin = made.stdout.strip().splitlines()[-1]
        api = httpx.Client(
            base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {admin}"}, timeout=30
        )

        def alerts_and_jobs() -> bool:
            firing = api.get("/alerts", params={"state": "firing"}).json()
            return bool(firing) and bool(api.get("/jobs").json())

        def fleet_has_its_dollars() -> bool:
            # The fleet's dollars are kept up to 15 s: the jobs added below share a GPU, which
            # moves its waste, and the page must show the figures that followed.
            fleet = {g["uuid"]: g["waste_usd"] or 0 for g in api.get("/fleet").json()["gpus"]}
            report = api.get(
                "/reports/cost", params={"group_by": "gpu", "start": "today", "end": "now"}
            ).json()["rows"]
            return all(
                abs(fleet.get(r["key"], 0) - (r["waste_usd"] or 0)) <= USD_TOLERANCE / 2
                for r in report
            )

        wait_until("a firing alert and the demo's jobs", alerts_and_jobs, timeout=150)
        gpu = api.get("/gpus").json()[0]["uuid"]
        started = (datetime.now(UTC) - timedelta(minutes=20)).isoformat()
        r = api.post(
            "/jobs",
            json={"id": "evil:1", "user": EVIL_USER, "team": "red", "gpus": [gpu],
                  "labels": {"note": EVIL_LABEL}, "started_at": started},
        )  # fmt: skip
        assert r.status_code in (200, 201), r.text
        r = api.post("/jobs", json={"id": ODD_JOB, "gpus": [gpu], "started_at": started})
        assert r.status_code in (200, 201), r.text
        # The jobs reach the rollups' shares a round later, and the fleet's cache after that.
        posted = datetime.now(UTC)

        def settled() -> bool:
            until = datetime.fromisoformat(api.get("/fleet").json()["dollars_until"])
            return until > posted + timedelta(seconds=20) and fleet_has_its_dollars()

        wait_until("the fleet's dollars to follow the new jobs", settled, timeout=120)
        yield {
            "base": base, "reader": reader, "admin": admin, "api": api, "folder": folder,
            "env": env,
        }  # fmt: skip
        api.close()
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def browser(demo: dict[str, Any]) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def admin(browser: Any, demo: dict[str, Any]) -> Iterator[Console]:
    console = Console(browser, demo["base"])
    console.login(demo["admin"])
    yield console
    console.context.close()


def test_login_page_and_the_session_cookie(browser: Any, demo: dict[str, Any]) -> None:
    console = Console(browser, demo["base"])
    console.page.goto(demo["base"] + "/jobs")
    console.page.wait_for_url("**/login?next=%2Fjobs")
    console.page.fill("#token", "gw_not-a-token")
    console.page.click("#login-form button[type=submit]")
    console.page.wait_for_selector("text=Unknown or revoked token.")
    console.page.fill("#token", "")
    console.shot("login")
    console.page.fill("#token", demo["reader"])
    console.page.click("#login-form button[type=submit]")
    console.page.wait_for_url(demo["base"] + "/jobs")
    console.ready()
    (cookie,) = console.context.cookies()
    assert cookie["name"] == "gw_session" and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert demo["reader"] not in cookie["value"]
    assert console.page.evaluate("document.cookie") == ""  # HttpOnly: no script can read it
    assert console.page.evaluate("localStorage.length + sessionStorage.length") == 0
    assert demo["reader"] not in console.page.url
    # A reader sees the silences but no form to make or end one.
    console.open("/alerts")
    assert console.page.locator("#silence-form").count() == 0
    console.page.click("#logout")
    console.page.wait_for_url("**/login")
    assert console.context.cookies() == []
    console.context.close()


def test_fleet_page_matches_the_api(admin: Console, demo: dict[str, Any]) -> None:
    admin.open("/")
    api = demo["api"]
    gpus = api.get("/gpus").json()
    report = api.get(
        "/reports/cost", params={"group_by": "gpu", "start": "today", "end": "now"}
    ).json()
    rows = admin.page.locator("#fleet tbody tr")
    assert rows.count() == len(gpus) == 15
    wasted = {r["key"]: r["waste_usd"] for r in report["rows"]}
    assert admin.usd("#waste-today .v") == pytest.approx(
        sum(v or 0 for v in wasted.values()), abs=USD_TOLERANCE * 4
    )
    for gpu in gpus[:5]:
        cell = f'#fleet tr[data-uuid="{gpu["uuid"]}"] td[data-usd]'
        if wasted.get(gpu["uuid"]) is not None:
            assert admin.usd(cell) == pytest.approx(wasted[gpu["uuid"]], abs=USD_TOLERANCE)
    idle_held = [g for g in gpus if g["state"] == "idle-held"]
    assert admin.page.locator("#fleet .state-idle-held").count() == len(idle_held) > 0
    admin.shot("fleet")
    admin.page.select_option("#filter-node", "demo-node-1")
    expect(rows).to_have_count(sum(g["node"] == "demo-node-1" for g in gpus))
    assert not admin.errors, admin.errors


def test_fleet_page_reads_a_page_at_a_time_and_shows_more_on_demand(
    admin: Console, demo: dict[str, Any]
) -> None:
    # The console asks for a page of 200; at 4 a page the demo's 15 GPUs take four reads.
    asked: list[str] = []

    def smaller_pages(route: Any) -> None:
        url = route.request.url.replace("limit=200", "limit=4")
        asked.append(url)
        route.continue_(url=url)

    # The admin page is the module's: the smaller pages must not outlive this test.
    admin.page.route("**/api/v1/fleet?*", smaller_pages)
    try:
        admin.open("/")
        whole = demo["api"].get("/fleet").json()
        rows = admin.page.locator("#fleet tbody tr")
        expect(rows).to_have_count(4)
        assert admin.page.inner_text("#fleet-count").startswith("4 of 15 GPUs")
        # The cards count and sum every GPU, not the page.
        assert admin.page.inner_text("#fleet-cards .card .v") == "15"
        assert admin.usd("#waste-today .v") == pytest.approx(
            whole["waste_usd"], abs=USD_TOLERANCE * 4
        )
        for shown in (8, 12, 15):
            admin.page.click("#fleet-more")
            expect(rows).to_have_count(shown)
        expect(admin.page.locator("#fleet-more")).to_be_hidden()
        # Page after page, the rows are the service's one order (worst first), none twice.
        order = rows.evaluate_all("rs => rs.map(r => r.dataset.uuid)")
        assert order == [g["uuid"] for g in whole["gpus"]]
        assert [u.split("offset=")[-1] if "offset=" in u else "0" for u in asked] == [
            "0",
            "4",
            "8",
            "12",
        ]
    finally:
        admin.page.unroute("**/api/v1/fleet?*")
    assert not admin.errors, admin.errors


def test_jobs_page_reads_a_page_at_a_time_and_shows_more_on_demand(
    admin: Console, demo: dict[str, Any]
) -> None:
    # The console asks for 100 jobs a page; at 2 a page the demo's jobs take several reads.
    asked: list[str] = []

    def smaller_pages(route: Any) -> None:
        asked.append(route.request.url)
        route.continue_(url=route.request.url.replace("limit=100", "limit=2"))

    whole = demo["api"].get("/jobs", params={"start": "today-6d"})
    jobs = [j["id"] for j in whole.json()]
    assert len(jobs) == int(whole.headers["X-Total-Count"]) >= 3
    admin.page.route("**/api/v1/jobs?*", smaller_pages)
    try:
        admin.open("/jobs")
        rows = admin.page.locator("#jobs tbody tr")
        expect(rows).to_have_count(2)
        counted = admin.page.inner_text("#jobs-count")
        assert counted.startswith(f"2 of {len(jobs)} jobs") and " from " in counted
        # "Last 7 days" is whole UTC days, today included: the day sums serve all but today.
        assert "start=today-6d" in asked[0]
        while admin.page.locator("#jobs-more").is_visible():
            shown = rows.count()
            admin.page.click("#jobs-more")
            expect(rows).to_have_count(min(shown + 2, len(jobs)))
        assert rows.evaluate_all("rs => rs.map(r => r.dataset.job)") == jobs
    finally:
        admin.page.unroute("**/api/v1/jobs?*")
    assert not admin.errors, admin.errors


def _green(page: Any, selector: str) -> bool:
    """Whether the element is drawn in the console's "ok" green (text or background)."""
    return bool(
        page.eval_on_selector(
            selector,
            """e => { const ok = getComputedStyle(document.documentElement)
                        .getPropertyValue("--ok").trim();
                      const probe = document.createElement("span");
                      probe.style.color = ok; document.body.append(probe);
                      const green = getComputedStyle(probe).color; probe.remove();
                      const s = getComputedStyle(e);
                      return s.color === green || s.backgroundColor === green; }""",
        )
    )


def test_fleet_shows_no_green_working_state_on_a_transfer_bound_gpu(
    admin: Console, demo: dict[str, Any]
) -> None:
    gpus = demo["api"].get("/fleet").json()["gpus"]
    copy = next(g for g in gpus if g["cause"] == "transfer_bound" and g["state"] != "no-data")
    working = next(g for g in gpus if g["cause"] == "compute_tensor" and g["state"] == "working")
    admin.open("/")
    chip = f'#fleet tr[data-uuid="{copy["uuid"]}"] .chip[class*="state-"]'
    assert admin.page.inner_text(chip) == "underused"
    assert not _green(admin.page, chip)
    # The healthy GPU's chip is the green one: the check above can tell them apart.
    assert _green(admin.page, f'#fleet tr[data-uuid="{working["uuid"]}"] .chip[class*="state-"]')
    assert admin.page.locator('#fleet tr[data-state="working"] .c-transfer_bound').count() == 0
    # Busy SMs whose fix saves a large share (no tensor cores: 72%; memory-bound: 50%) are
    # amber too, never green working (issue 50).
    for cause in ("compute_no_tensor", "memory_bound"):
        busy = next(g for g in gpus if g["cause"] == cause and g["state"] != "no-data")
        assert busy["state"] == "underused", busy
        chip = f'#fleet tr[data-uuid="{busy["uuid"]}"] .chip[class*="state-"]'
        assert admin.page.inner_text(chip) == "underused"
        assert not _green(admin.page, chip)
    assert not admin.errors, admin.errors


def test_fleet_filters_by_state_and_cause_and_the_cards_follow(
    admin: Console, demo: dict[str, Any]
) -> None:
    api = demo["api"]
    admin.open("/?state=underused")
    want = api.get("/fleet", params={"state": "underused"}).json()
    rows = admin.page.locator("#fleet tbody tr")
    expect(rows).to_have_count(len(want["gpus"]))
    assert len(want["gpus"]) >= 3  # the demo's launch-bound, input-starved and copy GPUs
    assert admin.page.locator('#fleet tbody tr:not([data-state="underused"])').count() == 0
    # The cards count and add up the filtered GPUs, not the fleet.
    assert admin.page.inner_text('#fleet-cards [data-state="underused"] .v') == str(
        len(want["gpus"])
    )
    assert admin.page.inner_text('#fleet-cards [data-state="working"] .v') == "0"
    assert admin.usd("#waste-today .v") == pytest.approx(want["waste_usd"], abs=USD_TOLERANCE * 2)
    fleet_usd = api.get("/fleet").json()["waste_usd"]
    assert admin.usd("#waste-today .v") < fleet_usd - 1.0
    admin.page.select_option("#filter-state", "")
    admin.page.select_option("#filter-cause", "transfer_bound")
    expect(rows).to_have_count(1)
    assert admin.page.url.endswith("/?cause=transfer_bound")
    assert admin.page.inner_text("#fleet-cards .card .v") == "1"
    assert not admin.errors, admin.errors


def test_jobs_page_ranks_by_waste_and_shows_markup_as_text(
    admin: Console, demo: dict[str, Any]
) -> None:
    admin.open("/jobs")
    jobs = demo["api"].get("/jobs", params={"start": "today-6d"}).json()
    rows = admin.page.locator("#jobs tbody tr")
    assert rows.count() == len(jobs)
    shown = [
        float(v or "-1")
        for v in rows.evaluate_all("rs => rs.map(r => r.querySelector('td[data-usd]').dataset.usd)")
    ]
    assert shown == sorted(shown, reverse=True)
    top = max(jobs, key=lambda j: j["waste_usd"] or -1)
    assert rows.first.get_attribute("data-job") == top["id"]
    assert shown[0] == pytest.approx(top["waste_usd"], abs=USD_TOLERANCE)
    evil = admin.page.locator('#jobs tr[data-job="evil:1"]')
    assert EVIL_LABEL in evil.inner_text()
    admin.no_script_ran()
    admin.shot("jobs")
    assert not admin.errors, admin.errors


def test_a_read_turned_away_as_busy_is_asked_again(browser: Any, demo: dict[str, Any]) -> None:
    """The service answers a read past its bound 503 with Retry-After: the jobs page asks
    again after it and shows the jobs, rather than an error."""
    console = Console(browser, demo["base"])
    console.login(demo["admin"])
    asked: list[str] = []

    def busy_once(route: Any) -> None:
        asked.append(route.request.url)
        if len(asked) == 1:
            route.fulfill(status=503, headers={"Retry-After": "1"}, body='{"detail": "busy"}')
        else:
            route.continue_()

    console.page.route("**/api/v1/jobs?*", busy_once)
    console.open("/jobs")
    assert len(asked) == 2
    assert console.page.locator("#jobs tbody tr").count() > 0
    console.context.close()


def test_job_page_shows_causes_timelines_advice_and_alerts(
    admin: Console, demo: dict[str, Any]
) -> None:
    jobs = demo["api"].get("/jobs", params={"start": "today-6d"}).json()
    top = max(jobs, key=lambda j: j["waste_usd"] or -1)
    job = demo["api"].get(f"/jobs/{top['id']}").json()
    admin.open(f"/jobs/{top['id']}")
    assert admin.usd("#job-waste") == pytest.approx(job["summary"]["waste_usd"], abs=USD_TOLERANCE)
    assert "idle $" in admin.page.inner_text("#job-cards") and "(estimated)" in (
        admin.page.inner_text("#job-cards")
    )
    legend = admin.page.locator("#job-causes + .legend .item")
    causes = {c for c, f in job["summary"]["causes"].items() if f["seconds"] > 0}
    assert set(legend.evaluate_all("xs => xs.map(x => x.dataset.cause)")) == causes
    recs = admin.page.locator("#job-recs li")
    assert recs.count() == max(1, len(job.get("recommendations") or []))
    gpus = {g["gpu_uuid"] for g in job["gpus"]}
    admin.page.wait_for_function(f"document.querySelectorAll('.uplot').length >= {2 * len(gpus)}")
    admin.shot("job", full_page=True)
    assert not admin.errors, admin.errors

    admin.open("/jobs/evil:1")
    assert EVIL_LABEL in admin.page.inner_text("#job-labels")
    assert EVIL_USER in admin.page.inner_text("main .sub")
    admin.no_script_ran()
    assert not admin.errors, admin.errors


def test_job_page_shows_the_unit_of_work(admin: Console, demo: dict[str, Any]) -> None:
    """A job that reports no progress counts its GPU time per whole run; one that reports
    progress shows GPU-seconds per unit of it, as GET /jobs/{id} has it (issue 46)."""
    jobs = demo["api"].get("/jobs", params={"start": "today-6d"}).json()
    plain = next(j["id"] for j in jobs if j["id"] not in ("evil:1", ODD_JOB))
    admin.open(f"/jobs/{plain}")
    assert admin.page.inner_text("#job-work-value") == "whole run"
    assert "no progress reported" in admin.page.inner_text("#job-work")
    now = datetime.now(UTC)
    for at, value in ((now - timedelta(minutes=15), 0), (now - timedelta(minutes=1), 6400)):
        r = demo["api"].post(
            "/jobs/evil:1/progress", json={"unit": "samples", "value": value, "at": at.isoformat()}
        )
        assert r.status_code == 201, r.text
    job = demo["api"].get("/jobs/evil:1").json()
    admin.open("/jobs/evil:1")
    per = job["gpu_seconds_per_unit"]
    shown = admin.page.inner_text("#job-work-value")
    assert shown.endswith(" GPU-s per sample")
    assert float(shown.split()[0]) == pytest.approx(per, rel=1e-3)
    assert "6,400 samples" in admin.page.inner_text("#job-work")
    assert not admin.errors, admin.errors


def test_the_copy_bound_job_is_not_sent_to_a_slice_and_percentages_name_their_base(
    admin: Console, demo: dict[str, Any]
) -> None:
    gpus = demo["api"].get("/fleet", params={"cause": "transfer_bound"}).json()["gpus"]
    job_id = next(g["job"] for g in gpus if g["job"])
    admin.open(f"/jobs/{quote(job_id, safe='')}")
    kinds = admin.page.locator("#job-recs li").evaluate_all("xs => xs.map(x => x.dataset.kind)")
    assert "mig" not in kinds and "cause" in kinds
    text = admin.page.inner_text("#job-recs")
    job = demo["api"].get(f"/jobs/{quote(job_id, safe='')}").json()
    fix = next(f for f in job["recommendations"] if f["cause"] == "transfer_bound")
    # The percentage is of the cause's own dollars, and says so.
    assert f"{round(fix['saving_fraction'] * 100)}% of transfer_bound's $" in text, text
    assert not admin.errors, admin.errors


def test_the_xid_job_page_names_the_fault(admin: Console, demo: dict[str, Any]) -> None:
    api = demo["api"]
    lost = [g for g in api.get("/gpus").json() if g["lost"]]
    assert lost  # the demo's xid-then-lost scenario
    jobs = api.get("/jobs", params={"start": "today-6d"}).json()
    faulted = []
    for j in jobs:
        detail = api.get(f"/jobs/{quote(j['id'], safe='')}").json()
        if detail["faults"]:
            faulted.append(detail)
    assert faulted, "no demo job names its GPU's XID"
    job = faulted[0]
    xid = next(f for f in job["faults"] if f["kind"] == "xid")
    admin.open(f"/jobs/{quote(job['id'], safe='')}")
    text = admin.page.inner_text("#job-faults")
    assert "Hardware fault" in text
    assert f"{xid['node']} GPU {xid['gpu_index']}: hardware XID {xid['xid']} at " in text
    assert "fell off the bus" in text
    admin.shot("job-fault")
    assert not admin.errors, admin.errors


WIDTHS = [1400, 1024, 800]


@pytest.fixture(scope="module", params=WIDTHS, ids=lambda w: f"{w}px")
def sized(request: pytest.FixtureRequest, browser: Any, demo: dict[str, Any]) -> Iterator[Console]:
    """A logged-in admin page at 1400, 1024 and 800 px wide."""
    console = Console(browser, demo["base"], width=request.param)
    console.login(demo["admin"])
    yield console
    console.context.close()


def _width(console: Console) -> int:
    return int(console.page.viewport_size["width"])


def test_job_pages_read_their_series_in_one_request_and_are_never_turned_away(
    sized: Console, demo: dict[str, Any]
) -> None:
    """Every demo job page, one after the other as a user walks them: one series read per
    page, and no answer of the walk is a 503 (the pages used to fire 6 reads per GPU at once
    past the service's bound of 2 expensive reads)."""
    jobs = demo["api"].get("/jobs", params={"start": "today-6d"}).json()
    answers: list[tuple[int, str]] = []
    sized.page.on("response", lambda r: answers.append((r.status, r.url)))
    for job in jobs:
        answers.clear()
        sized.open("/jobs/" + quote(job["id"], safe=""))
        sized.page.wait_for_selector("#job-series:not([data-loading])")
        series = [u for _, u in answers if "/series" in u]
        assert len(series) == 1 and "/api/v1/gpus/series?" in series[0], series
        assert [a for a in answers if a[0] == 503] == [], job["id"]
        assert sized.page.locator("#job-series .busy").count() == 0
    assert not sized.errors, sized.errors


def test_a_series_read_still_refused_says_busy_and_asks_again_on_retry(
    sized: Console, demo: dict[str, Any]
) -> None:
    job = demo["api"].get("/jobs", params={"start": "today-6d"}).json()[0]
    refused: list[str] = []

    def busy(route: Any) -> None:
        refused.append(route.request.url)
        route.fulfill(status=503, headers={"Retry-After": "1"}, body='{"detail": "busy"}')

    sized.page.route("**/api/v1/gpus/series?*", busy)
    sized.open("/jobs/" + quote(job["id"], safe=""))
    notice = sized.page.locator("#job-series .busy")
    expect(notice).to_contain_text("busy, retry")
    assert len(refused) == 4  # the first read and its three retries
    assert sized.page.locator("#job-series .uplot").count() == 0  # no empty lines drawn
    sized.page.unroute("**/api/v1/gpus/series?*")
    sized.page.click("#series-retry")
    expect(sized.page.locator("#job-series .uplot").first).to_be_visible()
    assert sized.page.locator("#job-series .busy").count() == 0
    sized.errors.clear()  # the refused reads log themselves as failed loads


def _inside(inner: dict[str, float], outer: dict[str, float]) -> bool:
    return (
        inner["x"] >= outer["x"] - 0.5
        and inner["x"] + inner["width"] <= outer["x"] + outer["width"] + 0.5
    )


def test_job_charts_show_every_series_on_its_own_unit_with_utc_times(
    sized: Console, demo: dict[str, Any]
) -> None:
    jobs = demo["api"].get("/jobs", params={"start": "today-6d"}).json()
    listed = next(j for j in jobs if j["top_cause"] == "transfer_bound")
    copy = demo["api"].get("/jobs/" + quote(listed["id"], safe="")).json()
    sized.open("/jobs/" + quote(copy["id"], safe=""))
    sized.page.wait_for_selector("#job-series .uplot")
    gpus = sized.page.locator("#job-series .gpu")
    assert gpus.count() == len({g["gpu_uuid"] for g in copy["gpus"]}) >= 1
    # One panel per unit, so lines of different units never share (and hide under) one axis.
    units = gpus.first.locator(".chart").evaluate_all("ps => ps.map(p => p.dataset.chart)")
    assert units == ["ratio", "bytes_per_second", "bytes"]
    page_width = _width(sized)
    for panel in sized.page.locator("#job-series .chart:has(.uplot)").all():
        box = panel.bounding_box()
        assert box is not None and box["x"] + box["width"] <= page_width
        for part in (".uplot", ".u-legend", ".u-axis"):
            for piece in panel.locator(part).all():
                assert _inside(piece.bounding_box(), box), (part, panel.get_attribute("data-chart"))
        ticks = json.loads(panel.get_attribute("data-ticks") or "[]")
        assert len(ticks) >= 2 and len(set(ticks)) == len(ticks), ticks
        times = json.loads(panel.get_attribute("data-time-ticks") or "[]")
        assert times and all(t.endswith("Z") and ":" in t for t in times), times
        assert not any("am" in t.lower() or "pm" in t.lower() for t in times), times
    pcie = gpus.first.locator('.chart[data-chart="bytes_per_second"]')
    legend = pcie.locator(".u-legend .u-series th").all_inner_texts()
    assert [t.strip() for t in legend] == ["time (UTC)", "PCIe tx", "PCIe rx"]
    ticks = json.loads(pcie.get_attribute("data-ticks") or "[]")
    assert ticks[0].startswith("0") and ticks[-1].split()[-1].endswith("B/s")
    # The transfer-bound GPU moves data: its PCIe axis reaches above zero.
    assert float(ticks[-1].split()[0]) > 0
    pcie.locator(".u-over").hover()
    shown = pcie.locator(".u-legend .u-series").first.locator(".u-value").inner_text()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ", shown), shown
    sized.shot(f"job-charts-{_width(sized)}", full_page=True)
    assert not sized.errors, sized.errors


def test_a_job_with_an_odd_id_opens_from_its_link_and_an_alert_link_marks_its_row(
    admin: Console, demo: dict[str, Any]
) -> None:
    admin.open("/jobs")
    row = admin.page.locator(f"#jobs tr[data-job={json.dumps(ODD_JOB, ensure_ascii=False)}]")
    link = row.locator("a").first
    assert link.get_attribute("href") == "/jobs/" + quote(ODD_JOB, safe="")
    link.click()
    admin.page.wait_for_url("**/jobs/ray*")
    admin.ready()
    assert admin.page.inner_text("main h1") == f"Job {ODD_JOB}"
    assert not admin.errors, admin.errors

    (alert, *_) = demo["api"].get("/alerts", params={"state": "firing"}).json()
    admin.open(f"/alerts#alert-{alert['id']}")
    marked = admin.page.locator("#alerts tr.target")
    assert marked.count() == 1 and marked.get_attribute("data-alert") == str(alert["id"])
    assert not admin.errors, admin.errors


def test_costs_page_matches_the_report_and_downloads_csv(
    admin: Console, demo: dict[str, Any]
) -> None:
    admin.open("/costs")
    report = (
        demo["api"]
        .get("/reports/cost", params={"group_by": "team", "start": "today-6d", "end": "now"})
        .json()
    )
    assert admin.usd("#total-waste") == pytest.approx(
        report["totals"]["waste_usd"], abs=USD_TOLERANCE * 4
    )
    assert admin.page.locator("#costs tbody tr").count() == len(report["rows"])
    # GPU-hours beside the dollars: the waste card and a column of the table.
    shown_hours = admin.page.get_attribute("#total-waste", "data-gpu-hours")
    assert shown_hours is not None
    assert float(shown_hours) == pytest.approx(report["totals"]["waste_gpu_hours"], abs=0.1)
    assert admin.page.locator("#costs th", has_text="waste GPU-h").count() == 1
    assert admin.page.locator("#cost-chart .track").count() == min(20, len(report["rows"]))
    href = admin.page.get_attribute("#csv", "href")
    assert href is not None and "format=csv" in href
    csv = admin.page.request.get(demo["base"] + href)  # with the session cookie, no token
    assert csv.status == 200 and csv.headers["content-type"].startswith("text/csv")
    assert csv.text().splitlines()[0].startswith("team,")
    admin.page.select_option("#group-by", "node")
    admin.page.wait_for_selector("#costs th >> text=node")
    admin.shot("costs")
    # Kubernetes groupings: by namespace, and by a job label typed beside "label".
    admin.page.select_option("#group-by", "namespace")
    admin.page.wait_for_selector("#costs th >> text=namespace")
    admin.page.select_option("#group-by", "label")
    admin.page.fill("#label-key", "app.kubernetes.io/name")
    admin.page.press("#label-key", "Enter")
    admin.page.wait_for_selector("#costs th >> text=label:app.kubernetes.io/name")
    assert admin.page.locator("#costs tbody tr", has_text="__unlabelled__").count() == 1
    assert not admin.errors, admin.errors


def test_alerts_page_lists_alerts_and_an_admin_silences_and_expires(
    admin: Console, demo: dict[str, Any]
) -> None:
    admin.open("/alerts")
    alerts = demo["api"].get("/alerts", params={"limit": 500}).json()
    shown = admin.page.locator("#alerts tbody tr").evaluate_all(
        "rs => rs.map(r => Number(r.dataset.alert))"
    )
    assert shown and set(shown) <= {a["id"] for a in alerts}
    admin.page.fill("#silence-matchers", "node=demo-node-2, policy=gpu-*")
    admin.page.fill("#silence-comment", "driver update on demo-node-2")
    admin.page.click("#silence-form button[type=submit]")
    admin.page.wait_for_selector("#silences .st-active")
    (silence,) = [s for s in demo["api"].get("/silences").json() if s["status"] == "active"]
    assert silence["matchers"] == {"node": "demo-node-2", "policy": "gpu-*"}
    admin.shot("alerts", full_page=True)
    admin.page.click(f'#silences tr[data-silence="{silence["id"]}"] button')
    admin.page.wait_for_selector(f'#silences tr[data-silence="{silence["id"]}"] .st-expired')
    assert not admin.errors, admin.errors


@pytest.mark.parametrize(("path", "ready"), [("/docs", ".swagger-ui .info"), ("/redoc", "h1")])
def test_api_docs_render_offline(browser: Any, demo: dict[str, Any], path: str, ready: str) -> None:
    console = Console(browser, demo["base"])
    outside: list[str] = []
    local = (demo["base"], "blob:", "data:")
    console.page.on(
        "response", lambda r: outside.append(r.url) if not r.url.startswith(local) else None
    )
    console.page.goto(demo["base"] + path)
    console.page.wait_for_selector(ready, timeout=60_000)
    assert "GPU Warden" in console.page.inner_text("body")
    # ReDoc's footer shows its logo from cdn.redoc.ly: the CSP blocks it, nothing is fetched.
    assert not outside, outside
    assert all("logo-mini.svg" in e for e in console.errors), console.errors
    if path == "/docs":
        console.shot("docs")
    console.context.close()


def test_screenshots_are_small_pngs() -> None:
    """The committed screenshots the docs show, every one, and those this run took before
    this test (later tests take the rest)."""
    names = ("login", "fleet", "jobs", "job", "costs", "alerts", "docs", "user")
    paths = [DOC_SHOTS / f"{name}.png" for name in names]
    paths += [p for name in names if (p := SHOTS / f"{name}.png").exists()]
    for path in paths:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(data) < 600_000, (path, len(data))


# `next` values that would leave the console: backslashes (browsers read `/\host` as `//host`),
# protocol-relative, encoded, tab-split, dot-segment and scheme forms.
OFFSITE_NEXT = [
    "/\\evil.example/",
    "\\\\evil.example/",
    "//evil.example/",
    "/%2Fevil.example/",
    "%2F%2Fevil.example/",
    "/\t/evil.example/",
    "/.//evil.example/",
    "https://evil.example/",
    "http:evil.example",
    "javascript:window.__xss=1",
    "/static/../../evil.example",
    "/openapi.json",
]


def test_login_follows_next_only_to_console_paths(browser: Any, demo: dict[str, Any]) -> None:
    from urllib.parse import quote

    targets: list[tuple[str, str]] = [(quote(n, safe=""), "/") for n in OFFSITE_NEXT]
    # The issue's own form, sent as typed: %5C is a backslash.
    targets.append(("/%5Cevil.example/", "/"))
    targets.append((quote("/costs#top", safe=""), "/costs#top"))
    for query, landing in targets:
        context = browser.new_context()
        offsite: list[str] = []

        def watch(route: Any, request: Any, offsite: list[str] = offsite) -> None:
            if request.url.startswith(demo["base"]):
                route.continue_()
            else:
                offsite.append(request.url)
                route.abort()

        context.route("**/*", watch)
        page = context.new_page()
        page.goto(f"{demo['base']}/login?next={query}")
        page.fill("#token", demo["reader"])
        page.click("#login-form button[type=submit]")
        try:
            page.wait_for_url(demo["base"] + landing, timeout=30_000)
        except Exception:
            # A navigation the route handler aborted: say where it went.
            assert offsite == [], (query, offsite)
            raise
        page.wait_for_load_state("load")
        assert offsite == [], (query, offsite)
        assert page.evaluate("window.__xss") is None, query
        context.close()


def test_costs_and_jobs_keep_their_choices_in_the_url(sized: Console) -> None:
    sized.open("/costs")
    sized.page.select_option("#group-by", "node")
    # Attached, not visible: at 800 px the table may collapse into labelled cells (headers
    # hidden), depending on how wide its figures have grown.
    sized.page.wait_for_selector("#costs th >> text=node", state="attached")
    sized.page.click("#cost-presets button >> text=24 h")
    sized.page.wait_for_url("**/costs?group_by=node&start=-24h")
    sized.ready()
    link = sized.page.url
    sized.page.reload()
    sized.ready()
    assert sized.page.input_value("#group-by") == "node"
    assert sized.page.input_value("#start") == "-24h"
    assert sized.page.locator("#costs th").first.text_content() == "node"
    # The link opens the same view in another browser.
    other = Console(sized.page.context.browser, sized.base, width=_width(sized))
    other.context.add_cookies(sized.context.cookies())
    other.open(link.removeprefix(sized.base))
    assert other.page.input_value("#group-by") == "node"
    other.context.close()
    sized.open("/jobs")
    sized.page.select_option("#range", "30d")
    sized.page.wait_for_url("**/jobs?since=30d")
    sized.page.reload()
    sized.ready()
    assert sized.page.input_value("#range") == "30d"
    assert not sized.errors, sized.errors


# The console's pages with tables, each table's id and its waste column's header (None: none).
TABLE_PAGES: list[tuple[str, str, str | None]] = [
    ("/", "fleet", "$ waste today"),
    ("/jobs", "jobs", "waste"),
    ("/costs", "costs", "waste"),
    ("/alerts", "alerts", None),
    ("/alerts", "silences", None),
    ("/actions", "actions", None),
    ("/users/user0", "owner-gpus", "waste today"),
    ("/users/user0", "owner-jobs", "waste"),
]

FITS = """t => {
  const box = t.closest('.tablebox'), wrap = t.closest('.tablewrap');
  return !!box.dataset.fit && wrap.scrollWidth <= wrap.clientWidth + 1;
}"""


def test_every_table_fits_its_page_and_its_waste_column_stays_on_screen(sized: Console) -> None:
    """Issue 50: the fleet table needed 1,402 px and the alerts table 1,476; at 800 px the
    waste column was off-screen. A table fits as it is, compact, or collapsed into labelled
    cells: never wider than its frame, the page never scrolls sideways, the waste in view."""
    width = _width(sized)
    fits: dict[str, str] = {}
    needs: dict[str, Any] = {}
    for path, table_id, waste in TABLE_PAGES:
        if sized.page.url != sized.base + path:
            sized.open(path)
        table = sized.page.locator(f"#{table_id}")
        if table.count() == 0:
            continue  # no row to show (silences, actions): no table
        sized.page.wait_for_function(FITS, arg=table.element_handle(), timeout=10_000)
        assert sized.page.evaluate("document.documentElement.scrollWidth") <= width, path
        fits[table_id] = table.evaluate("t => t.closest('.tablebox').dataset.fit")
        needs[table_id] = table.evaluate(
            "t => { const b = t.closest('.tablebox'), f = b.dataset.fit; b.classList.remove(f);"
            " const w = [t.scrollWidth, t.closest('.tablewrap').clientWidth]; b.classList.add(f);"
            " return w; }"
        )
        if waste is None:
            continue
        cells = table.locator(f'tbody td[data-label="{waste}"]')
        assert cells.count() > 0, (path, table_id)
        cell = cells.first
        cell.scroll_into_view_if_needed()
        box = cell.bounding_box()
        assert box is not None and cell.is_visible(), (path, table_id)
        assert box["x"] >= 0 and box["x"] + box["width"] <= width, (path, table_id, box)
    assert {"fleet", "jobs", "costs", "alerts"} <= set(fits)
    if width <= 800:
        assert fits["fleet"] == "collapsed"  # 13 columns do not fit 800 px even compact
    if width >= 1400:
        assert fits["fleet"] in ("full", "compact") and fits["alerts"] in ("full", "compact"), (
            fits,
            needs,
        )
    sized.open("/")
    sized.shot(f"fleet-{width}")
    assert not sized.errors, sized.errors


def test_a_new_silence_marks_its_alerts_at_once_and_expire_is_reachable(
    sized: Console, demo: dict[str, Any]
) -> None:
    api = demo["api"]
    firing = api.get("/alerts", params={"state": "firing"}).json()
    target = next(a for a in firing if a["labels"].get("node") and not a["silenced"])
    node, policy = target["labels"]["node"], target["policy"]
    sized.open("/alerts")
    row = sized.page.locator(f'#alerts tr[data-alert="{target["id"]}"]')
    assert "silenced" not in row.inner_text()
    sized.page.fill("#silence-matchers", f"node={node}, policy={policy}")
    sized.page.fill("#silence-comment", f"console test at {_width(sized)} px")
    sized.page.click("#silence-form button[type=submit]")
    sized.page.wait_for_selector("#silences .st-active")
    # Marked at once: no evaluation has to run first.
    expect(row).to_contain_text("silenced")
    (silence,) = [s for s in api.get("/silences").json() if s["status"] == "active"]
    expire = sized.page.locator(f'#silences tr[data-silence="{silence["id"]}"] button')
    expire.scroll_into_view_if_needed()
    box = expire.bounding_box()
    assert box is not None and box["x"] + box["width"] <= _width(sized)
    sized.shot(f"alerts-{_width(sized)}", full_page=True)
    expire.click()
    sized.page.wait_for_selector(f'#silences tr[data-silence="{silence["id"]}"] .st-expired')
    expect(row).not_to_contain_text("silenced")
    assert not sized.errors, sized.errors


def test_an_unknown_job_shows_its_error_alone_and_an_unknown_path_a_404_page(
    sized: Console,
) -> None:
    sized.page.goto(sized.base + "/jobs/" + quote("no/such job", safe=""))
    sized.page.wait_for_selector("body[data-ready]")
    text = sized.page.inner_text("main")
    assert "does not exist" in text and "no/such job" in text
    assert "Loading" not in text
    sized.shot(f"job-unknown-{_width(sized)}")
    answer = sized.page.goto(sized.base + "/no/such/page")
    assert answer is not None and answer.status == 404
    assert answer.headers["content-type"].startswith("text/html")
    sized.ready()
    assert sized.page.inner_text("main h1") == "Page not found"
    assert sized.page.locator("#not-found a[href='/costs']").count() == 1
    sized.shot(f"not-found-{_width(sized)}")
    sized.errors.clear()  # the 404s log themselves as failed loads


def test_a_users_page_shows_their_gpus_jobs_and_waste_as_the_api_does(
    admin: Console, demo: dict[str, Any]
) -> None:
    """From the jobs page a user's name opens their page (the periodic report links there with
    the report's week in the URL); its figures are the cost report's for that user."""
    admin.open("/jobs")
    admin.page.locator('#jobs a[href="/users/user0"]').first.click()
    admin.page.wait_for_url("**/users/user0")
    admin.ready()
    report = demo["api"].get("/reports/cost", params={"group_by": "job", "user": "user0",
                                                       "start": "today-6d", "end": "now"}).json()  # fmt: skip
    totals = report["totals"]
    assert admin.usd("#owner-cost") == pytest.approx(totals["cost_usd"], abs=USD_TOLERANCE * 4)
    assert admin.usd("#owner-waste") == pytest.approx(totals["waste_usd"], abs=USD_TOLERANCE * 4)
    # "Waste by cause" shows the causes that waste (compute_tensor wastes nothing); waste only
    # grows, so a cause the page shows has waste in the report read after it.
    shown_causes = admin.page.locator(".panel:has(#owner-causes) .legend .item").evaluate_all(
        "items => items.map(i => i.dataset.cause)"
    )
    wasting = {c for c, v in totals["causes"].items() if (v.get("waste_usd") or 0) > 0}
    assert shown_causes and set(shown_causes) <= wasting, (shown_causes, totals["causes"])
    assert "compute_tensor" not in shown_causes
    jobs = [r["key"] for r in report["rows"] if r["key"] != "__unallocated__"]
    shown = admin.page.locator("#owner-jobs tbody tr").evaluate_all(
        "rs => rs.map(r => r.dataset.job)"
    )
    assert sorted(shown) == sorted(jobs) and jobs
    fleet = demo["api"].get("/fleet").json()["gpus"]
    held = sorted(g["uuid"] for g in fleet if g["user"] == "user0")
    gpus = admin.page.locator("#owner-gpus tbody tr").evaluate_all(
        "rs => rs.map(r => r.dataset.gpu)"
    )
    assert sorted(gpus) == held
    admin.shot("user")
    # The report's link: its week in the URL, kept on reload; the team's page from a job row.
    admin.open("/users/user0?start=2026-01-05T00:00:00Z&end=now")
    assert admin.page.input_value("#start") == "2026-01-05T00:00:00Z"
    admin.page.click("#owner-presets button >> text=24 h")
    admin.page.wait_for_url("**/users/user0?start=-24h")
    admin.ready()
    admin.page.locator("#owner-jobs tbody a[href^='/teams/']").first.click()
    admin.page.wait_for_url("**/teams/vision?start=-24h")
    admin.ready()
    assert admin.page.inner_text("h1") == "Team vision"
    assert not admin.errors, admin.errors


def test_a_users_page_shows_markup_in_a_name_as_text(admin: Console) -> None:
    admin.open("/users/" + quote(EVIL_USER, safe=""))
    assert admin.page.inner_text("h1") == f"User {EVIL_USER}"
    assert admin.page.locator("#owner-jobs tbody tr").count() == 1  # evil:1
    admin.no_script_ran()
    assert not admin.errors, admin.errors
