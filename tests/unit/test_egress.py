"""Which proxy a notification takes: the explicit setting, the environment, NO_PROXY."""

from __future__ import annotations

import httpx
import pytest

from service.errors import ValidationFailed
from service.notify.egress import Egress, bypasses, egress_from

HOOK = httpx.URL("https://hooks.slack.com/services/T/B/X")
PLAIN = httpx.URL("http://hooks.example.com/x")


def test_environment_variables_in_either_case_with_all_proxy_as_fallback() -> None:
    e = egress_from(None, {"https_proxy": "http://p:3128", "ALL_PROXY": "http://all:8080"})
    assert e.proxy_for(HOOK) == "http://p:3128" and e.proxy_for(PLAIN) == "http://all:8080"
    assert egress_from(None, {}).proxy_for(HOOK) is None
    assert egress_from(None, {"HTTPS_PROXY": "proxy:3128"}).proxy_for(HOOK) == "http://proxy:3128"


def test_the_setting_wins_and_direct_ignores_the_environment() -> None:
    env = {"HTTPS_PROXY": "http://env:3128", "NO_PROXY": ".internal"}
    assert egress_from("http://mine:8080", env).proxy_for(HOOK) == "http://mine:8080"
    assert egress_from("direct", env) == Egress()
    assert egress_from("http://mine:8080", env).proxy_for(httpx.URL("https://am.internal")) is None


def test_a_bad_proxy_url_names_the_variable_and_not_its_password() -> None:
    with pytest.raises(ValidationFailed) as err:
        egress_from(None, {"HTTPS_PROXY": "socks5://u:s3cret@p:1080"})
    assert err.value.field == "HTTPS_PROXY" and "s3cret" not in str(err.value)
    with pytest.raises(ValidationFailed) as err:
        egress_from("ftp://p", {})
    assert err.value.field == "notify_proxy_url"


@pytest.mark.parametrize(
    ("host", "no_proxy", "bypass"),
    [
        ("hooks.slack.com", ".slack.com", True),
        ("hooks.slack.com", "slack.com", True),
        ("slack.com", "slack.com", True),
        ("evilslack.com", "slack.com", False),
        ("am.internal", "*.internal", True),
        ("10.1.2.3", "10.0.0.0/8", True),
        ("192.168.1.1", "10.0.0.0/8,localhost", False),
        ("am", "am:9093", True),
        ("anything", "*", True),
        ("x.example", "", False),
    ],
)
def test_no_proxy_forms(host: str, no_proxy: str, bypass: bool) -> None:
    assert bypasses(host, no_proxy) is bypass
