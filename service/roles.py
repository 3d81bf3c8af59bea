"""The roles of API tokens and the people the console signs in, declared apart from the token
store so the CLI can offer them without importing the database layer."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Role(StrEnum):
    """What a token may do: agent ingests for its node, reader reads, admin does everything."""

    AGENT = "agent"
    READER = "reader"
    ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class JobScope:
    """The jobs a person may see: their own (``users``) and their teams' (``teams``).

    None in place of a scope means everything: tokens, fleet readers and admins."""

    users: frozenset[str]
    teams: frozenset[str]

    def allows(self, user: str | None, team: str | None) -> bool:
        """Whether a job of ``user`` and ``team`` is in this scope."""
        return (user is not None and user in self.users) or (
            team is not None and team in self.teams
        )


@dataclass(frozen=True, slots=True)
class Person:
    """Who signed in to the console through the identity provider, and what they may do.

    ``user`` is the name jobs carry (Slurm user, Kubernetes owner label); ``teams`` the teams the
    groups claim named; ``fleet`` says the person sees the whole fleet (fleet-reader or admin)."""

    user: str
    teams: tuple[str, ...]
    role: Role
    fleet: bool
    # The address the identity provider vouches for (its verified email claim), if any.
    email: str | None = None

    @property
    def scope(self) -> JobScope | None:
        """The jobs this person may see, or None for every job."""
        if self.fleet or self.role is Role.ADMIN:
            return None
        return JobScope(users=frozenset({self.user}), teams=frozenset(self.teams))
