"""A real SMTP server on loopback (aiosmtpd) that keeps each mail and answers as scripted."""

from __future__ import annotations

import email
import email.policy
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller

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


@dataclass
class SmtpServer:
    """Answers each DATA with the next scripted reply ("451 4.3.0 busy"), then 250."""

    script: list[str] = field(default_factory=list)
    received: list[Mail] = field(default_factory=list)
    attempts: int = 0

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
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)
        self.controller.start()

    def settings(self) -> dict[str, Any]:
        """The GPUWARDEN_SMTP_* settings that send here (plain SMTP: loopback, no TLS)."""
        return {
            "smtp_host": "127.0.0.1",
            "smtp_port": self.port,
            "smtp_tls": "none",
            "smtp_from": "GPU Warden <warden@example.org>",
        }

    def close(self) -> None:
        self.controller.stop()
