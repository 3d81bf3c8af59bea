"""Column types shared by the schema and the migrations."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored as UTC and always returned timezone-aware (SQLite keeps no zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise ValueError(f"timestamps must be timezone-aware datetimes, got {value!r}")
        utc: datetime = value.astimezone(UTC)
        if dialect.name == "sqlite":
            # SQLite compares the stored text, so every value must be written in one form.
            return utc.replace(tzinfo=None)
        return utc

    def result_processor(self, dialect: Dialect, coltype: Any) -> Any:
        if dialect.name != "sqlite":
            return super().result_processor(dialect, coltype)

        # SQLite hands back the stored text: parse it aware in one C call, which is 5x faster
        # than SQLAlchemy's parse followed by datetime.replace(tzinfo=...).
        def process(value: Any) -> datetime | None:
            if isinstance(value, str):
                return datetime.fromisoformat(value + "+00:00")
            return self.process_result_value(value, dialect)

        return process

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        stored: datetime = value
        if stored.tzinfo is UTC:  # PostgreSQL sessions run in UTC (engine.py)
            return stored
        if stored.tzinfo is None:
            return stored.replace(tzinfo=UTC)
        return stored.astimezone(UTC)
