"""The OpenAPI document says what each route answers: the guard's statuses, Allow, login's 429.

Checked against the real service on loopback (SQLite: nothing here touches storage).
"""

from __future__ import annotations

import re

import httpx
import pytest

BODY_METHODS = {"post", "put", "patch", "delete"}


@pytest.fixture
def document(http: httpx.Client) -> dict[str, dict[str, dict[str, object]]]:
    paths: dict[str, dict[str, dict[str, object]]] = http.get("/openapi.json").json()["paths"]
    return paths


@pytest.mark.parametrize("migrated_engine", ["sqlite"], indirect=True)
def test_options_allow_lists_exactly_the_documented_methods(
    http: httpx.Client, document: dict[str, dict[str, dict[str, object]]]
) -> None:
    for path, ops in document.items():
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        r = http.options(concrete)
        assert r.status_code == 405, path
        allowed = {m.strip().lower() for m in r.headers["allow"].split(",")} - {"head"}
        assert allowed == set(ops), (path, r.headers["allow"])
        # Any other undeclared method names the same set.
        r = http.request("TRACE" if "get" in ops else "GET", concrete)
        assert r.status_code == 405, path
        assert {m.strip().lower() for m in r.headers["allow"].split(",")} - {"head"} == set(ops)


@pytest.mark.parametrize("migrated_engine", ["sqlite"], indirect=True)
def test_the_request_guards_answers_are_declared_where_they_happen(
    document: dict[str, dict[str, dict[str, object]]],
) -> None:
    for path, ops in document.items():
        for method, op in ops.items():
            responses = op["responses"]
            assert isinstance(responses, dict)
            guarded = method in BODY_METHODS
            assert ("413" in responses) is guarded, (method, path)
            assert ("415" in responses) is guarded, (method, path)
            if guarded:
                assert "422" in responses and "Retry-After" in responses["503"]["headers"]
    login = document["/api/v1/session"]["post"]["responses"]
    assert isinstance(login, dict) and "Retry-After" in login["429"]["headers"]
