"""How CLI commands call the central API: one GET with the reader token, errors as one line.

Standard-library HTTP (urllib): a command that makes one call should not spend more CPU importing
an HTTP client than it waits for the answer.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from service.clientsettings import ClientSettings
from service.errors import WardenError
from service.local.run import state_dir

TIMEOUT_SECONDS = 60.0


class ApiError(WardenError):
    """The central service could not be reached or refused the request; the message says why,
    ``status`` is the HTTP status of a refusal (None when no answer came)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class ApiResponse:
    """A 200 answer of the central API: its body as text, and as JSON on demand."""

    status_code: int
    text: str

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.text)


def describe_detail(body: Any) -> str:
    """A FastAPI error body as one readable line: ``since: '1x' is not a duration ...``."""
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, dict):
                loc = [str(p) for p in item.get("loc", []) if p not in ("query", "body", "path")]
                msg = str(item.get("msg", item))
                parts.append(f"{'.'.join(loc)}: {msg}" if loc else msg)
            else:
                parts.append(str(item))
        return "; ".join(parts)
    return str(detail)


def no_token_message(settings: ClientSettings) -> str:
    """Why there is no token: nothing runs here to lend one, or a service was named without one."""
    if "central_url" in settings.given:
        return (
            f"a reader token is needed for {settings.central_url}: --token or GPUWARDEN_API_TOKEN"
        )
    folder = state_dir(settings)
    shown = str(folder) if folder.is_absolute() else f"./{folder}"
    return (
        f"nothing is running in {shown}: start `gpuwarden up` or `gpuwarden demo` "
        "there, or name a service with --url and --token"
    )


def _refusal(status: int, body: str) -> ApiError:
    try:
        detail = describe_detail(json.loads(body))
    except ValueError:
        detail = body.strip()[:300]
    what = {401: "the token was refused", 403: "the token may not read this"}.get(
        status, "the service refused the request"
    )
    return ApiError(f"{what} ({status}): {detail}", status)


def api_get(
    settings: ClientSettings, path: str, params: dict[str, str] | None = None
) -> ApiResponse:
    """GET ``/api/v1{path}`` from ``settings.central_url`` with the token; ApiError unless 200."""
    if not settings.api_token:
        raise ApiError(no_token_message(settings))
    url = settings.central_url.rstrip("/") + "/api/v1" + path
    if params:
        url += "?" + urlencode(params)
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {settings.api_token}"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as r:
            status, body = r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        raise _refusal(exc.code, exc.read().decode("utf-8", "replace")) from None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ApiError(f"cannot reach {settings.central_url}: {reason}") from None
    if status != 200:
        raise _refusal(status, body)
    return ApiResponse(status, body)
