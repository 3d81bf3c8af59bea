"""One identity per MIG instance, whichever backend saw it.

A MIG instance is (parent GPU UUID, GPU instance id, profile), plus the time it was created:
GPU instance ids are reused when an administrator reconfigures the GPU, so the 1g.10gb on
instance 7 today is not the one of last week. The identity is
``MIG-<parent uuid>/<gi>/<profile>@<created, UTC>``; NVML's own ``MIG-<uuid>`` and
dcgm-exporter's (UUID, GPU_I_ID, GPU_I_PROFILE) labels both map onto it.

The creation time is when this node's agent first saw the instance, kept in the state directory
so that a restart (or a switch between the NVML and dcgm-exporter backends) keeps the identity; an
instance destroyed while its parent stays healthy is retired, and a later one on the same slot
gets a new identity.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

log = logging.getLogger(__name__)

_PROFILE = re.compile(r"\b(\d+g\.\d+gb(?:\+\w+)?)", re.IGNORECASE)


def profile_of(name: str) -> str | None:
    """The MIG profile (``1g.10gb``) in a device or model name, if any."""
    m = _PROFILE.search(name)
    return m.group(1).lower() if m else None


def mig_key(parent_uuid: str, gpu_instance_id: int | str, profile: str) -> str:
    """The slot part of a MIG identity: parent, GPU instance id and profile."""
    return f"MIG-{parent_uuid}/{gpu_instance_id}/{profile}"


class MigIdentities:
    """Slot -> creation time of the MIG instances on this node, persisted as a small JSON file."""

    def __init__(
        self, path: Path | None = None, *, clock: Callable[[], datetime] | None = None
    ) -> None:
        self.path = path
        self.clock = clock or (lambda: datetime.now(UTC))
        self._created: dict[str, str] = {}
        if path is not None:
            with contextlib.suppress(OSError, ValueError):
                loaded = json.loads(path.read_text())
                if isinstance(loaded, dict):
                    self._created = {str(k): str(v) for k, v in loaded.items()}

    def identity(self, parent_uuid: str, gpu_instance_id: int | str, profile: str) -> str:
        """The identity of the instance in this slot (its creation time noted on first sight)."""
        key = mig_key(parent_uuid, gpu_instance_id, profile)
        created = self._created.get(key)
        if created is None:
            created = self.clock().astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
            self._created[key] = created
            self._save()
        return f"{key}@{created}"

    def retire(self, identity: str) -> None:
        """Forget a destroyed instance, so a new one in its slot gets a new identity."""
        key = identity.rsplit("@", 1)[0]
        if self._created.pop(key, None) is not None:
            self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self._created, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError as exc:  # identities still hold for this run; a restart re-dates them
            log.warning("cannot save MIG instance identities to %s: %s", self.path, exc)
