"""Where the agent keeps its state files (spool, dead letters): one directory, found in one place.

The order follows how each deployment provides a writable place: systemd's ``StateDirectory=``
sets ``$STATE_DIRECTORY``; the Kubernetes DaemonSet mounts a volume and names it in
``GPUWARDEN_STATE_DIR``; a desktop session has ``$XDG_STATE_HOME``; otherwise ``./gpuwarden-data``
(what ``gpuwarden up`` has always used). A relative default such as the old
``gpuwarden-dead-letter.jsonl`` is not writable under ``ProtectSystem=strict`` (cwd ``/``) nor on
a read-only root filesystem, so no state file has a default of its own any more.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_STATE_DIR = Path("gpuwarden-data")
SPOOL_FILE = "spool.sqlite"
DEAD_LETTER_FILE = "dead-letter.jsonl"
MIG_FILE = "mig-instances.json"
JOB_END_DIR = "job-ends"  # where the Slurm epilog leaves job ends for the agent to ship


@dataclass(frozen=True, slots=True)
class StatePaths:
    """The state directory, the source that chose it, and the files inside it."""

    directory: Path
    source: str  # which rule picked the directory, for the start-up line
    spool: Path
    dead_letter: Path
    mig_instances: Path  # when this node first saw each MIG instance (collectors/mig.py)
    job_ends: Path  # job ends the Slurm epilog leaves here (deploy/slurm/epilog.sh)


def state_directory(explicit: Path | None, env: Mapping[str, str]) -> tuple[Path, str]:
    """The state directory and why: explicit setting, systemd, XDG, else ./gpuwarden-data."""
    if explicit is not None:
        return explicit, "GPUWARDEN_STATE_DIR"
    systemd = env.get("STATE_DIRECTORY", "")
    if systemd:
        # systemd joins several StateDirectory= entries with ':'; the first is ours.
        return Path(systemd.split(":")[0]), "STATE_DIRECTORY"
    xdg = env.get("XDG_STATE_HOME", "")
    if xdg:
        return Path(xdg) / "gpuwarden", "XDG_STATE_HOME"
    return DEFAULT_STATE_DIR, "default"


def state_paths(
    *,
    state_dir: Path | None,
    env: Mapping[str, str],
    spool_path: Path | None = None,
    dead_letter_path: Path | None = None,
    job_end_dir: Path | None = None,
    suffix: str = "",
) -> StatePaths:
    """Every state file's path; an explicit file setting wins over the directory.

    ``suffix`` tells the files of several local agents apart (``gpuwarden demo``).
    """
    directory, source = state_directory(state_dir, env)
    stem = f"-{suffix}" if suffix else ""
    return StatePaths(
        directory=directory,
        source=source,
        spool=spool_path or directory / SPOOL_FILE.replace(".", f"{stem}.", 1),
        dead_letter=dead_letter_path or directory / DEAD_LETTER_FILE.replace(".", f"{stem}.", 1),
        mig_instances=directory / MIG_FILE.replace(".", f"{stem}.", 1),
        job_ends=job_end_dir or directory / f"{JOB_END_DIR}{stem}",
    )
