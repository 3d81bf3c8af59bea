"""GPU prices read from a running OpenCost (``GPUWARDEN_OPENCOST_URL``): its ``/allocation/compute``
answer by node, refreshed every ``opencost_refresh_seconds``; a failed read keeps the prices last
read and logs, never raises."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
from sqlalchemy import Connection

from service.costs.opencost import OpenCostAnswerError, model_prices, node_gpu_costs
from service.costs.prices import PriceRow, mig_share
from service.db.costing import costs_repo
from service.settings import Settings

log = logging.getLogger(__name__)

# OpenCost's prices are today's: they price every hour GPU Warden has, as far back as it goes.
EFFECTIVE_FROM = datetime(2000, 1, 1, tzinfo=UTC)
TIMEOUT_SECONDS = 5.0
RETRY_SECONDS = 300.0  # after a failed read, the next try (sooner than a refresh)


@dataclass(slots=True)
class Known:
    """What one OpenCost URL last answered: its price rows, when (monotonic, and UTC), and the
    last failure since then (None after a good read)."""

    rows: tuple[PriceRow, ...] = ()
    read_at: datetime | None = None
    next_read: float = 0.0
    problem: str | None = None


_known: dict[str, Known] = {}
_lock = threading.Lock()


def allocation_url(base: str) -> str:
    """The ``/allocation/compute`` endpoint of an OpenCost base URL."""
    return base.rstrip("/") + "/allocation/compute"


def _models_of_node(conn: Connection) -> dict[str, set[str]]:
    """The GPU models of each node GPU Warden knows (a MIG instance counted as its parent)."""
    out: dict[str, set[str]] = {}
    for info in costs_repo.load_gpus(conn).values():
        mig = mig_share(info.model)
        out.setdefault(info.node, set()).add(mig[0] if mig is not None else info.model)
    return out


def read_opencost(conn: Connection, settings: Settings) -> list[PriceRow]:
    """The price rows of one read of OpenCost now; raises on any failure."""
    assert settings.opencost_url is not None
    response = httpx.get(
        allocation_url(settings.opencost_url),
        params={"window": settings.opencost_window, "aggregate": "node", "accumulate": "true"},
        timeout=TIMEOUT_SECONDS,
        follow_redirects=False,
    )
    response.raise_for_status()
    costs = node_gpu_costs(response.json())
    return model_prices(
        costs, _models_of_node(conn), effective_from=EFFECTIVE_FROM, where=settings.opencost_url
    )


def opencost_known(conn: Connection, settings: Settings) -> Known:
    """What OpenCost last answered, read again first when the last read is older than the
    refresh interval (or failed more than ``RETRY_SECONDS`` ago)."""
    url = settings.opencost_url or ""
    with _lock:
        known = _known.setdefault(url, Known())
        if time.monotonic() < known.next_read:
            return known
        try:
            rows = read_opencost(conn, settings)
        except (httpx.HTTPError, httpx.InvalidURL, OpenCostAnswerError, ValueError) as exc:
            known.problem = f"OpenCost at {url} could not be read ({exc.__class__.__name__}: {exc})"
            retry = min(RETRY_SECONDS, settings.opencost_refresh_seconds)
            known.next_read = time.monotonic() + retry
            log.warning("%s; keeping the prices last read", known.problem)
            return known
        known.rows, known.read_at, known.problem = tuple(rows), datetime.now(UTC), None
        known.next_read = time.monotonic() + settings.opencost_refresh_seconds
        log.info("OpenCost at %s priced %d GPU models", url, len(rows))
        return known


def opencost_problem(settings: Settings) -> str | None:
    """What a report says about OpenCost's last read: its failure and which prices stand in."""
    if not settings.opencost_url:
        return None
    known = _known.get(settings.opencost_url)
    if known is None:
        return None
    if known.problem is None:
        if known.read_at is not None and not known.rows:
            return (
                f"OpenCost at {settings.opencost_url} priced no GPU on a node GPU Warden knows "
                "(no gpuCost, or other node names): prices are the price table's"
            )
        return None
    if known.rows and known.read_at is not None:
        return f"{known.problem}; prices are those it gave at {known.read_at:%Y-%m-%d %H:%MZ}"
    return f"{known.problem}; prices are the price table's until it answers"


def forget() -> None:
    """Drop every URL's last answer (tests, and a settings reload)."""
    with _lock:
        _known.clear()
