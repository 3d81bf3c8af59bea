"""Prometheus-style duration strings ("30s", "15m", "1h30m", "7d") to seconds and back."""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")


def parse_duration(text: str) -> float:
    """Seconds in ``text`` ("90s", "15m", "1h30m"); a bare number is seconds; ValueError else."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    pos, total = 0, 0.0
    for m in _PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or pos == 0:
        raise ValueError(f"{text!r} is not a duration like 30s, 15m, 4h or 7d")
    return total


def format_duration(seconds: float) -> str:
    """The shortest Prometheus-style string for ``seconds`` ("15m", "1h30m", "45s")."""
    if seconds == 0:
        return "0s"
    out, rest = "", seconds
    for unit in ("w", "d", "h", "m", "s"):
        size = _UNITS[unit]
        if rest >= size:
            n = int(rest // size)
            out += f"{n}{unit}"
            rest -= n * size
    if rest > 1e-9 or not out:
        out += f"{round(rest * 1000)}ms"
    return out
