"""Which central holds the evaluator's leader lock, as its /metrics says."""

from __future__ import annotations

import re

import httpx


def is_leader(url: str) -> bool:
    try:
        text = httpx.get(url + "/metrics", timeout=30).text  # a slow answer is not "no"
    except httpx.HTTPError:
        return False
    return re.search(r"^gpuwarden_evaluator_leader 1\.0$", text, re.M) is not None
