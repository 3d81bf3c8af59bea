"""The ladder's actions as /metrics counts them."""

from __future__ import annotations

import httpx

from tests.integration.metrics_support import scrape


def actions(http: httpx.Client) -> dict[tuple[str, str, str], float]:
    return {
        (labels["policy"], labels["action"], labels["outcome"]): value
        for labels, value in scrape(http).get("gpuwarden_actions_total", [])
    }
