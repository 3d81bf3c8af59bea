"""The optional YAML config file (policies, channels, prices, owners), `${VAR}`s expanded.

Apart from ``service.settings`` so that ``gpuwarden policies check`` reads a file without building
the pydantic settings.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from service.errors import ConfigError

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_env(value: Any) -> Any:
    """Replace ``${VAR}`` references in strings (recursively) with environment values."""
    if isinstance(value, str):

        def repl(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise ConfigError(f"environment variable {name} is referenced but not set")
            return os.environ[name]

        return _ENV_REF.sub(repl, value)
    if isinstance(value, list):
        return [expand_env(v) for v in value]
    if isinstance(value, dict):
        return {k: expand_env(v) for k, v in value.items()}
    return value


CONFIG_KEYS = ("policies", "channels", "prices", "owners")  # the top level of the YAML config file


def load_config_file(path: Path | None) -> dict[str, Any]:
    """Read the optional YAML config file (policies, channels, prices, owners), ``${VAR}``s
    expanded."""
    if path is None:
        return {}
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    for key in raw:
        if key not in CONFIG_KEYS:
            import difflib

            close = difflib.get_close_matches(str(key), CONFIG_KEYS, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(
                f"config file {path}: {key}: unknown key; {hint}"
                f"the file holds {', '.join(CONFIG_KEYS)}"
            )
    return dict(expand_env(raw))
