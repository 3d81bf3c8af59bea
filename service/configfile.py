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


# What ``policies check`` reads in place of a variable that is not set where it runs: a value
# every field it may stand for accepts, so the rest of the field's item is still checked.
UNSET_URL = "https://unset.invalid/"
UNSET_SECRET = "whsec_" + "A" * 44  # base64 of 33 zero bytes: a well-formed key


def expand_env(value: Any, *, unset: list[str] | None = None, at: str = "") -> Any:
    """Replace ``${VAR}`` references in strings (recursively) with environment values.

    A variable that is not set is a ConfigError, unless ``unset`` is given: then ``VAR (FIELD)``
    is appended to it and a placeholder stands in (a well-formed key for a ``secret``, else an
    https URL), which is what ``policies check`` does on a machine without the secrets.
    """
    if isinstance(value, str):
        missing = [m.group(1) for m in _ENV_REF.finditer(value) if m.group(1) not in os.environ]
        if missing and unset is None:
            raise ConfigError(f"environment variable {missing[0]} is referenced but not set")
        if missing and unset is not None:
            unset.extend(f"{name} ({at})" for name in missing)
            return UNSET_SECRET if at.endswith(".secret") else UNSET_URL
        return _ENV_REF.sub(lambda m: os.environ[m.group(1)], value)
    if isinstance(value, list):
        return [expand_env(v, unset=unset, at=f"{at}.{i}") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {
            k: expand_env(v, unset=unset, at=f"{at}.{k}" if at else str(k))
            for k, v in value.items()
        }
    return value


CONFIG_KEYS = ("policies", "channels", "prices", "owners")  # the top level of the YAML config file


def load_config_file(path: Path | None, *, unset: list[str] | None = None) -> dict[str, Any]:
    """Read the optional YAML config file (policies, channels, prices, owners), ``${VAR}``s
    expanded (an unset one noted in ``unset`` when given, see ``expand_env``)."""
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
    return dict(expand_env(raw, unset=unset))
