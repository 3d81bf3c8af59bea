"""Real-GPU check of the health fields and the clocks' reasons (issue 49).

Run on a machine with an NVIDIA GPU, nvidia-ml-py and PyTorch, from the repository root:

    PYTHONPATH=. python3 docs/gpu-check/health_check.py out/

It records, in ``out/health_fields.json``:

1. NVML's own answer to ``nvmlDeviceGetFieldValues`` for every health field the agent asks
   (return code, value type, value) and to the clocks event reasons call, per GPU;
2. the agent's NVML backend polled once a second through three phases: idle (no CUDA context),
   a bf16 matrix-product loop at full tilt, and idle again holding its memory; each reading's
   health metrics and ``clocks_event_reasons`` with the names GPU Warden gives its bits.

``tests/unit/test_gpu_check_health.py`` replays the recorded NVML answers through the fake NVML
and checks the backend reads the same values, and that the names fit the phases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pynvml

from service.collectors.nvml import NvmlBackend
from service.collectors.nvml_fields import HEALTH_FIELDS
from service.vocabulary import clock_event_names, hw_slowdown

PHASE_SECONDS = float(os.environ.get("PHASE_SECONDS", "20"))
WATCHED = (*HEALTH_FIELDS.values(), "clocks_event_reasons")

LOAD = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + float(__import__("sys").argv[1])
while time.time() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
print("load done", flush=True)
time.sleep(float(__import__("sys").argv[2]))  # idle, holding the CUDA context and memory
"""


def raw_answers() -> list[dict[str, Any]]:
    """NVML's answers to the agent's health calls, per GPU, as the library returns them."""
    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        fields = []
        for fv in pynvml.nvmlDeviceGetFieldValues(h, list(HEALTH_FIELDS)):
            member = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
            value = getattr(fv.value, member[fv.valueType]) if 0 <= fv.valueType < 7 else None
            fields.append(
                {
                    "field_id": int(fv.fieldId),
                    "metric": HEALTH_FIELDS[int(fv.fieldId)],
                    "nvml_return": int(fv.nvmlReturn),
                    "value_type": int(fv.valueType),
                    "value": int(value) if fv.nvmlReturn == 0 and value is not None else None,
                }
            )
        out.append(
            {
                "index": i,
                "uuid": pynvml.nvmlDeviceGetUUID(h),
                "name": pynvml.nvmlDeviceGetName(h),
                "driver": pynvml.nvmlSystemGetDriverVersion(),
                "fields": fields,
                "clocks_event_reasons": int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)),
                "supported_clocks_event_reasons": int(
                    pynvml.nvmlDeviceGetSupportedClocksEventReasons(h)
                ),
            }
        )
    return out


def poll_phases(backend: NvmlBackend) -> list[dict[str, Any]]:
    """One reading of GPU 0 a second through idle, load and idle-holding phases."""
    rows: list[dict[str, Any]] = []

    def sample(phase: str, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            snap = backend.sample(datetime.now(UTC))
            r = snap.readings[0]
            got = {k: r.metrics[k] for k in WATCHED if k in r.metrics}
            reasons = got.get("clocks_event_reasons")
            rows.append(
                {
                    "phase": phase,
                    "t": time.time(),
                    "metrics": got,
                    "reason_names": clock_event_names(reasons),
                    "hw_slowdown": hw_slowdown(reasons),
                    "sm_active": r.metrics.get("sm_active"),
                    "power_watts": r.metrics.get("power_watts"),
                }
            )
            time.sleep(1.0)

    sample("idle", PHASE_SECONDS)
    load = subprocess.Popen(
        [sys.executable, "-c", LOAD, str(PHASE_SECONDS), str(PHASE_SECONDS + 5)],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(4.0)  # CUDA start-up
    sample("load", PHASE_SECONDS - 4.0)
    assert load.stdout is not None
    load.stdout.readline()  # "load done"
    time.sleep(2.0)
    sample("idle_holding", PHASE_SECONDS - 4.0)
    load.wait()
    return rows


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    pynvml.nvmlInit()
    backend = NvmlBackend(energy_every_cycles=1)  # health fields every poll, for the record
    backend.open()
    result = {"nvml": raw_answers(), "readings": poll_phases(backend)}
    (out / "health_fields.json").write_text(json.dumps(result, indent=1) + "\n")
    for phase in ("idle", "load", "idle_holding"):
        rows = [r for r in result["readings"] if r["phase"] == phase]
        names = sorted({n for r in rows for n in r["reason_names"]})
        print(phase, len(rows), "readings; reasons seen:", names)
    print(json.dumps(result["nvml"], indent=1))


if __name__ == "__main__":
    main()
