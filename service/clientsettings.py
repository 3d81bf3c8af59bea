"""The settings of the CLI's HTTP commands: service URL, reader token, state directory, log level.

``gpuwarden gpus``, ``job`` and ``report`` make one HTTP call; building the full pydantic
``Settings`` would cost them more CPU than the call itself. These fields are declared here, and
``service.settings.Settings`` takes its defaults and environment prefix from this class, so both
read the same variables with the same defaults.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_PREFIX = "GPUWARDEN_"
DEFAULT_DATABASE_URL = "sqlite:///./gpuwarden.db"
_TRUE = frozenset({"1", "true", "yes", "on", "t", "y"})
_FALSE = frozenset({"0", "false", "no", "off", "f", "n", ""})


def normalize_database_url(value: str) -> str:
    """``value`` checked as a SQLite or PostgreSQL URL, ``postgresql://`` given psycopg's suffix;
    ValueError naming the accepted forms otherwise."""
    if not re.match(r"^(sqlite|postgresql)(\+\w+)?://", value):
        raise ValueError("must start with sqlite:// or postgresql+psycopg://")
    if value.startswith("postgresql://"):
        # psycopg 3 is the driver we ship; spare users the driver suffix.
        value = "postgresql+psycopg://" + value.split("://", 1)[1]
    return value


@dataclass(frozen=True)
class DatabaseClientSettings:
    """The database a token command opens: the URL given (None: not given, so a running ``up``'s
    or the default), whether PostgreSQL's own database may be used, and the state directory."""

    database_url: str | None = None
    database_allow_maintenance: bool = False
    state_dir: Path | None = None
    log_level: str = "INFO"

    @classmethod
    def load(cls, overrides: Mapping[str, Any], env: Mapping[str, str]) -> DatabaseClientSettings:
        """Flags in ``overrides`` (None: not given) over ``GPUWARDEN_*`` variables in ``env``;
        ValueError naming the setting when one is malformed."""
        by_name = {k.upper(): v for k, v in env.items()}

        def given(name: str) -> Any:
            value = overrides.get(name)
            return by_name.get(ENV_PREFIX + name.upper()) if value is None else value

        url, allow, state, level = (
            given(n)
            for n in ("database_url", "database_allow_maintenance", "state_dir", "log_level")
        )
        try:
            url = None if url is None else normalize_database_url(str(url))
        except ValueError as exc:
            raise ValueError(f"database_url: {exc}") from None
        if isinstance(allow, str):
            if allow.strip().lower() not in _TRUE | _FALSE:
                raise ValueError("database_allow_maintenance: must be true or false")
            allow = allow.strip().lower() in _TRUE
        return cls(
            database_url=url,
            database_allow_maintenance=bool(allow),
            state_dir=None if state is None else Path(state),
            log_level=str(level or cls.log_level),
        )


@dataclass(frozen=True)
class ClientSettings:
    """Where the central service is, the reader token sent to it, the local state folder."""

    central_url: str = "http://127.0.0.1:8000"
    api_token: str | None = None
    state_dir: Path | None = None
    log_level: str = "INFO"
    # The fields a flag or GPUWARDEN_* variable set (as pydantic's ``model_fields_set``).
    given: frozenset[str] = field(default=frozenset(), compare=False)

    @classmethod
    def load(cls, overrides: Mapping[str, Any], env: Mapping[str, str]) -> ClientSettings:
        """Flags in ``overrides`` (None: not given) over ``GPUWARDEN_*`` variables in ``env``."""
        by_name = {k.upper(): v for k, v in env.items()}
        values: dict[str, Any] = {}
        for name in ("central_url", "api_token", "state_dir", "log_level"):
            value = overrides.get(name)
            if value is None:
                value = by_name.get(ENV_PREFIX + name.upper())
            if value is not None:
                values[name] = Path(value) if name == "state_dir" else str(value)
        return cls(**values, given=frozenset(values))

    def replace(self, **changes: Any) -> ClientSettings:
        """A copy with ``changes``; fields changed here do not count as given."""
        return dataclasses.replace(self, **changes)
