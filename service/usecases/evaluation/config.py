"""Policies, channels and owners loaded from the YAML config file, its channels' URLs checked."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import text

from service.context import ServiceContext
from service.db import (
    owners_repo,
    policies_repo,
)
from service.errors import ConfigError, ValidationFailed
from service.notify.urlsafety import (
    HostDoesNotResolve,
    Resolver,
    parse_allow_nets,
    resolve_checked,
    system_resolver,
)
from service.settings import load_config_file
from service.thresholds.owners import parse_owners_section
from service.thresholds.policy import (
    parse_config,
)

log = logging.getLogger(__package__)

CONFIG_LOCK_KEY = 0x67707577_636F6E66  # "gpuwconf": serialises config loading across replicas


def check_file_channels(
    channels: list[Any],
    allow_nets_text: str,
    *,
    resolver: Resolver = system_resolver,
    source: str = "the config file",
) -> None:
    """Refuse (ConfigError) a config-file channel whose URL may not be called, as the API does.

    A host that does not resolve yet (DNS may come up after us) is only warned about: every
    send resolves and checks it again.
    """
    nets = parse_allow_nets(allow_nets_text)
    for i, c in enumerate(channels):
        if not c.is_http:
            continue
        try:
            resolve_checked(c.url, nets, resolver=resolver, field=f"channels.{i}.url")
        except HostDoesNotResolve as exc:
            log.warning("channel %s from %s: %s", c.name, source, exc.message)
        except ValidationFailed as exc:
            raise ConfigError(f"channel {c.name!r} in {source}: {exc}") from None


def load_config(ctx: ServiceContext) -> tuple[int, int]:
    """Load policies and channels from the YAML config file into the store; returns the counts."""
    if ctx.settings.config is None:
        return 0, 0
    config = load_config_file(ctx.settings.config)
    with ctx.engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # Replicas starting together must not race on the same upserts.
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": CONFIG_LOCK_KEY})
        api_channels = {c.name for c in policies_repo.list_channels(conn)}
        policy_specs, channel_specs = parse_config(config, known_channels=api_channels)
        check_file_channels(channel_specs, ctx.settings.webhook_allow_nets)
        policies_repo.sync_from_file(
            conn, policy_specs=policy_specs, channel_specs=channel_specs, now=ctx.clock()
        )
        owners = parse_owners_section(config.get("owners"))
        owners_repo.sync_from_file(conn, entries=owners, now=ctx.clock())
    return len(policy_specs), len(channel_specs)
