"""The owner directory: REST (admin), the config file's ``owners:`` section, and the checks that
name the bad field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import yaml

from service.thresholds.policy import SLACK_API_URL, parse_channel
from service.usecases.evaluation import load_config
from tests.alerting_support import auth, low_sm_policy


def test_the_directory_over_rest(http: httpx.Client, tokens: dict[str, str]) -> None:
    admin = auth(tokens["admin"])
    alice = {"kind": "user", "name": "alice", "email": "alice@example.org", "slack": "U0ALICE",
             "cc_email": "lead@example.org", "team": "vision"}  # fmt: skip
    r = http.post("/api/v1/owners", json=alice, headers=admin)
    assert r.status_code == 201, r.text
    assert r.json() | {"updated_at": None} == alice | {
        "cc_slack": None, "source": "api", "expires_at": None, "updated_at": None,
    }  # fmt: skip
    assert http.post("/api/v1/owners", json=alice, headers=admin).status_code == 409
    r = http.put("/api/v1/owners/user/alice", json={"email": "a@example.org"}, headers=admin)
    assert r.status_code == 200 and r.json()["email"] == "a@example.org"
    assert r.json()["slack"] is None  # PUT replaces the whole entry
    r = http.put("/api/v1/owners/team/vision", json={"slack": "C0VISION"}, headers=admin)
    assert r.status_code == 201
    listed = http.get("/api/v1/owners", headers=admin).json()
    assert [(o["kind"], o["name"]) for o in listed] == [("team", "vision"), ("user", "alice")]
    assert http.get("/api/v1/owners/user/alice", headers=admin).json()["email"] == "a@example.org"
    assert http.delete("/api/v1/owners/user/alice", headers=admin).status_code == 204
    assert http.delete("/api/v1/owners/user/alice", headers=admin).status_code == 404
    assert http.get("/api/v1/owners/user/alice", headers=admin).status_code == 404


def _field_error(r: httpx.Response) -> str:
    assert r.status_code == 422, r.text
    return str(r.json())


def test_bad_entries_name_the_field(http: httpx.Client, tokens: dict[str, str]) -> None:
    admin = auth(tokens["admin"])
    for body, field, words in (
        ({"kind": "user", "name": "al", "email": "not an address"}, "email", "pattern"),
        ({"kind": "user", "name": "al", "email": "a@x.org\r\nBcc: b@x.org"}, "email", "pattern"),
        ({"kind": "user", "name": "al", "slack": "#general"}, "slack", "pattern"),
        ({"kind": "user", "name": "-rf", "email": "a@x.org"}, "name", "pattern"),
        ({"kind": "admins", "name": "root", "email": "a@x.org"}, "name", "must be admins"),
        ({"kind": "group", "name": "g"}, "kind", ""),
    ):
        text = _field_error(http.post("/api/v1/owners", json=body, headers=admin))
        assert field in text and words in text, (body, text)
    r = http.put("/api/v1/owners/user/x", json={"cc_email": "nope"}, headers=admin)
    assert "cc_email" in _field_error(r)


def test_owner_is_an_address_of_job_policies_only(
    http: httpx.Client, tokens: dict[str, str]
) -> None:
    admin = auth(tokens["admin"])
    r = http.post("/api/v1/policies", json=low_sm_policy(["owner"]), headers=admin)
    assert r.status_code == 201, r.text
    r = http.post("/api/v1/policies", json=low_sm_policy(["owner"], name="g", scope="gpu"),
                  headers=admin)  # fmt: skip
    assert "only a job has an owner" in _field_error(r)
    r = http.post("/api/v1/channels", json={"name": "owner", "type": "email"}, headers=admin)
    assert "the job's owner's address" in _field_error(r)
    r = http.post("/api/v1/channels", json={"name": "m", "type": "email", "url": "http://x"},
                  headers=admin)  # fmt: skip
    assert "an e-mail channel has none" in _field_error(r)
    # A Slack DM channel posts to Slack's chat.postMessage unless told otherwise.
    assert parse_channel({"name": "dm", "type": "slack_dm"}).url == SLACK_API_URL


CONFIG: dict[str, Any] = {
    "channels": [{"name": "mail", "type": "email", "to": ["gpu-admins@example.org"]}],
    "policies": [low_sm_policy(["owner", "mail"])],
    "owners": {
        "admins": {"email": "gpu-admins@example.org", "slack": "C0ADMINS"},
        "teams": [{"name": "vision", "email": "vision@example.org", "cc_slack": "C0VISION"}],
        "users": [{"name": "alice", "email": "alice@example.org", "team": "vision"}],
    },
}


def test_the_config_files_owners_section(
    app: Any, http: httpx.Client, tokens: dict[str, str], tmp_path: Path
) -> None:
    ctx, admin = app.state.ctx, auth(tokens["admin"])
    path = tmp_path / "gpuwarden.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    ctx.settings.config = path
    # An admin's entry through the API wins over the file's.
    r = http.put("/api/v1/owners/user/alice", json={"email": "al@example.org"}, headers=admin)
    assert r.status_code == 201
    assert load_config(ctx) == (1, 1)
    got = {(o["kind"], o["name"]): o for o in http.get("/api/v1/owners", headers=admin).json()}
    assert set(got) == {("admins", "admins"), ("team", "vision"), ("user", "alice")}
    assert got[("team", "vision")]["source"] == "file"
    assert got[("user", "alice")]["email"] == "al@example.org"
    # An entry removed from the file goes at the next load.
    path.write_text(yaml.safe_dump(CONFIG | {"owners": {"users": []}}))
    load_config(ctx)
    left = {(o["kind"], o["name"]) for o in http.get("/api/v1/owners", headers=admin).json()}
    assert left == {("user", "alice")}
