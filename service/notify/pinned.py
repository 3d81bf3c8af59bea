"""An httpx transport that connects only to the addresses it has just resolved and checked.

Checking a host and then letting the HTTP client resolve it again leaves a gap: a DNS server
that answers an allowed address first and a refused one next (DNS rebinding) gets the request
delivered to the refused address. Here each request's host is resolved once, every answer is
checked, and the connection goes to a checked address; the Host header and the TLS server name
(SNI, and so certificate checks) stay those of the URL's host.

Through an egress proxy (``notify.egress``) the proxy connects on our behalf: the URL's host is
still resolved and checked here, and the request then goes to the proxy, which is the
administrator's choice and not checked.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import httpx

from service.delivery import quiet_http_logs
from service.notify.egress import Egress
from service.notify.urlsafety import (
    IPNetwork,
    Resolver,
    resolve_checked,
    system_resolver,
)

# Distinct hosts a dispatcher keeps a connection pool for; channels are few.
MAX_POOLS = 64


class PinnedTransport(httpx.BaseTransport):
    """Resolve, check, then connect to the checked address; one connection pool per host.

    ``allow_nets`` is called per request, so a changed allow-list applies at the next send.
    A refused or unresolvable host raises ValidationFailed before anything is sent.
    """

    def __init__(
        self,
        allow_nets: Callable[[], Sequence[IPNetwork]],
        *,
        resolver: Resolver = system_resolver,
        make_inner: Callable[[], httpx.BaseTransport] | None = None,
        make_proxied: Callable[[str], httpx.BaseTransport] | None = None,
        admit_url: str | None = None,
        egress: Egress | None = None,
    ) -> None:
        self.allow_nets = allow_nets
        self.egress = egress or Egress()
        self.admit_url = admit_url  # the local notification log's URL, admitted on loopback
        self.resolver = resolver
        if make_inner is None or make_proxied is None:
            # Built once, now: loading the CA bundle takes tens of ms, too long to pay on the
            # first send to each host (it would also skew the per-channel rate limit).
            tls = httpx.create_ssl_context()  # what HTTPTransport() would build, the CA bundle
            if make_inner is None:
                make_inner = lambda: httpx.HTTPTransport(verify=tls)  # noqa: E731
            if make_proxied is None:
                # Through the proxy: https:// by CONNECT, TLS (and its check) with the URL's host.
                make_proxied = lambda proxy: httpx.HTTPTransport(  # noqa: E731
                    proxy=httpx.Proxy(proxy), verify=tls
                )
        self.make_inner = make_inner
        self.make_proxied = make_proxied
        # Separate pools per (scheme, host, port): a connection made and verified for one host
        # name must never carry a request for another name that resolved to the same address.
        self._pools: dict[tuple[str, str, int | None], httpx.BaseTransport] = {}
        self._lock = threading.Lock()

    def _pool(self, url: httpx.URL, proxy: str | None = None) -> httpx.BaseTransport:
        key = ("proxy", proxy, None) if proxy else (url.scheme, url.host, url.port)
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                if len(self._pools) >= MAX_POOLS:
                    self._pools.pop(next(iter(self._pools))).close()  # the oldest
                pool = self._pools[key] = self.make_proxied(proxy) if proxy else self.make_inner()
            return pool

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` to a checked address of its host."""
        url = request.url
        target = resolve_checked(
            str(url), self.allow_nets(), resolver=self.resolver, admit_url=self.admit_url
        )
        proxy = self.egress.proxy_for(url)
        if proxy is not None:
            return self._pool(url, proxy).handle_request(request)
        pool = self._pool(url)
        last: httpx.TransportError | None = None
        for addr in target.addresses:
            pinned = httpx.Request(
                request.method,
                url.copy_with(host=str(addr)),
                headers=request.headers,  # Host stays the URL's host, set when built
                stream=request.stream,
                extensions={**request.extensions, "sni_hostname": url.host},
            )
            try:
                return pool.handle_request(pinned)
            except httpx.ConnectError as exc:
                last = exc  # the next checked address, if there is one
        assert last is not None
        raise last

    def close(self) -> None:
        """Close every pool."""
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()


def make_client(
    timeout_seconds: float,
    allow_nets: Callable[[], Sequence[IPNetwork]],
    *,
    resolver: Resolver = system_resolver,
    admit_url: str | None = None,
    egress: Egress | None = None,
) -> httpx.Client:
    """The HTTP client notifiers use: bounded timeout, redirects never followed, and every
    connection made to an address that was resolved and checked for that very request."""
    quiet_http_logs()  # httpx logs each request's URL at INFO, and a Slack webhook URL is a secret
    return httpx.Client(
        timeout=timeout_seconds,
        follow_redirects=False,
        # Proxies come from GPUWARDEN_NOTIFY_PROXY_URL or the environment through ``egress``,
        # after the URL's host is checked, never from httpx reading the environment itself.
        trust_env=False,
        transport=PinnedTransport(
            allow_nets, resolver=resolver, admit_url=admit_url, egress=egress
        ),
    )
