"""Matching through the app on both stores (issue 46): a run told a fix is compared with its
first later run whose work did not change, past a run of other work in between."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx

from tests.savings_support import FIXED, STARVED, add_run
from tests.support import FakeClock, auth


def _savings(http: httpx.Client, tokens: dict[str, str], job_id: str) -> dict[str, Any] | None:
    r = http.get(f"/api/v1/jobs/{job_id}", headers=auth(tokens["reader"]))
    assert r.status_code == 200, r.text
    return r.json()["savings"]  # type: ignore[no-any-return]


def test_the_fix_applied_after_other_work_is_measured_against_the_told_run(
    http: httpx.Client, tokens: dict[str, str], clock: FakeClock
) -> None:
    t0 = clock() - timedelta(hours=5)
    add_run(http, tokens, "manual:bert-1", t0, 30, STARVED, None)  # told to feed the GPU
    # Four times as long, no progress: other work (and told nothing: no waste).
    add_run(http, tokens, "manual:bert-2", t0 + timedelta(minutes=40), 120, FIXED, None)
    add_run(http, tokens, "manual:bert-3", t0 + timedelta(minutes=170), 12, FIXED, None)
    middle = _savings(http, tokens, "manual:bert-2")
    assert middle is not None and middle["compared_with"] == "manual:bert-1"
    assert middle["verdict"] == "not_compared"
    assert middle["reason"].startswith("duration outside the key's usual spread")
    # The run just before it was told nothing; the told run is the one compared.
    fixed = _savings(http, tokens, "manual:bert-3")
    assert fixed is not None and fixed["compared_with"] == "manual:bert-1", fixed
    assert (fixed["verdict"], fixed["unit"], fixed["fix_cause"]) == (
        "saved",
        "run",
        "input_starved",
    )
    assert fixed["realised_fraction"] > 0.5
