"""A real SMTP server on loopback (aiosmtpd) that keeps each mail and answers as scripted."""

from __future__ import annotations

import email
import email.policy
import ssl
import warnings
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any, Literal

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from tests.support import free_port


@dataclass
class Mail:
    """One mail the server took: the SMTP envelope and the parsed message."""

    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage

    def part(self, subtype: str) -> str:
        """The text of the ``text/<subtype>`` part."""
        found = self.message.get_body(preferencelist=(subtype,))
        assert found is not None and found.get_content_type() == f"text/{subtype}", subtype
        return str(found.get_content())


class _Controller(Controller):
    def factory(self) -> Any:
        with warnings.catch_warnings():
            # Said of AUTH without STARTTLS on every connection; implicit TLS is TLS throughout.
            warnings.filterwarnings("ignore", "Requiring AUTH while not requiring TLS")
            return super().factory()


@dataclass
class SmtpServer:
    """Answers each DATA with the next scripted reply ("451 4.3.0 busy"), then 250.

    ``tls``: none, starttls (required before MAIL) or tls (implicit, from the first byte), with
    the certificate and key ``cert``; ``login``: the (user, password) it requires (after TLS).
    """

    script: list[str] = field(default_factory=list)
    received: list[Mail] = field(default_factory=list)
    attempts: int = 0
    tls: Literal["none", "starttls", "tls"] = "none"
    cert: tuple[Path, Path] | None = None
    login: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        outer = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                outer.attempts += 1
                if outer.script:
                    return outer.script.pop(0)
                msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
                assert isinstance(msg, EmailMessage)
                outer.received.append(Mail(envelope.mail_from, list(envelope.rcpt_tos), msg))
                return "250 OK"

        self.port = free_port()
        kwargs: dict[str, Any] = {}
        if self.tls != "none":
            assert self.cert is not None
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*self.cert)
            if self.tls == "tls":
                kwargs["ssl_context"] = context
                kwargs["server_hostname"] = "localhost"
            else:
                kwargs |= {"tls_context": context, "require_starttls": True}
        if self.login is not None:
            kwargs |= {"authenticator": self._authenticate, "auth_required": True}
            # aiosmtpd counts only STARTTLS as TLS for AUTH; implicit TLS is TLS from the start.
            kwargs["auth_require_tls"] = self.tls == "starttls"
        self.controller = _Controller(Handler(), hostname="127.0.0.1", port=self.port, **kwargs)
        self.controller.start()

    def _authenticate(
        self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any
    ) -> AuthResult:
        ok = isinstance(data, LoginPassword) and self.login == (
            data.login.decode(),
            data.password.decode(),
        )
        return AuthResult(success=ok, handled=False)

    def settings(self) -> dict[str, Any]:
        """The GPUWARDEN_SMTP_* settings that send here (plain SMTP: loopback, no TLS)."""
        return {
            "smtp_host": "localhost" if self.tls != "none" else "127.0.0.1",
            "smtp_port": self.port,
            "smtp_tls": self.tls,
            "smtp_from": "GPU Warden <warden@example.org>",
            "smtp_ca_file": self.cert[0] if self.cert else None,
        }

    def send_here(self, settings: Any) -> None:
        """Point ``settings`` (a service's Settings) at this server: ``settings()`` applied."""
        for key, value in self.settings().items():
            setattr(settings, key, value)

    def close(self) -> None:
        self.controller.stop()
