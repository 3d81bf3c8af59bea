"""How CLI commands call the central API: one GET with the reader token, errors as one line."""

from __future__ import annotations

from typing import Any

import httpx

from service.errors import WardenError
from service.settings import Settings


class ApiError(WardenError):
    """The central service could not be reached or refused the request; the message says why."""


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


def api_get(
    settings: Settings,
    path: str,
    params: dict[str, str] | None = None,
    *,
    transport: httpx.BaseTransport | None = None,
) -> httpx.Response:
    """GET ``/api/v1{path}`` from ``settings.central_url`` with the token; ApiError unless 200."""
    if not settings.api_token:
        raise ApiError("a reader token is needed: --token or GPUWARDEN_API_TOKEN")
    url = settings.central_url.rstrip("/") + "/api/v1" + path
    try:
        with httpx.Client(timeout=60, transport=transport) as client:
            r = client.get(
                url, params=params, headers={"Authorization": f"Bearer {settings.api_token}"}
            )
    except httpx.HTTPError as exc:
        raise ApiError(f"cannot reach {settings.central_url}: {exc}") from None
    if r.status_code != 200:
        try:
            detail = describe_detail(r.json())
        except ValueError:
            detail = r.text.strip()[:300]
        what = {401: "the token was refused", 403: "the token may not read this"}.get(
            r.status_code, "the service refused the request"
        )
        raise ApiError(f"{what} ({r.status_code}): {detail}")
    return r
