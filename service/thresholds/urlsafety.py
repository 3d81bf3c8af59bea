"""Channel URL safety: refuse URLs that resolve to loopback, link-local or private addresses."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from service.errors import ValidationFailed

Resolver = Callable[[str, int], Sequence[str]]
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


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


def _forbidden(addr: IPAddress) -> str | None:
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr.is_loopback:
        return "loopback"
    if addr.is_link_local:
        return "link-local"
    if addr.is_unspecified or addr.is_multicast or addr.is_reserved:
        return "reserved"
    if addr.is_private or (isinstance(addr, ipaddress.IPv4Address) and addr in _CGNAT):
        return "private"
    return None


_CGNAT = ipaddress.ip_network("100.64.0.0/10")


def check_url(
    url: str,
    allow_nets: Sequence[IPNetwork],
    *,
    resolver: Resolver = system_resolver,
    field: str = "url",
) -> None:
    """Raise ValidationFailed(field) unless every address ``url`` resolves to may be called."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationFailed(field, "must be an http:// or https:// URL with a host")
    if parts.username or parts.password:
        raise ValidationFailed(field, "must not carry credentials; use the channel secret")
    host = parts.hostname
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            addresses = [ipaddress.ip_address(a.split("%")[0]) for a in resolver(host, port)]
        except OSError as exc:
            raise ValidationFailed(field, f"host {host!r} does not resolve ({exc})") from None
    if not addresses:
        raise ValidationFailed(field, f"host {host!r} does not resolve")
    for addr in addresses:
        why = _forbidden(addr)
        if why is None or any(addr in net for net in allow_nets):
            continue
        raise ValidationFailed(
            field,
            f"host {host!r} resolves to {why} address {addr}; refused unless "
            "GPUWARDEN_WEBHOOK_ALLOW_NETS admits it",
        )
