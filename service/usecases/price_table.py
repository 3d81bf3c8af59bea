"""The price table in force: the one PUT through the API, else the config file's, else defaults."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import Connection

from service.costs.default_prices import DEFAULT_PRICES
from service.costs.prices import PriceRow
from service.costs.prices import parse_price_rows as parse_price_list
from service.db import prices_repo
from service.errors import ConfigError, ValidationFailed
from service.settings import Settings, load_config_file
from service.usecases.opencost_prices import opencost_known


def parse_price_rows(items: Any, *, where: str) -> list[PriceRow]:
    """Price rows from the YAML ``prices:`` list; ConfigError names the bad field."""
    try:
        return parse_price_list(items, where=where)
    except ValidationFailed as exc:
        raise ConfigError(f"config file: {exc}") from exc


PriceSource = Literal["api", "config", "default", "opencost", "none"]


@dataclass(frozen=True, slots=True)
class PriceTable:
    """The price rows in force and where they came from: api, config, default, opencost (a
    running OpenCost's, before the table's) or none (no prices: figures in GPU-hours)."""

    rows: list[PriceRow]
    source: PriceSource


def effective_prices(conn: Connection, settings: Settings) -> PriceTable:
    """No prices with ``GPUWARDEN_PRICES=none``; else OpenCost's prices where
    ``GPUWARDEN_OPENCOST_URL`` gave some (the table's pricing the models it did not), else the
    table."""
    if settings.prices == "none":
        return PriceTable([], "none")
    table = price_table(conn, settings)
    if settings.opencost_url:
        from_opencost = opencost_known(conn, settings).rows
        if from_opencost:
            return PriceTable([*from_opencost, *table.rows], "opencost")
    return table


def price_table(conn: Connection, settings: Settings) -> PriceTable:
    """The stored table if one was PUT, else the config file's ``prices:``, else the defaults."""
    stored = prices_repo.load_prices(conn)
    if stored:
        return PriceTable(stored, "api")
    from_file = config_prices(settings.config)
    if from_file:
        return PriceTable(list(from_file), "config")
    return PriceTable(list(DEFAULT_PRICES), "default")


def config_prices(path: Path | None) -> tuple[PriceRow, ...]:
    """The config file's ``prices:`` rows (none without a file or the key).

    Reports, scrapes and notifications all ask; the file is read and parsed again only when its
    modification time, size or inode changed, so an edit still takes effect without a restart.
    """
    if path is None:
        return ()
    try:
        st = path.stat()
    except OSError:
        load_config_file(path)  # raises the ConfigError that names the missing file
        raise
    return _parsed_prices(path, st.st_mtime_ns, st.st_size, st.st_ino)


@lru_cache(maxsize=8)
def _parsed_prices(path: Path, mtime_ns: int, size: int, inode: int) -> tuple[PriceRow, ...]:
    """The ``prices:`` rows of ``path`` as it was at (mtime_ns, size, inode): the cache key."""
    config = load_config_file(path)
    return tuple(parse_price_rows(config.get("prices") or [], where="prices"))
