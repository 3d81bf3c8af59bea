"""422 answers that stay small: what a validation error echoes of the input is capped.

A small gzip body can expand to megabytes of bad items; echoing every one back (as FastAPI does
by default) turns a few KB in into megabytes out. The first errors name their items, which is
what a client needs to fix its input.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from fastapi import Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

MAX_ERRORS = 20  # errors listed in one answer; the rest are counted
MAX_ECHO_CHARS = 120  # of each echoed input, location part and message
JSON_SAFE_INT = 2**53


def _short_text(value: str) -> str:
    return value if len(value) <= MAX_ECHO_CHARS else value[:MAX_ECHO_CHARS] + "..."


def _echo(value: Any) -> Any:
    """A JSON-safe, short stand-in for an input value."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) < JSON_SAFE_INT else _short_text(str(value))
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return _short_text(value)
    if isinstance(value, bytes):
        return _short_text(value.decode("utf-8", "replace"))
    if isinstance(value, dict):
        return f"an object with {len(value)} keys"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} items"
    return _short_text(type(value).__name__)


def bounded_errors(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """Pydantic error dicts reduced to type, loc, msg and a short input; at most MAX_ERRORS."""
    out: list[dict[str, Any]] = []
    for e in errors[:MAX_ERRORS]:
        item: dict[str, Any] = {
            "type": str(e.get("type", "value_error")),
            "loc": [p if isinstance(p, int) else _short_text(str(p)) for p in e.get("loc", ())],
            "msg": _short_text(str(e.get("msg", ""))),
        }
        if "input" in e:
            item["input"] = _echo(e["input"])
        out.append(item)
    if len(errors) > MAX_ERRORS:
        out.append(
            {
                "type": "too_many_errors",
                "loc": ["body"],
                "msg": f"{len(errors) - MAX_ERRORS} more errors not shown",
            }
        )
    return out


async def request_validation_error(_: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422 for invalid requests, with the echo bounded."""
    assert isinstance(exc, RequestValidationError)
    return JSONResponse(
        {"detail": bounded_errors(exc.errors())},
        status_code=status.HTTP_422_UNPROCESSABLE_CONTENT,
    )
