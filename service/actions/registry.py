"""The reclaim drivers a central can use, by the name a ladder's reclaim step gives: ``slurm``
and ``kubernetes`` always (their commands and API client are used at the first reclaim), and
``webhook`` when GPUWARDEN_ACTION_WEBHOOK_URL is set."""

from __future__ import annotations

import logging
import os
from typing import assert_never

import httpx

from service.actions.base import ReclaimDriver
from service.actions.kubernetes import KubernetesDriver
from service.actions.slurm import SlurmDriver
from service.actions.webhook import WebhookDriver
from service.errors import ConfigError, ValidationFailed
from service.notify.egress import egress_from
from service.notify.pinned import make_client
from service.notify.urlsafety import (
    HostDoesNotResolve,
    Resolver,
    parse_allow_nets,
    resolve_checked,
    system_resolver,
)
from service.settings import Settings
from service.thresholds.ladder import DRIVER_NAMES, DriverName
from service.thresholds.policy import ChannelSpec

ACTION_WEBHOOK = "action-webhook"  # the channel name its messages and audit rows carry
log = logging.getLogger(__name__)


def check_action_webhook_url(settings: Settings, *, resolver: Resolver = system_resolver) -> None:
    """Refuse (ConfigError) to start with an action webhook URL at an address a channel URL may
    not use (metadata, loopback, private) unless GPUWARDEN_WEBHOOK_ALLOW_NETS admits it.

    A host that does not resolve yet (DNS may come up after us) is only warned about: every
    send resolves and checks it again.
    """
    url = settings.action_webhook_url
    if not url:
        return
    nets = parse_allow_nets(settings.webhook_allow_nets)
    try:
        resolve_checked(url, nets, resolver=resolver, field="GPUWARDEN_ACTION_WEBHOOK_URL")
    except HostDoesNotResolve as exc:
        log.warning("the action webhook: %s; every reclaim checks it again", exc)
    except ValidationFailed as exc:
        raise ConfigError(str(exc)) from None


def action_client(settings: Settings, *, resolver: Resolver = system_resolver) -> httpx.Client:
    """The HTTP client the action webhook posts with: the notifiers' own (every address
    resolved and checked against GPUWARDEN_WEBHOOK_ALLOW_NETS per request, redirects never
    followed, the notification proxy), under GPUWARDEN_ACTION_TIMEOUT_SECONDS."""
    return make_client(
        settings.action_timeout_seconds,
        lambda: parse_allow_nets(settings.webhook_allow_nets),
        resolver=resolver,
        egress=egress_from(settings.notify_proxy_url, os.environ),
    )


def action_webhook(settings: Settings) -> ChannelSpec | None:
    """The action webhook as a webhook channel, or None when GPUWARDEN_ACTION_WEBHOOK_URL is
    unset (Settings has checked the URL and the secret)."""
    if not settings.action_webhook_url:
        return None
    return ChannelSpec(
        name=ACTION_WEBHOOK,
        type="webhook",
        url=settings.action_webhook_url,
        secret=settings.action_webhook_secret,
    )


def drivers_from(
    settings: Settings, *, client: httpx.Client | None = None
) -> dict[str, ReclaimDriver]:
    """Every configured driver by name; ``client`` (else a new ``action_client``) serves the
    action webhook."""
    drivers: dict[str, ReclaimDriver] = {}
    for name in DRIVER_NAMES:
        driver = driver_of(name, settings, client)
        if driver is not None:
            drivers[name] = driver
    return drivers


def driver_of(
    name: DriverName, settings: Settings, client: httpx.Client | None
) -> ReclaimDriver | None:
    """The driver ``name`` names, or None where it is not configured (the action webhook
    without its URL); a driver name without its branch is an error."""
    match name:
        case "slurm":
            return SlurmDriver.from_settings(settings)
        case "kubernetes":
            return KubernetesDriver.from_settings(settings)
        case "webhook":
            channel = action_webhook(settings)
            if channel is None:
                return None
            return WebhookDriver(channel, client or action_client(settings))
        case _:
            assert_never(name)
