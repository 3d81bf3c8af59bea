"""Channel address checks: IPv6 forms that carry an IPv4 address are judged by that address."""

from __future__ import annotations

import pytest

from service.errors import ValidationFailed
from service.notify.urlsafety import (
    HostDoesNotResolve,
    Resolver,
    parse_allow_nets,
    resolve_checked,
)


def resolver_to(*addrs: str) -> Resolver:
    return lambda host, port: list(addrs)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://[2002:7f00:1::]/", "loopback"),  # 6to4 of 127.0.0.1
        ("http://[2002:a9fe:a9fe::]/", "link-local"),  # 6to4 of the metadata address
        ("http://[2002:a00:1::]/", "private"),  # 6to4 of 10.0.0.1
        ("http://[64:ff9b::7f00:1]/", "loopback"),  # NAT64 of 127.0.0.1
        ("http://[64:ff9b::a9fe:a9fe]/", "link-local"),  # NAT64 of 169.254.169.254
        ("http://[64:ff9b:1::c0a8:101]/", "private"),  # local-use NAT64 of 192.168.1.1
        ("http://[::ffff:10.1.2.3]/", "private"),  # IPv4-mapped
        ("http://[::127.0.0.1]/", "loopback"),  # IPv4-compatible
        ("http://[::a9fe:a9fe]/", "link-local"),  # IPv4-compatible of the metadata address
        ("http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/", "loopback"),  # Teredo, client 127.0.0.1
        ("http://[fd00:ec2::254]/", "private"),  # AWS's IPv6 metadata address
        ("http://100.100.100.200/", "private"),  # Alibaba's metadata address (CGNAT range)
    ],
)
def test_transition_forms_are_judged_by_the_ipv4_they_carry(url: str, why: str) -> None:
    with pytest.raises(ValidationFailed) as err:
        resolve_checked(url, [])
    assert why in err.value.message


def test_a_resolved_transition_form_is_judged_too() -> None:
    with pytest.raises(ValidationFailed) as err:
        resolve_checked("https://hooks.example/x", [], resolver=resolver_to("2002:7f00:1::"))
    assert "loopback" in err.value.message


@pytest.mark.parametrize(
    "url",
    [
        "http://[2002:808:808::]/",  # 6to4 of 8.8.8.8
        "http://[64:ff9b::808:808]/",
        "http://[2001:0:4136:e378:8000:63bf:f7f7:f7f7]/",  # Teredo, client 8.8.8.8
        "http://[2606:4700:4700::1111]/",
    ],
)
def test_public_addresses_in_any_form_pass(url: str) -> None:
    resolve_checked(url, [])


def test_the_allow_list_admits_the_carried_ipv4() -> None:
    nets = parse_allow_nets("10.0.0.0/8")
    resolve_checked("http://[2002:a00:1::]/", nets)
    resolve_checked("http://[64:ff9b::a00:1]/", nets)
    with pytest.raises(ValidationFailed):
        resolve_checked("http://[2002:7f00:1::]/", nets)


def test_resolve_checked_returns_what_it_checked() -> None:
    target = resolve_checked(
        "https://hooks.example:8443/x", [], resolver=resolver_to("93.184.216.34", "2606:4700::1")
    )
    assert (target.host, target.port) == ("hooks.example", 8443)
    assert [str(a) for a in target.addresses] == ["93.184.216.34", "2606:4700::1"]


def test_a_host_without_addresses_is_its_own_error() -> None:
    def fails(host: str, port: int) -> list[str]:
        raise OSError("Name or service not known")

    with pytest.raises(HostDoesNotResolve):
        resolve_checked("https://nowhere.invalid/", [], resolver=fails)
    with pytest.raises(HostDoesNotResolve):
        resolve_checked("https://nowhere.invalid/", [], resolver=resolver_to())
