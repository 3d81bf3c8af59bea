"""Hypothesis example counts that follow the loaded profile (tests/conftest.py selects it)."""

from __future__ import annotations

import hypothesis

# Examples a profile runs by default: Hypothesis's own 100 in CI, a tenth in the local loop.
FULL_EXAMPLES = 100
DEV_EXAMPLES = 10


def examples(full: int) -> int:
    """A property's example count: ``full`` under CI's profile, scaled with a profile that runs
    fewer (the local loop's ``dev`` runs a tenth, at least one)."""
    return max(1, full * hypothesis.settings().max_examples // FULL_EXAMPLES)
