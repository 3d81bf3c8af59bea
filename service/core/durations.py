"""Prometheus duration strings ("30s", "15m", "1h30m", "7d") to seconds and back.

``parse_duration`` follows Prometheus's own parser (``model.ParseDuration``): integer amounts, units
from largest to smallest, each unit at most once, "0" the only bare number; so "30m1h", "1.5h" and
"1h1h" are refused as Prometheus refuses them. ``parse_duration_param`` reads a query parameter as
Prometheus's HTTP API does: float seconds ("90", "2.5") or a Prometheus duration.
"""

from __future__ import annotations

import math
import re
from typing import Any

# Largest first: the order a Prometheus duration must use.
_UNITS: dict[str, int] = {
    "y": 31_536_000_000,
    "w": 604_800_000,
    "d": 86_400_000,
    "h": 3_600_000,
    "m": 60_000,
    "s": 1_000,
    "ms": 1,
}
_PART = re.compile(r"(\d+)(ms|[ywdhms])")
_FLOAT = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
# Prometheus keeps durations in int64 milliseconds.
_MAX_MS = 2**63 - 1
_FORMS = "like 30s, 15m, 1h30m or 7d (integer amounts, largest unit first, each unit once)"


def parse_duration(text: str) -> float:
    """Seconds in the Prometheus duration ``text`` ("90s", "15m", "1h30m"); ValueError otherwise."""
    text = text.strip()
    if text == "0":
        return 0.0
    pos, total_ms, last_rank = 0, 0, -1
    ranks = list(_UNITS)
    for m in _PART.finditer(text):
        if m.start() != pos:
            break
        rank = ranks.index(m.group(2))
        if rank <= last_rank:
            order = "is repeated" if rank == last_rank else "comes after a smaller unit"
            raise ValueError(f"{text!r} is not a duration {_FORMS}: {m.group(2)!r} {order}")
        last_rank = rank
        total_ms += int(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or pos == 0:
        raise ValueError(f"{text!r} is not a duration {_FORMS}")
    if total_ms > _MAX_MS:
        raise ValueError(f"{text!r} is not a duration: too long")
    return total_ms / 1000


def parse_duration_param(text: str) -> float:
    """Seconds in a query parameter: float seconds ("90", "2.5") or a Prometheus duration ("5m").

    As Prometheus's HTTP API reads ``step`` or ``timeout``; negative, infinite and NaN are refused.
    """
    text = text.strip()
    if _FLOAT.fullmatch(text):
        seconds = float(text)
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"{text!r} is not a duration: seconds must be finite and not negative")
        return seconds
    try:
        return parse_duration(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a duration: give seconds (90, 2.5) or a duration like 30s or 1h30m"
        ) from None


# The longest duration a policy's window, for, repeat interval or a ladder step may have (raw
# data is kept days, not years; longer would overflow date arithmetic at evaluation time).
MAX_SPEC_SECONDS = 366 * 86400


def spec_duration(field: str, value: Any, *, allow_zero: bool, like: str) -> str:
    """``value`` (a duration, or seconds) as a policy or ladder field keeps it; else ValueError."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = f"{value}s"
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a duration like {like}")
    seconds = parse_duration(value)  # its ValueError names the accepted forms
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ValueError(f"{field} must be greater than 0s")
    if seconds > MAX_SPEC_SECONDS:
        raise ValueError(f"{field} must be at most 366d")
    return value.strip()
