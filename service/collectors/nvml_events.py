"""XID events through NVML: one event set for the physical GPUs, polled with timeout 0."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from service.collectors.nvml_fields import text

log = logging.getLogger(__name__)

_TIMEOUT = 10  # NVML_ERROR_TIMEOUT: no event waiting
_MAX_EVENTS_PER_POLL = 64


def open_xid_events(lib: Any, gpus: Iterable[tuple[Any, str]]) -> Any:
    """An event set with XID critical errors registered for each (handle, uuid); None if none."""
    try:
        events = lib.nvmlEventSetCreate()
    except lib.NVMLError as exc:
        log.warning("XID events unavailable: %s", exc)
        return None
    for handle, uuid in gpus:
        try:
            lib.nvmlDeviceRegisterEvents(handle, lib.nvmlEventTypeXidCriticalError, events)
        except lib.NVMLError as exc:
            log.info("XID events not supported on %s: %s", uuid, exc)
    return events


def poll_xids(lib: Any, events: Any) -> dict[str, float]:
    """The last XID per GPU uuid since the previous poll (event set, timeout 0)."""
    out: dict[str, float] = {}
    if events is None:
        return out
    for _ in range(_MAX_EVENTS_PER_POLL):
        try:
            data = lib.nvmlEventSetWait_v2(events, 0)
        except lib.NVMLError as exc:
            if getattr(exc, "value", None) != _TIMEOUT:
                log.warning("XID event poll failed: %s", exc)
            break
        try:
            uuid = text(lib.nvmlDeviceGetUUID(data.device))
        except lib.NVMLError:
            continue
        out[uuid] = float(data.eventData)
        log.warning("XID %d on GPU %s", data.eventData, uuid)
    return out
