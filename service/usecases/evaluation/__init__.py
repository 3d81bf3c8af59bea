"""The evaluation round and its wiring: read data, run the pure evaluator, store, queue, send.

``rounds`` runs one round, ``notes`` words its notifications (with each job's verdict),
``config`` loads the YAML config file's policies, and ``alerting`` is the leader's runtime.
"""

from service.usecases.evaluation.alerting import Alerting
from service.usecases.evaluation.config import CONFIG_LOCK_KEY, check_file_channels, load_config
from service.usecases.evaluation.notes import (
    OWNER_KINDS,
    fault_xids,
    memory_unreported_gpus,
    notification,
    owner_addressees,
    verdict_by_job,
)
from service.usecases.evaluation.rounds import (
    FRESH_FAULT_SECONDS,
    RoundResult,
    StateCache,
    evaluate_once,
)

__all__ = [
    "CONFIG_LOCK_KEY",
    "FRESH_FAULT_SECONDS",
    "OWNER_KINDS",
    "Alerting",
    "RoundResult",
    "StateCache",
    "check_file_channels",
    "evaluate_once",
    "fault_xids",
    "load_config",
    "memory_unreported_gpus",
    "notification",
    "owner_addressees",
    "verdict_by_job",
]
