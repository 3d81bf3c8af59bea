"""The pure parts of single sign-on: the claims a person is read from, the sign-in's signed cookie,
the person's session cookie and where a sign-in may return to."""

from __future__ import annotations

import pytest

from service.api import oidc, sessions
from service.api.oidc import OidcConfig, SignInRefused, person_of, safe_next
from service.roles import JobScope, Person, Role
from service.settings import Settings

KEY = "k" * 43


def _config(**overrides: str) -> OidcConfig:
    config = OidcConfig.from_settings(
        Settings(oidc_issuer="https://sso.example.org/realms/lab/", **overrides)  # type: ignore[arg-type]
    )
    assert config is not None
    return config


def test_no_issuer_means_tokens_only() -> None:
    assert OidcConfig.from_settings(Settings()) is None
    config = _config()
    assert config.issuer == "https://sso.example.org/realms/lab"
    assert config.redirect_uri == "http://127.0.0.1:8000/api/v1/auth/oidc/callback"


def test_groups_name_teams_and_roles() -> None:
    config = _config()
    alice = person_of({"preferred_username": "alice", "groups": ["vision", "nlp"]}, config)
    assert alice == Person(user="alice", teams=("nlp", "vision"), role=Role.READER, fleet=False)
    assert alice.scope == JobScope(users=frozenset({"alice"}), teams=frozenset({"nlp", "vision"}))
    frank = person_of({"preferred_username": "frank", "groups": ["gpuwarden-readers"]}, config)
    assert (frank.role, frank.fleet, frank.teams, frank.scope) == (Role.READER, True, (), None)
    carol = person_of({"preferred_username": "carol", "groups": ["gpuwarden-admins"]}, config)
    assert (carol.role, carol.scope) == (Role.ADMIN, None)


def test_a_team_prefix_keeps_only_the_groups_that_carry_it() -> None:
    config = _config(oidc_team_prefix="team-", oidc_user_claim="email")
    p = person_of({"email": "a@x.org", "groups": ["team-vision", "staff", "team-"]}, config)
    assert (p.user, p.teams) == ("a@x.org", ("vision",))


def test_no_user_claim_is_refused() -> None:
    with pytest.raises(SignInRefused, match="preferred_username"):
        person_of({"sub": "123", "groups": ["vision"]}, _config())


def test_the_login_cookie_is_signed_and_lapses() -> None:
    login = oidc.new_login(next_path="/jobs", now=1000.0)
    value = oidc.encode_login(login, key=KEY)
    assert oidc.decode_login(value, key=KEY, now=1001.0) == login
    assert oidc.decode_login(value, key="other" * 9, now=1001.0) is None
    assert oidc.decode_login(value, key=KEY, now=1000.0 + oidc.LOGIN_SECONDS + 1) is None
    body, _, sig = value.partition(".")
    assert oidc.decode_login(body[:-2] + "xx." + sig, key=KEY, now=1001.0) is None


def test_a_persons_session_cookie_round_trips_and_cannot_be_raised() -> None:
    person = Person(user="alice", teams=("vision",), role=Role.READER, fleet=False)
    session = sessions.person_session(person=person, now=0.0, lifetime_seconds=60)
    value = sessions.encode(session, key=KEY)
    assert sessions.decode(value, key=KEY, now=1.0) == session
    # Making oneself an admin changes the payload: the signature no longer matches.
    forged = sessions.encode(
        sessions.person_session(
            person=Person(user="alice", teams=(), role=Role.ADMIN, fleet=True),
            now=0.0,
            lifetime_seconds=60,
        ),
        key="attacker" * 6,
    )
    assert sessions.decode(forged, key=KEY, now=1.0) is None


@pytest.mark.parametrize(
    ("asked", "safe"),
    [
        ("/jobs/slurm:1", "/jobs/slurm:1"),
        ("/costs?group_by=team", "/costs?group_by=team"),
        ("//evil.example/", "/"),
        ("/\\evil.example/", "/"),
        ("/%2F%2Fevil.example", "/"),
        ("https://evil.example/", "/"),
        ("javascript:alert(1)", "/"),
        ("/jobs/../../x", "/"),
        ("/\tevil", "/"),
    ],
)
def test_a_sign_in_returns_only_to_a_path_of_this_site(asked: str, safe: str) -> None:
    assert safe_next(asked) == safe
