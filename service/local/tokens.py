"""The tokens ``up`` and ``demo`` use: kept in the state directory and reused while they work."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Engine

from service.db import tokens_repo
from service.local.run import read_json, write_private


def _token(engine: Engine, role: str, node: str | None, name: str) -> str:
    with engine.begin() as conn:
        secret, _ = tokens_repo.create_token(
            conn, role=tokens_repo.Role(role), node=node, name=name, now=datetime.now(UTC)
        )
    return secret


def own_tokens(
    engine: Engine, path: Path, wanted: dict[str, tuple[str, str, str | None]]
) -> dict[str, str]:
    """The tokens ``up`` or ``demo`` needs, by key -> (role, name, node): the last run's when
    they still work, else new ones.

    Each run used to mint new tokens and leave the old ones valid; now the secrets are kept in
    the state directory (owner-only) and reused, and tokens of these names that cannot be reused
    are revoked before new ones are made.
    """
    kept = read_json(path) or {}
    with engine.connect() as conn:
        working = {}
        for key, (role, _, node) in wanted.items():
            secret = kept.get(key)
            info = tokens_repo.authenticate(conn, token=secret) if isinstance(secret, str) else None
            if info is not None and info.role.value == role and info.node == node:
                working[key] = str(secret)
    if len(working) == len(wanted):
        return working
    now = datetime.now(UTC)
    names = {name for _, name, _ in wanted.values()}
    with engine.begin() as conn:
        for info in tokens_repo.list_tokens(conn):
            if info.revoked_at is None and info.name in names:
                tokens_repo.revoke_token(conn, token_id=info.id, now=now)
    fresh = {key: _token(engine, role, node, name) for key, (role, name, node) in wanted.items()}
    write_private(path, fresh)
    return fresh
