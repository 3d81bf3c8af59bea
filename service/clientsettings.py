"""The settings of the CLI's HTTP commands: service URL, reader token, state directory, log level.

``gpuwarden gpus``, ``job`` and ``report`` make one HTTP call; building the full pydantic
``Settings`` would cost them more CPU than the call itself. These fields are declared here, and
``service.settings.Settings`` takes its defaults and environment prefix from this class, so both
read the same variables with the same defaults.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_PREFIX = "GPUWARDEN_"


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
