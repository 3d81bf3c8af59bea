"""The OpenAPI document: every status the API really answers, its bearer scheme, ingest's body.

FastAPI derives operations from the routes but cannot see what dependencies and handlers answer
(401/403/429 from the token check, 503 from admission control or a database outage, 404/409
from the error hierarchy, 413/415/503 from the request guard on every method that carries a
body), nor ingest's body, which the route reads itself. This fills those in once, for every
operation, so clients and the schema-driven tests see the real contract.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from service.core.diagnosis import CAUSE_NAMES, STATE_NAMES
from service.costs.waste import GROUP_BYS
from service.vocabulary import METRICS_BY_NAME
from service.wire import IngestBatch

ERROR_REF = {"$ref": "#/components/schemas/Error"}
_ERROR_SCHEMA = {
    "title": "Error",
    "type": "object",
    "description": "What was wrong: a message, or a list of {loc, msg, type} naming each field.",
    "properties": {"detail": {"title": "Detail"}},
    "required": ["detail"],
}
_RETRY_AFTER = {
    "Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}
}
_API_ERRORS: dict[str, tuple[str, bool]] = {
    "401": ("missing or invalid bearer token", False),
    "403": ("the token's role (or node) may not do this", False),
    "422": ("a parameter or body field is not acceptable; detail names it", False),
    "429": ("too many failed authentication attempts from this client", True),
    "503": ("too busy (bounded concurrent reads) or the database is unavailable", True),
}


# Routes that name their object in the query rather than the path (a job id may hold "/").
# (alerts, actions and notices: a job named outside a signed-in person's scope is 404.)
_NAMED_IN_QUERY = frozenset({"/api/v1/gpus/series", "/api/v1/reports/periodic", "/api/v1/alerts",
                             "/api/v1/actions", "/api/v1/notices"})  # fmt: skip

# Query parameters typed as text whose routes take only these names (the route's own 422 names
# the nearest one); the document lists them so clients and generated requests know.
_ENUMS: dict[tuple[str, str], tuple[str, ...]] = {
    ("/api/v1/fleet", "state"): STATE_NAMES,
    ("/api/v1/fleet", "cause"): CAUSE_NAMES,
    ("/api/v1/gpus/{uuid}/series", "metric"): (*METRICS_BY_NAME, "activity"),
    ("/api/v1/gpus/series", "metric"): (*METRICS_BY_NAME, "activity"),
}
# Query parameters whose names are open-ended: a pattern instead of an enum.
_PATTERNS: dict[tuple[str, str], str] = {
    # The groupings, or label:<key> (a label key of 1-63 characters, no control character).
    ("/api/v1/reports/cost", "group_by"): "^("
    + "|".join(GROUP_BYS)
    + "|label:[^\u0000-\u001f\u007f]{1,63})?$",
}
# Text anywhere in a request refuses a NUL (service/api/input_guard.py).
NO_NUL = "^[^\u0000]*$"


def _parameters(path: str, op: dict[str, Any]) -> None:
    """Each text parameter of ``op`` says what it takes: its names, or text without a NUL."""
    for param in op.get("parameters", []):
        schema = param.get("schema", {})
        texts = [schema, *schema.get("anyOf", [])]
        texts += [t["items"] for t in texts if t.get("type") == "array" and "items" in t]
        for text in (t for t in texts if t.get("type") == "string"):
            names = _ENUMS.get((path, param["name"]))
            if names is not None:
                text["enum"] = list(names)
            elif (path, param["name"]) in _PATTERNS:
                text["pattern"] = _PATTERNS[(path, param["name"])]
            elif "enum" not in text and "pattern" not in text and "format" not in text:
                text["pattern"] = NO_NUL
            # An optional query parameter left empty (?format=) reads as not given.
            optional = param["in"] == "query" and not param.get("required", False)
            if optional and "enum" in text and "" not in text["enum"]:
                text["enum"] = [*text["enum"], ""]


def _error(description: str, retry_after: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": ERROR_REF}},
    }
    if retry_after:
        out["headers"] = _RETRY_AFTER
    return out


def _declare(op: dict[str, Any], code: str, description: str, retry_after: bool = False) -> None:
    op.setdefault("responses", {}).setdefault(code, _error(description, retry_after))


def _guarded(op: dict[str, Any], *, ingest: bool) -> None:
    """The request guard's answers (service/api/input_guard.py) on a method with a body."""
    limit = "GPUWARDEN_INGEST_MAX_BODY_BYTES" if ingest else "GPUWARDEN_MAX_BODY_BYTES"
    _declare(op, "413", f"body larger than {limit}, as sent or once expanded")
    _declare(op, "415", "a Content-Encoding other than gzip (or none)")
    _declare(op, "422", "a NUL character in the path, query or body, or a body that is not gzip")
    _declare(op, "503", "the service holds as many request bodies as it may; retry", True)


