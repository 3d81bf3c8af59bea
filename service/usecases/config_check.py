"""The YAML config file checked whole before anything starts: keys, policies, channels, prices."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from service.costs.prices import PriceRow, parse_price_rows
from service.errors import ConfigError, ValidationFailed
from service.settings import load_config_file
from service.thresholds.policy import ChannelSpec, PolicySpec, parse_config


@dataclass(frozen=True, slots=True)
class CheckedConfig:
    """What a valid config file holds."""

    policies: list[PolicySpec]
    channels: list[ChannelSpec]
    prices: list[PriceRow]


def check_config_file(path: Path) -> CheckedConfig:
    """Every part of config file ``path`` validated; ConfigError names the file and the field."""
    config = load_config_file(path)  # its ConfigError names unknown top-level keys
    try:
        policies, channels = parse_config(config)
        prices = parse_price_rows(config.get("prices") or [], where="prices")
    except ValidationFailed as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    return CheckedConfig(policies, channels, prices)
