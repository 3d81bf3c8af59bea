"""Stored rows read into the core's frozen dataclasses, field by field, by column name."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")


def record_of(cls: type[T], row: Any, **column_of: str) -> T:
    """A ``cls`` dataclass from ``row``: each field read from the column of its name, or the one
    ``column_of`` names for it; a field typed bool reads the stored 0/1 flag as a bool."""
    values = {}
    for f in fields(cls):  # type: ignore[arg-type]
        value = getattr(row, column_of.get(f.name, f.name))
        # Annotations are strings here (postponed evaluation), so the flag's type is "bool".
        values[f.name] = bool(value) if f.type in ("bool", bool) else value
    return cls(**values)
