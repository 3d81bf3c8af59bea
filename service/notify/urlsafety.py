"""Channel URL safety: refuse URLs that resolve to loopback, link-local or private addresses.

``resolve_checked`` resolves a URL's host once and returns the addresses it checked; the
notifiers' HTTP transport connects to one of exactly those (see ``notify.pinned``), so a DNS
answer that changes between the check and the connection (rebinding) cannot reach a refused
address. IPv6 forms that carry an IPv4 address (IPv4-mapped and -compatible, 6to4, NAT64,
Teredo) are judged by the IPv4 address they carry.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from service.errors import ValidationFailed

Resolver = Callable[[str, int], Sequence[str]]
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_CGNAT = ipaddress.ip_network("100.64.0.0/10")  # also holds Alibaba's metadata 100.100.100.200
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


class HostDoesNotResolve(ValidationFailed):
    """The URL's host has no address (yet): a warning at start-up, a failure at send time."""


def system_resolver(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, by the system resolver."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def parse_allow_nets(text: str) -> list[IPNetwork]:
    """The CIDRs of GPUWARDEN_WEBHOOK_ALLOW_NETS (comma-separated; empty admits none)."""
    nets = []
    for part in text.split(","):
        part = part.strip()
        if part:
            try:
                nets.append(ipaddress.ip_network(part, strict=False))
            except ValueError as exc:
                raise ValidationFailed("webhook_allow_nets", f"{part!r} is not a CIDR") from exc
    return nets


def carried_ipv4(addr: IPAddress) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 transition form carries (empty for a plain address)."""
    if isinstance(addr, ipaddress.IPv4Address):
        return []
    if addr.ipv4_mapped is not None:
        return [addr.ipv4_mapped]
    if addr.sixtofour is not None:
        return [addr.sixtofour]
    if addr.teredo is not None:
        return list(addr.teredo)  # the Teredo server and the client's (unobfuscated) address
    if any(addr in net for net in _NAT64) or (
        addr in _IPV4_COMPATIBLE and int(addr) > 0xFFFF  # not ::, ::1 and other small ones
    ):
        return [ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)]
    return []


def _why_refused(addr: IPAddress) -> str | None:
    if addr.is_loopback:
        return "loopback"
    if addr.is_link_local:
        return "link-local"
    if addr.is_unspecified or addr.is_multicast or addr.is_reserved:
        return "reserved"
    if addr.is_private or (isinstance(addr, ipaddress.IPv4Address) and addr in _CGNAT):
        return "private"
    return None


def refusal(addr: IPAddress, allow_nets: Sequence[IPNetwork]) -> str | None:
    """Why ``addr`` may not be called (None when it may): judged by any IPv4 it carries."""
    if any(addr in net for net in allow_nets):
        return None
    carried = carried_ipv4(addr)
    if not carried:
        return _why_refused(addr)
    for v4 in carried:
        why = _why_refused(v4)
        if why is not None and not any(v4 in net for net in allow_nets):
            return f"{why} (carried in {addr})"
    return None


@dataclass(frozen=True, slots=True)
class Target:
    """A URL's host and port with the addresses that were resolved and checked for it."""

    host: str
    port: int
    addresses: tuple[IPAddress, ...]


def _split(url: str, field: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationFailed(field, "must be an http:// or https:// URL with a host")
    if parts.username or parts.password:
        raise ValidationFailed(field, "must not carry credentials; use the channel secret")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValidationFailed(field, "has an invalid port") from None
    return parts.hostname, port


def _check(
    host: str, addresses: Sequence[IPAddress], allow_nets: Sequence[IPNetwork], field: str
) -> None:
    for addr in addresses:
        why = refusal(addr, allow_nets)
        if why is not None:
            raise ValidationFailed(
                field,
                f"host {host!r} resolves to {why} address {addr}; refused unless "
                "GPUWARDEN_WEBHOOK_ALLOW_NETS admits it",
            )


def literal_address(url: str) -> IPAddress | None:
    """The IP address written in ``url``'s host, or None for a host name."""
    host = urlsplit(url).hostname or ""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def resolve_checked(
    url: str,
    allow_nets: Sequence[IPNetwork],
    *,
    resolver: Resolver = system_resolver,
    field: str = "url",
    admit_url: str | None = None,
) -> Target:
    """Resolve ``url``'s host once; raise ValidationFailed(field) unless every address may be
    called, else return them. A host without addresses raises HostDoesNotResolve.

    ``admit_url`` is the one URL that may be on loopback: the notification log of ``up`` and
    ``demo``. It admits itself alone (this exact URL), and only on loopback addresses.
    """
    host, port = _split(url, field)
    literal = literal_address(url)
    if literal is not None:
        addresses: list[IPAddress] = [literal]
    else:
        try:
            addresses = [ipaddress.ip_address(a.split("%")[0]) for a in resolver(host, port)]
        except OSError as exc:
            raise HostDoesNotResolve(field, f"host {host!r} does not resolve ({exc})") from None
        if not addresses:
            raise HostDoesNotResolve(field, f"host {host!r} does not resolve")
    if not (url == admit_url and all(a.is_loopback for a in addresses)):
        _check(host, addresses, allow_nets, field)
    return Target(host=host, port=port, addresses=tuple(addresses))
