"""Which proxy a notification goes through: GPUWARDEN_NOTIFY_PROXY_URL, else the environment.

Sites whose servers reach the internet only through an egress proxy set HTTPS_PROXY (and
HTTP_PROXY, NO_PROXY) as for every other program, or name the proxy for notifications alone.
The proxy is the administrator's choice, so it is never subject to the channel URL check; the
channel URL's own host still is (see ``notify.pinned``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from service.errors import ValidationFailed

DIRECT = "direct"  # GPUWARDEN_NOTIFY_PROXY_URL=direct: ignore the environment's proxies


@dataclass(frozen=True, slots=True)
class Egress:
    """The proxies for http:// and https:// channel URLs and the hosts that bypass them."""

    http: str | None = None
    https: str | None = None
    no_proxy: str = ""

    def proxy_for(self, url: httpx.URL) -> str | None:
        """The proxy URL a request to ``url`` goes through, or None to connect directly."""
        proxy = self.https if url.scheme == "https" else self.http
        if proxy is None:
            return None
        if bypasses(url.host, self.no_proxy):
            return None
        return proxy


def bypasses(host: str, no_proxy: str) -> bool:
    """Whether NO_PROXY (``*``, host names, ``.domain`` suffixes, IPs or CIDRs) names ``host``."""
    host = host.lower().rstrip(".")
    try:
        addr: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        addr = None
    for entry in no_proxy.lower().split(","):
        entry = entry.strip()
        if not entry:
            continue
        if entry == "*":
            return True
        if addr is not None:
            try:
                if addr in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        name = entry.rsplit(":", 1)[0] if entry.count(":") == 1 else entry  # drop a port
        name = name.lstrip("*").lstrip(".").rstrip(".")
        if name and (host == name or host.endswith("." + name)):
            return True
    return False


def _first(env: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return value
    return None


def egress_from(setting: str | None, env: Mapping[str, str]) -> Egress:
    """The Egress of GPUWARDEN_NOTIFY_PROXY_URL (``setting``) or of the proxy variables in ``env``.

    ``setting`` names one proxy for both schemes; ``direct`` turns proxies off. Unset, the usual
    variables apply: HTTPS_PROXY / HTTP_PROXY (falling back to ALL_PROXY), NO_PROXY, in upper or
    lower case. ValidationFailed names the setting when a proxy URL is not http(s)://host[:port].
    """
    no_proxy = _first(env, "NO_PROXY", "no_proxy") or ""
    if setting is not None and setting.strip():
        if setting.strip() == DIRECT:
            return Egress()
        proxy = _checked(setting.strip(), "notify_proxy_url")
        return Egress(http=proxy, https=proxy, no_proxy=no_proxy)
    https = _first(env, "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
    http = _first(env, "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
    return Egress(
        http=_checked(http, "HTTP_PROXY") if http else None,
        https=_checked(https, "HTTPS_PROXY") if https else None,
        no_proxy=no_proxy,
    )


def _checked(proxy: str, field: str) -> str:
    if "://" not in proxy:
        proxy = "http://" + proxy  # as curl and requests read "proxy:3128"
    url = httpx.URL(proxy)
    if url.scheme not in ("http", "https") or not url.host:
        # The value is not echoed: a proxy URL may carry a password.
        raise ValidationFailed(field, "is not a proxy URL like http://proxy:3128")
    return proxy
