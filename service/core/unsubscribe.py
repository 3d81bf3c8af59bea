"""One-click unsubscribe links for the periodic report (RFC 8058): a recipient and a signature
only the service can make, so following the link needs no login and opts out no one else.

Pure: a key, a recipient and a URL base in, a signature or a link out.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlencode

# Those who may stop their own report: users and teams (the admins' report cannot be).
OPTABLE_PREFIXES = ("user:", "team:")
PATH = "/unsubscribe"


def signature(key: str, recipient: str) -> str:
    """The link's signature of ``recipient`` (HMAC-SHA256, hex, 128 bits)."""
    mac = hmac.new(key.encode(), f"unsubscribe:{recipient}".encode(), hashlib.sha256)
    return mac.hexdigest()[:32]


def is_valid(key: str, recipient: str, sig: str) -> bool:
    """Whether ``sig`` is the service's signature of ``recipient`` (in constant time)."""
    return recipient.startswith(OPTABLE_PREFIXES) and hmac.compare_digest(
        signature(key, recipient), sig
    )


def link(public_url: str, key: str, recipient: str) -> str | None:
    """The one-click link that stops ``recipient``'s report, or None for the admins."""
    if not recipient.startswith(OPTABLE_PREFIXES):
        return None
    query = urlencode({"r": recipient, "s": signature(key, recipient)})
    return f"{public_url.rstrip('/')}{PATH}?{query}"
