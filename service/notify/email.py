"""E-mail notifier: a message as plain text plus HTML (multipart/alternative) over SMTP.

SMTP replies map onto the delivery table of ``service.delivery`` as HTTP answers do: 421 and
no answer (refused, timed out, dropped) are the receiver being busy (retried without limit);
other 4xx replies are temporary (retried, set aside after a few in a row); 530/534/535 are
credentials refused, like a server certificate not trusted (kept, retried, logged once a
minute); other 5xx replies are permanent
(the message fails, the dead letter of a notification).
"""

from __future__ import annotations

import smtplib
import ssl
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

from service.errors import DeliveryError, ValidationFailed
from service.notify.base import Notification
from service.notify.envelope import Envelope, Message
from service.notify.headers import header_value
from service.notify.message import message_of_notification
from service.settings import Settings
from service.thresholds.policy import ChannelSpec

CREDENTIAL_CODES = (530, 534, 535)


def http_status_of(smtp_code: int | None) -> int | None:
    """The HTTP status whose row of the delivery table an SMTP reply code falls in."""
    if smtp_code is None or smtp_code == 421:
        return None  # no answer, or "service not available": the receiver is busy
    if smtp_code in CREDENTIAL_CODES:
        return 401
    if 400 <= smtp_code < 500:
        return 500  # temporary: retried, and set aside after a few in a row
    if 500 <= smtp_code < 600:
        return 400  # permanent: this message will never be taken as it is
    return 500


def build(
    message: Message, *, sender: str, to: list[str], cc: list[str], msgid: str
) -> EmailMessage:
    """The e-mail: headers, a plain-text part and an HTML alternative; ValidationFailed naming
    the header when a value cannot be one (a control character: CR or LF would end it)."""
    mail = EmailMessage()
    _set(mail, "Subject", message.subject)
    _set(mail, "From", sender)
    _set(mail, "To", ", ".join(to))
    if cc:
        _set(mail, "Cc", ", ".join(cc))
    mail["Date"] = formatdate(localtime=False, usegmt=True)
    _set(mail, "Message-ID", msgid)
    mail["Auto-Submitted"] = "auto-generated"  # RFC 3834: no vacation replies to a robot
    if message.unsubscribe_url:
        # RFC 2369 and 8058: the client's own "unsubscribe" button POSTs to the link.
        _set(mail, "List-Unsubscribe", f"<{message.unsubscribe_url}>")
        mail["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
    mail.set_content(message.text)
    mail.add_alternative(message.html, subtype="html")
    return mail


def _set(mail: EmailMessage, name: str, value: str) -> None:
    """Set header ``name`` to ``value``, or raise ValidationFailed naming it."""
    try:
        mail[name] = header_value(name, value)
    except ValueError as exc:  # the email package's own refusals (a malformed address, say)
        raise ValidationFailed(f"header {name}", str(exc)) from None


class EmailNotifier:
    """Sends through the SMTP server of the settings (STARTTLS, implicit TLS or plain)."""

    def __init__(self, channel: ChannelSpec, settings: Settings) -> None:
        self.channel = channel
        self.settings = settings

    def send(self, note: Notification) -> None:
        """Mail an alert's notification to the channel's fixed recipients."""
        if not self.channel.to:
            raise ValidationFailed("to", f"e-mail channel {self.channel.name} has no recipients")
        env = Envelope(
            delivery_id=note.delivery_id, to=self.channel.to, message=message_of_notification(note)
        )
        self.send_message(env)

    def send_message(self, env: Envelope) -> None:
        """Mail ``env``; DeliveryError with the reply's place in the delivery table on failure."""
        s = self.settings
        what = f"email channel {self.channel.name}"
        if not s.smtp_host:
            raise ValidationFailed("smtp_host", "GPUWARDEN_SMTP_HOST is not set: no e-mail")
        domain = s.smtp_from.rsplit("@", 1)[-1].strip("> ") or "gpuwarden"
        msgid = make_msgid(idstring=env.delivery_id, domain=domain)
        mail = build(env.message, sender=s.smtp_from, to=env.to, cc=env.cc, msgid=msgid)
        try:
            with self._connect() as smtp:
                if s.smtp_user and s.smtp_password:
                    smtp.login(s.smtp_user, s.smtp_password)
                refused = smtp.send_message(mail)
        except smtplib.SMTPRecipientsRefused as exc:
            code = min((c for c, _ in exc.recipients.values()), default=550)
            raise DeliveryError(
                f"{what}: every recipient refused (SMTP {code})", status=http_status_of(code)
            ) from None
        except smtplib.SMTPResponseException as exc:
            raise DeliveryError(
                f"{what}: SMTP {exc.smtp_code}", status=http_status_of(exc.smtp_code)
            ) from None
        except smtplib.SMTPNotSupportedError:  # a login set, and the server offers none
            raise DeliveryError(f"{what}: the server offers no AUTH login", status=401) from None
        except ssl.SSLCertVerificationError:
            # A configuration fault like refused credentials: kept and retried, said once a
            # minute, until GPUWARDEN_SMTP_CA_FILE or the server's certificate is fixed.
            raise DeliveryError(
                f"{what}: the server's certificate is not trusted", status=401
            ) from None
        except (smtplib.SMTPException, OSError) as exc:
            raise DeliveryError(f"{what}: no answer ({type(exc).__name__})", status=None) from None
        if refused and len(refused) == len(env.to) + len(env.cc):
            raise DeliveryError(f"{what}: every recipient refused", status=400)

    def _connect(self) -> smtplib.SMTP:
        s = self.settings
        host, timeout = s.smtp_host or "", s.smtp_timeout_seconds
        cafile = str(s.smtp_ca_file) if s.smtp_ca_file else None
        if s.smtp_tls == "tls":
            context = ssl.create_default_context(cafile=cafile)
            return smtplib.SMTP_SSL(host, s.smtp_port, timeout=timeout, context=context)
        smtp = smtplib.SMTP(host, s.smtp_port, timeout=timeout)
        if s.smtp_tls == "starttls":
            try:
                smtp.starttls(context=ssl.create_default_context(cafile=cafile))
            except BaseException:
                smtp.close()
                raise
        return smtp
