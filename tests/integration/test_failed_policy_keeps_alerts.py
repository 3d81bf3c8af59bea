"""A policy that cannot be evaluated in one round keeps its open alerts: the leader's cache of
open alerts still holds them, so the next round carries them on instead of opening new ones."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest

from service.usecases.evaluation import StateCache, evaluate_once
from service.usecases.evaluation import rounds as evaluation
from tests.alerting_support import auth
from tests.support import FakeClock, make_batch

POLICY = {"name": "low-sm", "metric": "sm_active", "aggregate": "avg", "window": "5m",
          "op": "<", "threshold": 0.9, "for": "0s", "scope": "gpu", "severity": "warning",
          "channels": []}  # fmt: skip


def alerts(http: httpx.Client, tokens: dict[str, str]) -> list[tuple[int, str, str]]:
    """(id, GPU, state) of every alert the API lists."""
    r = http.get("/api/v1/alerts", headers=auth(tokens["reader"]))
    assert r.status_code == 200, r.text
    return sorted((a["id"], a["labels"]["gpu_uuid"], a["state"]) for a in r.json())


def test_a_round_that_fails_a_policy_keeps_its_alerts_for_the_next(
    app: Any, http: httpx.Client, tokens: dict[str, str], clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    r = http.post("/api/v1/policies", json=POLICY, headers=auth(tokens["admin"]))
    assert r.status_code == 201, r.text
    batch = make_batch(start=clock() - timedelta(minutes=3), count=18,
                       gpu_uuids=("GPU-a0", "GPU-a1"), metrics={"sm_active": 0.2})  # fmt: skip
    r = http.post("/api/v1/ingest", json=batch, headers=auth(tokens["agent"]))
    assert r.status_code == 200, r.text
    cache = StateCache()
    assert evaluate_once(app.state.ctx, cache=cache).failed_policies == []
    fired = alerts(http, tokens)
    assert [(g, s) for _, g, s in fired] == [("GPU-a0", "firing"), ("GPU-a1", "firing")]

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a window read failed")

    with monkeypatch.context() as m:
        m.setattr(evaluation, "_observe", broken)
        assert evaluate_once(app.state.ctx, cache=cache).failed_policies == ["low-sm"]
    assert alerts(http, tokens) == fired
    result = evaluate_once(app.state.ctx, cache=cache)
    assert result.failed_policies == [] and result.transitions == 0
    assert alerts(http, tokens) == fired  # the same alerts, still firing, none opened anew
