"""What a running ``gpuwarden up`` or ``demo`` leaves in its state directory for the other commands.

``up`` and ``demo`` keep their SQLite database in the state directory (the agent's, see
``service.collectors.state_dir``) and, while they run, a ``running.json`` naming their database,
URL and reader token. ``token``, ``report``, ``gpus`` and ``job`` run next to them find the same
database and service there, unless a database URL, service URL or token is given explicitly, and
say which they used.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from service.clientsettings import ClientSettings
from service.collectors.state_dir import state_directory

if TYPE_CHECKING:
    from service.settings import Settings

RUNNING_FILE = "running.json"
DATABASE_FILES = {"up": "gpuwarden.db", "demo": "demo.db"}


@dataclass(frozen=True, slots=True)
class LocalRun:
    """A running ``up`` or ``demo``: its process, service URL, database and reader token."""

    command: str
    pid: int
    url: str
    database_url: str
    reader_token: str


class HasStateDir(Protocol):
    """Settings that name a state directory: ``Settings`` or the CLI's ``ClientSettings``."""

    @property
    def state_dir(self) -> Path | None:
        """GPUWARDEN_STATE_DIR, if given."""


def state_dir(settings: HasStateDir) -> Path:
    """The state directory of this machine's ``up``/``demo`` (the agent's state directory rule)."""
    return state_directory(settings.state_dir, os.environ)[0]


def local_database_url(settings: Settings, command: str) -> str:
    """The database ``up`` or ``demo`` uses: the one given, else a SQLite file in the state dir."""
    if "database_url" in settings.model_fields_set:
        return settings.database_url
    return f"sqlite:///{(state_dir(settings) / DATABASE_FILES[command]).resolve()}"


def write_private(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` as JSON readable by its owner only (it holds a token)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
    tmp.replace(path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None if it is missing or unreadable."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def record_running(settings: Settings, run: LocalRun) -> Path:
    """Leave ``running.json`` for the other commands; returns its path."""
    path = state_dir(settings) / RUNNING_FILE
    write_private(path, asdict(run))
    return path


def forget_running(path: Path, pid: int) -> None:
    """Remove ``running.json`` if it is still this process's."""
    doc = read_json(path)
    if doc is not None and doc.get("pid") == pid:
        path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_running(settings: HasStateDir) -> LocalRun | None:
    """The ``up`` or ``demo`` running from this state directory, if any."""
    doc = read_json(state_dir(settings) / RUNNING_FILE)
    if doc is None:
        return None
    try:
        run = LocalRun(**doc)
    except TypeError:
        return None
    return run if _alive(run.pid) else None


def resolve_database(settings: Settings) -> tuple[Settings, str]:
    """Settings whose database is the one meant, and a line saying which and why.

    An explicit ``--database-url`` or GPUWARDEN_DATABASE_URL wins; else a running ``up``/``demo``
    of this state directory; else ``up``'s database if it exists; else the default.
    """
    given = settings.database_url if "database_url" in settings.model_fields_set else None
    url, why = resolve_database_url(given, settings, default=settings.database_url)
    return settings.model_copy(update={"database_url": url}), why


def resolve_database_url(
    given: str | None, settings: HasStateDir, *, default: str
) -> tuple[str, str]:
    """The database URL meant (``given``, a running ``up``/``demo``'s, ``up``'s, ``default``), and
    a line saying which and why: ``resolve_database`` without the pydantic settings."""
    if given is not None:
        return given, f"database {given} (given)"
    run = find_running(settings)
    if run is not None:
        why = f"database {run.database_url} (of the running gpuwarden {run.command}, pid {run.pid})"
        return run.database_url, why
    up_db = state_dir(settings) / DATABASE_FILES["up"]
    if up_db.exists():
        url = f"sqlite:///{up_db.resolve()}"
        return url, f"database {url} (gpuwarden up's)"
    return default, f"database {default} (the default)"


def resolve_service(settings: ClientSettings) -> ClientSettings:
    """Settings whose service URL and token are the running ``up``/``demo``'s unless given."""
    run = find_running(settings)
    if run is None:
        return settings
    update: dict[str, str] = {}
    if "central_url" not in settings.given:
        update["central_url"] = run.url
        if not settings.api_token:
            update["api_token"] = run.reader_token
    return settings.replace(**update)
