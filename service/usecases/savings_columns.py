"""The cost report's proven-savings columns (issue 46): realised and promised USD per job,
user, team or project, from the savings the savings round stored, summed in cents so they
reconcile with the savings ledger."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from service.costs.savings import cents
from service.db import savings_repo
from service.roles import JobScope
from service.usecases.costing.day_sums import UNKNOWN

SAVINGS_GROUP_BYS = ("job", "user", "team", "project")


def add_savings(
    conn: Connection,
    data: dict[str, Any],
    *,
    start: datetime,
    end: datetime,
    user: str | None = None,
    team: str | None = None,
    scope: JobScope | None = None,
) -> None:
    """Set ``realised_usd`` and ``promised_usd`` on a cost report's rows and totals: the booked
    savings of the later runs that ended in [start, end) (the report's filters and scope
    applied), per group; null for groupings by hardware or label."""
    group_by = data["group_by"]
    if group_by not in SAVINGS_GROUP_BYS:
        for row in [*data["rows"], data["totals"]]:
            row["realised_usd"] = row["promised_usd"] = None
        return
    by_group: dict[str, list[int]] = {}
    total = [0, 0]
    for b in savings_repo.booked_between(conn, start=start, end=end):
        if (user is not None and b.user != user) or (team is not None and b.team != team):
            continue
        if scope is not None and not scope.allows(b.user, b.team):
            continue
        key = b.job_id if group_by == "job" else getattr(b, group_by) or UNKNOWN
        sums = by_group.setdefault(key, [0, 0])
        for i, usd in enumerate((b.realised_usd, b.promised_usd)):
            sums[i] += cents(usd or 0.0)
            total[i] += cents(usd or 0.0)
    for row in data["rows"]:
        realised, promised = by_group.get(row["key"], [0, 0])
        row["realised_usd"], row["promised_usd"] = realised / 100, promised / 100
    data["totals"]["realised_usd"], data["totals"]["promised_usd"] = total[0] / 100, total[1] / 100
