"""The simulated fleet's scenarios, one per cause of docs/diagnosis.md, apart from the simulator
so the command line can name them without importing it (service.collectors.simulated)."""

from __future__ import annotations

SCENARIOS: tuple[str, ...] = (
    "training",
    "memory-bound",
    "idle-held",
    "idle",
    "xid-then-lost",
    "launch-bound",
    "input-starved",
    "transfer-bound",
    "no-tensor",
)
# The cause each scenario's samples get under the default thresholds (service.core.diagnosis).
SCENARIO_CAUSES: dict[str, str] = {
    "training": "compute_tensor",
    "memory-bound": "memory_bound",
    "idle-held": "idle_held",
    "idle": "idle_empty",
    "xid-then-lost": "compute_tensor",
    "launch-bound": "launch_bound",
    "input-starved": "input_starved",
    "transfer-bound": "transfer_bound",
    "no-tensor": "compute_no_tensor",
}
