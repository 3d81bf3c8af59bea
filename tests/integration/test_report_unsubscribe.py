"""The periodic report's one-click unsubscribe (RFC 8058), through a real SMTP server and the
served app on both stores: the mail carries List-Unsubscribe and List-Unsubscribe-Post and the
link in both parts; a GET shows a button and stops nothing; the client's POST stops exactly
that recipient's report; a forged or altered link stops nothing; the admins' report has none."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from service.usecases.outbox import Dispatcher
from service.usecases.periodic_reports import reports_once
from tests.integration.periodic_support import mail_the_owners, week  # noqa: F401 (fixtures)
from tests.smtp_support import Mail, SmtpServer


@pytest.fixture
def mails(week, smtp: SmtpServer) -> tuple[httpx.Client, dict[str, Mail]]:  # noqa: F811
    """This week's reports mailed to alice, her team and the admins: (admin client, by To)."""
    http, ctx, _clock = week
    mail_the_owners(http, ctx, smtp)
    reports_once(ctx)
    Dispatcher(ctx).drain()
    return http, {m.message["To"]: m for m in smtp.received}


def served(http: httpx.Client, link: str) -> str:
    """The link's path and query on the test's server (the mail names the public URL)."""
    parts = urlsplit(link)
    assert f"{parts.scheme}://{parts.netloc}" == "https://warden.example"
    return f"{parts.path}?{parts.query}"


def opted_out(http: httpx.Client) -> list[tuple[str, str]]:
    return [(o["recipient"], o["by"]) for o in http.get("/api/v1/reports/opt-outs").json()]


def test_the_mail_carries_the_one_click_link_and_a_post_stops_that_report(mails) -> None:
    http, by_to = mails
    mail = by_to["alice@example.org"].message
    header = mail["List-Unsubscribe"]
    found = re.fullmatch(r"<(https://warden\.example/unsubscribe\?[^>]+)>", header)
    assert found is not None, header
    link = found.group(1)
    assert mail["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert parse_qs(urlsplit(link).query)["r"] == ["user:alice"]
    assert f"Stop these reports: {link}" in by_to["alice@example.org"].part("plain")
    assert link.replace("&", "&amp;") in by_to["alice@example.org"].part("html")
    # A mail scanner's GET changes nothing; it shows the button.
    page = httpx.get(str(http.base_url) + served(http, link))
    assert page.status_code == 200 and "<form method='post'>" in page.text
    assert page.headers["referrer-policy"] == "no-referrer"
    assert opted_out(http) == []
    # The mail client's one-click POST (RFC 8058's body), with no login.
    done = httpx.post(
        str(http.base_url) + served(http, link), data={"List-Unsubscribe": "One-Click"}
    )
    assert done.status_code == 200 and "Reports stopped" in done.text
    assert opted_out(http) == [("user:alice", "one-click link")]


def test_a_forged_or_altered_link_stops_nothing(mails) -> None:
    http, by_to = mails
    link = by_to["vision@example.org"].message["List-Unsubscribe"].strip("<>")
    sig = parse_qs(urlsplit(link).query)["s"][0]
    base = str(http.base_url)
    for query in (
        f"r=team%3Anlp&s={sig}",  # another team under vision's signature
        "r=team%3Avision&s=" + "0" * 32,
        f"r=admins&s={sig}",
    ):
        r = httpx.post(f"{base}/unsubscribe?{query}")
        assert r.status_code == 403 and "not valid" in r.text, query
    assert httpx.post(f"{base}/unsubscribe?r=team%3Avision").status_code == 422  # no s
    assert opted_out(http) == []


def test_the_admins_report_has_no_unsubscribe(mails) -> None:
    _http, by_to = mails
    admins = by_to["gpu-admins@example.org"]
    assert admins.message["List-Unsubscribe"] is None
    assert "Stop these reports" not in admins.part("plain")
