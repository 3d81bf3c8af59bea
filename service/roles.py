"""The roles of API tokens, declared apart from the token store so the CLI can offer them without
importing the database layer."""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    """What a token may do: agent ingests for its node, reader reads, admin does everything."""

    AGENT = "agent"
    READER = "reader"
    ADMIN = "admin"
