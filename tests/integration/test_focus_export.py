"""The FOCUS export (``format=focus``, ``report cost --focus``) on SQLite and PostgreSQL: one
charge per job or GPU per UTC day, totals equal to the cost report's to the cent, and the
FinOps Foundation's focus-validator passes it."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from service.cli.main import main
from service.costs.focus import COLUMNS
from service.settings import Settings
from service.usecases.costing import cost_days
from tests.integration.cost_data import roll_up, store_series, worked_example_metrics
from tests.support import FakeClock, auth, iso

T0 = datetime(2026, 12, 1, 23, 20, tzinfo=UTC)  # an hour of samples across midnight
START, END = datetime(2026, 12, 1, 22, 0, tzinfo=UTC), datetime(2026, 12, 2, 2, 0, tzinfo=UTC)
PRICE = 3.17  # USD per GPU-hour: cents that do not come out even
# (id, GPU, user/team/project, start, minutes): slurm:11 runs across midnight.
JOBS = (
    ("slurm:11", "GPU-a0", {"user": "alice", "team": "vision", "project": "resnet"}, T0, 47),
    ("slurm:12", "GPU-a0", {"user": "bob", "team": "nlp"}, T0 + timedelta(minutes=47), 13),
    ("slurm:13", "GPU-a1", {"user": "carol"}, T0 + timedelta(minutes=11), 13),
)  # fmt: skip


def cents(value: float) -> Decimal:
    return Decimal(repr(value)).quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN)


@pytest.fixture
def fleet(engine: Engine, clock: FakeClock, http: httpx.Client, tokens) -> None:
    """Two H100s sampled 23:20-00:20, priced at $3.17, held by three jobs and by none."""
    store_series(engine, clock, uuid="GPU-a0", start=T0, metrics=worked_example_metrics())
    store_series(engine, clock, uuid="GPU-a1", start=T0, index=1,
                 metrics=[{"sm_active": 0.9, "tensor_active": 0.6}] * 360)  # fmt: skip
    roll_up(engine)
    prices = [{"model_pattern": "*H100*", "usd_per_gpu_hour": PRICE,
               "effective_from": "2026-01-01T00:00:00Z"}]  # fmt: skip
    http.put("/api/v1/prices", json=prices, headers=auth(tokens["admin"])).raise_for_status()
    for job_id, gpu, owner, start, minutes in JOBS:
        body = {"id": job_id, **owner, "gpus": [gpu], "started_at": iso(start),
                "ended_at": iso(start + timedelta(minutes=minutes))}  # fmt: skip
        http.post("/api/v1/jobs", json=body, headers=auth(tokens["admin"])).raise_for_status()


def report(
    http: httpx.Client, token: str, group_by: str, fmt: str, end: datetime = END
) -> httpx.Response:
    params = {"start": iso(START), "end": iso(end), "group_by": group_by, "format": fmt}
    return http.get("/api/v1/reports/cost", params=params, headers=auth(token))


def focus_csv(http: httpx.Client, token: str, group_by: str, end: datetime = END) -> str:
    r = report(http, token, group_by, "focus", end)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "text/csv; charset=utf-8"
    return r.text


def parse(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text, newline="")))


@pytest.mark.parametrize("group_by", ["job", "gpu"])
def test_focus_rows_add_up_to_the_cost_report_to_the_cent(
    http: httpx.Client, tokens, fleet, group_by: str
) -> None:
    text = focus_csv(http, tokens["reader"], group_by)
    assert text.splitlines()[0].split(",") == list(COLUMNS)
    rows = parse(text)
    totals = report(http, tokens["reader"], group_by, "json").json()["totals"]
    assert totals["cost_usd"] > 0 and totals["waste_usd"] > 0
    for column, figure in (("BilledCost", "cost_usd"), ("EffectiveCost", "cost_usd"),
                           ("ListCost", "cost_usd"), ("x_WasteCost", "waste_usd"),
                           ("x_IdleCost", "idle_usd"), ("x_FixableCost", "fixable_usd")):  # fmt: skip
        assert sum(Decimal(r[column]) for r in rows) == cents(totals[figure]), column
    gpu_hours = sum(Decimal(r["ConsumedQuantity"]) for r in rows)
    assert float(gpu_hours) == pytest.approx(totals["held_seconds"] / 3600, abs=1e-5)
    assert {(r["ChargeCategory"], r["ConsumedUnit"], r["BillingCurrency"]) for r in rows} == {
        ("Usage", "GPU-Hours", "USD")
    }
    # Each charge is one UTC day's, inside the window, in December's billing period.
    periods = {(r["ChargePeriodStart"], r["ChargePeriodEnd"]) for r in rows}
    assert periods <= {("2026-12-01T22:00:00Z", "2026-12-02T00:00:00Z"),
                       ("2026-12-02T00:00:00Z", "2026-12-02T02:00:00Z")}  # fmt: skip
    assert {(r["BillingPeriodStart"], r["BillingPeriodEnd"]) for r in rows} == {
        ("2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z")
    }
    assert {r["SkuId"] for r in rows} == {"NVIDIA H100 80GB HBM3"}


def test_a_whole_day_read_from_the_day_sums_adds_up_too(
    http: httpx.Client, tokens, fleet, engine: Engine, clock: FakeClock, settings: Settings
) -> None:
    # A day later the GPUs have been held all of 2 December (no job, no samples): the cost
    # day sums hold that day, and both the report and the day's charge read it from them.
    clock.set(datetime(2026, 12, 3, 12, 0, tzinfo=UTC))
    assert cost_days.write_days(engine, settings=settings, clock=clock, budget_seconds=1e9) > 0
    end = datetime(2026, 12, 3, 2, 0, tzinfo=UTC)
    rows = parse(focus_csv(http, tokens["reader"], "gpu", end))
    totals = report(http, tokens["reader"], "gpu", "json", end).json()["totals"]
    assert sum(Decimal(r["BilledCost"]) for r in rows) == cents(totals["cost_usd"])
    whole = [r for r in rows if r["ChargePeriodStart"] == "2026-12-02T00:00:00Z"]
    assert [(r["ChargePeriodEnd"], Decimal(r["ConsumedQuantity"])) for r in whole] == [
        ("2026-12-03T00:00:00Z", Decimal(24))
    ] * 2  # fmt: skip
    assert sum(Decimal(r["BilledCost"]) for r in whole) == cents(2 * 24 * PRICE)


def test_a_job_across_midnight_is_two_charges_with_its_tags_and_waste(
    http: httpx.Client, tokens, fleet
) -> None:
    rows = [
        r for r in parse(focus_csv(http, tokens["reader"], "job")) if r["ResourceId"] == "slurm:11"
    ]
    # 23:20-00:00 and 00:00-00:07 of one GPU.
    assert [(r["ChargePeriodStart"][:10], Decimal(r["ConsumedQuantity"])) for r in rows] == [
        ("2026-12-01", Decimal("0.666667")), ("2026-12-02", Decimal("0.116667"))
    ]  # fmt: skip
    first = rows[0]
    assert json.loads(first["Tags"]) == {"user": "alice", "team": "vision", "project": "resnet"}
    assert first["ResourceType"] == "GPU job" and Decimal(first["ListUnitPrice"]) == Decimal("3.17")
    # 30 min at SM 0 holding memory, then busy: its first 30 minutes are idle waste.
    assert first["x_TopWasteCause"] == "idle_held"
    assert Decimal(first["x_IdleCost"]) == cents(PRICE / 2) == Decimal(first["x_WasteCost"])
    assert Decimal(first["BilledCost"]) == cents(PRICE * 40 / 60)
    unallocated = [
        r for r in parse(focus_csv(http, tokens["reader"], "job")) if not r["ResourceId"]
    ]
    assert unallocated and {r["ChargeDescription"] for r in unallocated} == {"GPU time no job held"}


def test_focus_groups_by_job_or_gpu_over_at_most_92_days(http: httpx.Client, tokens) -> None:
    r = report(http, tokens["reader"], "team", "focus")
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "group_by"]
    params = {"since": "93d", "format": "focus"}
    r = http.get("/api/v1/reports/cost", params=params, headers=auth(tokens["reader"]))
    assert r.status_code == 422 and "at most 92 UTC days" in r.text, r.text
    params = {"start": "2026-09-01", "end": "2026-12-02", "format": "focus"}  # 92 days
    r = http.get("/api/v1/reports/cost", params=params, headers=auth(tokens["reader"]))
    assert r.status_code == 200 and r.text.splitlines() == [",".join(COLUMNS)]


def test_the_cli_prints_the_same_focus_csv(
    capsys: pytest.CaptureFixture[str], server: str, http: httpx.Client, tokens, fleet
) -> None:
    args = ["report", "cost", "--url", server, "--token", tokens["reader"], "--start", iso(START),
            "--end", iso(END), "--focus"]  # fmt: skip
    assert main(args) == 0
    assert capsys.readouterr().out == focus_csv(http, tokens["reader"], "job")


# focus-validator 1.0.0, the FinOps Foundation's only release on PyPI, checks FOCUS 1.0 but
# still names five columns as the 1.0 preview did: its rules read them under those names.
VALIDATOR_NAMES = {"ProviderName": "Provider", "PublisherName": "Publisher",
                   "InvoiceIssuerName": "InvoiceIssuer", "ResourceId": "ResourceID"}  # fmt: skip
COPIED = {"ChargeType": "ChargeCategory"}  # SkuPriceId's rule reads ChargeType


def validator_python() -> str:
    """A Python with focus_validator (the dev extra's, or GPUWARDEN_FOCUS_VALIDATOR_PYTHON)."""
    python = os.environ.get("GPUWARDEN_FOCUS_VALIDATOR_PYTHON", sys.executable)
    found = subprocess.run(
        [python, "-c", "import focus_validator"], capture_output=True, check=False
    )
    if found.returncode != 0:
        why = f"focus-validator is not installed for {python} (pip install -e '.[dev]')"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return python


def for_the_validator(rows: list[dict[str, str]], path: Path) -> None:
    """``rows`` as the validator reads them: its five column names, every value unchanged."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, [VALIDATOR_NAMES.get(c, c) for c in COLUMNS] + list(COPIED))
        w.writeheader()
        for r in rows:
            w.writerow({**{VALIDATOR_NAMES.get(c, c): v for c, v in r.items()},
                        **{new: r[old] for new, old in COPIED.items()}})  # fmt: skip


def validate(python: str, data: Path) -> dict[str, Any]:
    """focus-validator's verdict on ``data`` under FOCUS 1.0: its JUnit counts."""
    out = data.with_suffix(".xml")
    # The validator reads its currency codes from a path relative to its package's parent.
    where = subprocess.run([python, "-c", "import focus_validator, pathlib; "
                            "print(pathlib.Path(focus_validator.__file__).parent.parent)"],
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    done = subprocess.run(
        [python, "-c", "from focus_validator.main import main; main()", "--data-file", str(data),
         "--validate-version", "1.0", "--output-type", "unittest", "--output-destination", str(out)],
        cwd=where, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    suites = ET.parse(out).getroot()
    failed = [c.get("name") for c in suites.iter("testcase") if len(c)]
    return {**{k: int(suites.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")},
            "failed": failed}  # fmt: skip


def test_the_focus_validator_passes_the_export(
    http: httpx.Client, tokens, fleet, tmp_path: Path
) -> None:
    python = validator_python()
    rows = parse(focus_csv(http, tokens["reader"], "job"))
    for_the_validator(rows, tmp_path / "focus.csv")
    verdict = validate(python, tmp_path / "focus.csv")
    assert verdict["tests"] >= 130  # every FOCUS 1.0 rule it has, none skipped
    assert (verdict["failures"], verdict["errors"], verdict["skipped"], verdict["failed"]) == (
        0, 0, 0, []
    )  # fmt: skip
    # The same check fails a file that breaks the spec: a charge with no BilledCost.
    broken = [{**rows[0], "BilledCost": "", "ChargeFrequency": "Sometimes"}, *rows[1:]]
    for_the_validator(broken, tmp_path / "broken.csv")
    verdict = validate(python, tmp_path / "broken.csv")
    assert verdict["failures"] >= 2, verdict
