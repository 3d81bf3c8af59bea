"""What the actions tests share: recorded ladder steps and the API's answer to them."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import Engine

from service.db import actions_repo
from service.db.rows import NewAction
from tests.alerting_support import auth

# (minutes before now, policy, job, user, team, action, outcome, step)
STEPS = [
    (200, "gpu-idle", "slurm:1", "ana", "vision", "notify_owner", "warned", 0),
    (150, "gpu-idle", "slurm:1", "ana", "vision", "notify_owner", "warned", 1),
    (130, "gpu-idle", "slurm:1", "ana", "vision", "reclaim", "reclaimed", 2),
    (90, "gpu-idle", "slurm:2", "bo", "nlp", "reclaim", "failed", 2),
    (60, "held-dry", "k8s:ml/train-0", "cy", "vision", "reclaim", "would", 1),
    (30, "held-dry", "slurm:3", "bo", "nlp", "notify_owner", "skipped", None),
]
DETAILS = {"failed": "scancel 2: timed out", "would": "DELETE /api/v1/namespaces/ml/pods/train-0"}


def record_steps(engine: Engine, now: datetime) -> list[int]:
    """The STEPS in the audit log, oldest first; their ids."""
    ids = []
    with engine.begin() as conn:
        for minutes, policy, job, user, team, action, outcome, step in STEPS:
            row_id = actions_repo.record_action(
                conn,
                NewAction(
                    at=now - timedelta(minutes=minutes), policy=policy, job_id=job,
                    user=user, team=team, action=action, outcome=outcome,
                    dry_run=outcome == "would", step=step,
                    driver="slurm" if action == "reclaim" else None,
                    reason="exempt: user bo" if outcome == "skipped" else None,
                    detail=DETAILS.get(outcome),
                    value=0.01, threshold=0.05, since=now - timedelta(minutes=260),
                    waste_usd=12.5, idle_usd=12.5,
                ),
            )  # fmt: skip
            ids.append(row_id)
    return ids


def record_skip(engine: Engine, *, at: datetime, job_id: str, user: str, reason: str) -> None:
    """A warning of policy gpu-idle skipped for ``reason`` (text that may hold markup)."""
    with engine.begin() as conn:
        actions_repo.record_action(
            conn,
            NewAction(
                at=at, policy="gpu-idle", job_id=job_id, user=user, action="notify_owner",
                outcome="skipped", dry_run=False, reason=reason,
            ),
        )  # fmt: skip


def get(http: httpx.Client, token: str, **params: Any) -> httpx.Response:
    return http.get("/api/v1/actions", params=params, headers=auth(token))


def outcomes(r: httpx.Response) -> list[str]:
    assert r.status_code == 200, r.text
    return [a["outcome"] for a in r.json()]