def _ingest_body(schema: dict[str, Any]) -> dict[str, Any]:
    """The request body of POST /ingest, its models added to the components."""
    body = IngestBatch.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, sub in body.pop("$defs", {}).items():
        schema["components"]["schemas"].setdefault(name, sub)
    schema["components"]["schemas"].setdefault("IngestBatch", body)
    return {
        "required": True,
        "description": "One batch of an agent; `Content-Encoding: gzip` accepted (only gzip).",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/IngestBatch"}}},
    }


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI document with the statuses, security scheme and bodies filled in."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        routes=app.routes,
    )
    components = schema.setdefault("components", {})
    components.setdefault("schemas", {})["Error"] = _ERROR_SCHEMA
    components["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "an API token (gpuwarden token create); roles agent, reader, admin",
        }
    }
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            _parameters(path, op)
            api = path.startswith("/api/")
            if api:
                op["security"] = [{"bearer": []}]
                for code, (description, retry_after) in _API_ERRORS.items():
                    _declare(op, code, description, retry_after)
                # Our 422s name fields in several shapes, not only FastAPI's validation list.
                op["responses"]["422"] = _error(_API_ERRORS["422"][0], False)
            if "{" in path or path in _NAMED_IN_QUERY:
                _declare(op, "404", "no such object")
            if method in ("post", "put", "patch", "delete") and api:
                _declare(op, "409", "clashes with stored state")
                _declare(op, "400", "the request cannot be carried out as asked")
            if path.endswith("/ingest"):
                op["requestBody"] = _ingest_body(schema)
            if method in ("post", "put", "patch", "delete"):
                _guarded(op, ingest=path.endswith("/ingest"))
            if path == "/api/v1/session" and method == "post":
                op["security"] = []  # the console's login: the token is in the body
                op["responses"]["429"] = _error(
                    "too many failed logins or tokens from this client (a token never tried "
                    "before is still checked)",
                    True,
                )
            if path.startswith("/api/v1/auth/oidc/"):
                # Single sign-on: the browser comes without a token; 404 while it is not set up.
                op["security"] = []
                _declare(op, "404", "single sign-on is not set up (GPUWARDEN_OIDC_ISSUER)")
                _declare(op, "400", "no sign-in in progress, or its state or issuer differs")
                _declare(op, "502", "the identity provider is unreachable")
            if path == "/api/v1/jobs" and method == "post":
                # 201 when the job is new, 200 when the request merged into an existing one.
                op["responses"].setdefault(
                    "200", {**op["responses"]["201"], "description": "merged"}
                )
            if path.endswith("/test") and path.startswith("/api/v1/channels"):
                op["responses"]["502"] = {
                    "description": "the test notification could not be delivered",
                    "content": {"application/json": {"schema": {}}},
                }
    _health(schema)
    app.openapi_schema = schema
    return schema


def _health(schema: dict[str, Any]) -> None:
    paths = schema.get("paths", {})
    if "/readyz" in paths:
        _declare(paths["/readyz"]["get"], "503", "database unreachable or schema not at head")
    if "/metrics" in paths:
        op = paths["/metrics"]["get"]
        op["responses"]["200"]["content"] = {"text/plain": {"schema": {"type": "string"}}}
        for code in ("401", "403", "429", "503"):
            _declare(
                op, code, "/metrics protected by a reader token (a setting)", code in "429 503"
            )
    for csv_path in ("/api/v1/reports/cost", "/api/v1/actions"):
        op = paths.get(csv_path, {}).get("get")
        if op is not None:
            op["responses"]["200"]["content"]["text/csv"] = {"schema": {"type": "string"}}


def install_openapi(app: FastAPI) -> None:
    """Serve the completed document at /openapi.json (and in /docs)."""
    app.openapi = lambda: build_openapi(app)  # type: ignore[method-assign]
