"""Query parameters every route reads the same way: times, durations, and no unknown names."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime
from typing import Any, ParamSpec, TypeVar
from urllib.parse import urlencode

from fastapi import HTTPException, Request, status
from fastapi.routing import APIRoute
from starlette.datastructures import QueryParams

from service.core.querytime import parse_instant, parse_seconds, time_range
from service.errors import ValidationFailed

TIME_HELP = "RFC 3339 with a zone, a date (midnight UTC), now, -1h (before now) or Unix seconds"
SINCE_HELP = "instead of start: the last DURATION before end (1h, 7d)"
_ACCEPTED: dict[int, tuple[frozenset[str], frozenset[str]]] = {}
P = ParamSpec("P")
R = TypeVar("R")


def query_error(field: str, message: str) -> HTTPException:
    """A 422 naming the query parameter that was wrong."""
    return HTTPException(
        status.HTTP_422_UNPROCESSABLE_CONTENT,
        detail=[{"loc": ["query", field], "msg": message, "type": "value_error"}],
    )


def instant(name: str, text: str | None, *, now: datetime) -> datetime | None:
    """Query parameter ``name`` as a UTC time (see TIME_HELP), None when absent; 422 if bad."""
    if text is None:
        return None
    try:
        return parse_instant(text, now=now)
    except ValueError as exc:
        raise query_error(name, str(exc)) from None


def seconds(name: str, text: str | None) -> float | None:
    """Query parameter ``name`` as seconds (10s, 1h30m or a number), None if absent; 422 if bad."""
    if text is None:
        return None
    try:
        return parse_seconds(text)
    except ValueError as exc:
        raise query_error(name, str(exc)) from None


def query_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` with the ValidationFailed it raises answered as a 422 naming the query parameter."""

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except ValidationFailed as exc:
            raise query_error(exc.field, exc.message) from None

    return call


# [start, end) of a query from ``start``, ``end`` and ``since``; 422 naming the bad one.
window = query_errors(time_range)


def _accepted(route: APIRoute) -> tuple[frozenset[str], frozenset[str]]:
    """The query parameters ``route`` reads, and those of them it may go without."""
    names: set[str] = set()
    optional: set[str] = set()
    todo: list[Any] = [route.dependant]
    while todo:
        dependant = todo.pop()
        names.update(p.alias for p in dependant.query_params)
        optional.update(p.alias for p in dependant.query_params if not p.field_info.is_required())
        todo.extend(dependant.dependencies)
    return frozenset(names), frozenset(optional)


def reject_unknown_query(request: Request) -> None:
    """Answer 422 to a query parameter the route does not read (``group-by`` for ``group_by``),
    and read an optional one left empty (``?end=``) as not given."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not request.query_params:
        return
    known = _ACCEPTED.get(id(route))
    if known is None:
        known = _ACCEPTED[id(route)] = _accepted(route)
    accepted, optional = known
    for name in request.query_params:
        if name not in accepted:
            names = ", ".join(sorted(accepted)) or "none"
            raise query_error(name, f"unknown query parameter {name!r}; this route reads: {names}")
    pairs = request.query_params.multi_items()
    kept = [(k, v) for k, v in pairs if v or k not in optional]
    if len(kept) < len(pairs):
        # This guard runs before the route's own parameters are read, from these very params.
        query = urlencode(kept).encode()
        request.scope["query_string"] = query
        request._query_params = QueryParams(query)
