"""The acting round: walk each firing alert's job up its policy's ladder, one step at a time.

Run by the evaluator's leader only, after each evaluation round. Crash-safe: a warning's notice,
its audit row and the step's count are one transaction; a reclaim records its intent first,
then asks the (idempotent) driver, then records the outcome, so a restart in between retries
the same reclaim and never takes a step twice or skips one.

``rounds`` walks the round (``ladder_once``, ``Ladder``), ``checks`` holds what must be verified
before any step, ``steps`` takes a warning or a reclaim, and ``turn`` is one job's due step.
"""

from service.usecases.ladder.rounds import Ladder, default_drivers, ladder_once
from service.usecases.ladder.turn import (
    NOTICE_CHANNEL_TYPES,
    Episode,
    LadderRoundResult,
    owner_notice,
)

__all__ = [
    "NOTICE_CHANNEL_TYPES",
    "Episode",
    "Ladder",
    "LadderRoundResult",
    "default_drivers",
    "ladder_once",
    "owner_notice",
]
