"""How far a PostgreSQL streaming replica is behind its primary, measured on both servers."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, text


@dataclass(frozen=True)
class ReplicaLag:
    """A replica's distance behind the primary: WAL bytes not yet replayed, and seconds since
    the primary committed the last transaction the replica has replayed (0 when caught up;
    None when behind with nothing replayed yet since it started); ``replicating`` is False for
    a server that is not in recovery (promoted, or a primary named as the replica)."""

    lag_bytes: int
    lag_seconds: float | None
    replicating: bool = True


def parse_lsn(lsn: str) -> int:
    """A WAL position such as ``0/3000148`` as one integer (bytes)."""
    high, _, low = lsn.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def primary_position(primary: Engine) -> int:
    """The primary's current WAL position (bytes)."""
    with primary.connect() as conn:
        return parse_lsn(str(conn.execute(text("SELECT pg_current_wal_lsn()")).scalar_one()))


def measure_lag(replica: Engine, *, primary_lsn: int) -> ReplicaLag:
    """The replica's lag behind ``primary_lsn`` (read on the primary just before: a replica
    that has replayed up to it holds every transaction committed before that read)."""
    with replica.connect() as conn:
        row = conn.execute(
            text(
                "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn(), "
                "EXTRACT(EPOCH FROM clock_timestamp() - pg_last_xact_replay_timestamp())"
            )
        ).one()
    in_recovery, replay, seconds = row
    if not in_recovery:
        # Promoted, or a primary named as the replica: it no longer follows the primary.
        return ReplicaLag(lag_bytes=0, lag_seconds=None, replicating=False)
    behind = max(0, primary_lsn - parse_lsn(str(replay))) if replay is not None else primary_lsn
    if behind == 0:
        return ReplicaLag(lag_bytes=0, lag_seconds=0.0)
    return ReplicaLag(
        lag_bytes=behind, lag_seconds=None if seconds is None else max(0.0, float(seconds))
    )
