"""Job ends the Slurm epilog leaves for the agent: taken into the spool, then sent to central."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from service.collectors.shipper import Shipper
from service.collectors.spool import Spool
from service.delivery import LogThrottle

log = logging.getLogger(__name__)


def collect_job_ends(folder: Path | None, spool: Spool, *, now: float) -> int:
    """Move the job ends the Slurm epilog left in ``folder`` into the spool; returns how many.

    Each file is ``{"job_id": ..., "ended_at": ...}``, written whole then renamed.
    """
    if folder is None or not folder.is_dir():
        return 0
    taken = 0
    for f in sorted(folder.glob("*.json")):
        try:
            doc = json.loads(f.read_text())
            job_id, ended_at = str(doc["job_id"]), str(doc["ended_at"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("job end file %s cannot be read (%s); set aside as .bad", f, exc)
            f.replace(f.with_suffix(".bad"))
            continue
        spool.add_job_end(job_id, ended_at, now=now)
        f.unlink(missing_ok=True)
        taken += 1
    return taken


def ship_job_ends(
    spool: Spool, shipper: Shipper, said: LogThrottle, monotonic: Callable[[], float]
) -> int:
    """Send the spooled job ends to central; returns how many it took.

    Kept on no answer, 5xx, 429 or 401/403, for the next cycle; dropped (logged) when central can
    never take one: 404 (the job was never registered) or another 4xx.
    """
    done = 0
    for job_id, ended_at in spool.job_ends():
        reply = shipper.end_job(job_id, ended_at)
        status = reply.status
        if status is not None and 200 <= status < 300:
            spool.remove_job_end(job_id)
            done += 1
            continue
        if status is None or status >= 500 or status in (401, 403, 408, 429):
            if said.due("job_end", monotonic()):
                log.warning(
                    "central did not take the end of job %s (%s %s); kept, next try in one cycle",
                    job_id,
                    status or "no answer:",
                    reply.message[:200],
                )
            break
        log.warning(
            "central refused the end of job %s at %s (%s %s); dropped",
            job_id,
            ended_at,
            status,
            reply.message[:200],
        )
        spool.remove_job_end(job_id)
    return done
