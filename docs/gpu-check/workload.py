"""Three-phase GPU workload for the agent check: bf16 matmul, memory-bound elementwise, idle holding memory.

Run: python workload.py PHASE_SECONDS PHASES_JSON. Writes each phase's start/end (Unix time)
to PHASES_JSON. Runs with SLURM_JOB_ID set by the caller so the agent can attribute it.
"""

import json
import sys
import time

import torch


def main() -> None:
    seconds = float(sys.argv[1])
    out = sys.argv[2]
    dev = torch.device("cuda")
    phases = []

    # Phase 1: tensor-core bound (bf16 GEMM).
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t0 = time.time()
    while time.time() - t0 < seconds:
        for _ in range(20):
            c = a @ b
        torch.cuda.synchronize()
    phases.append({"phase": "matmul_bf16", "start": t0, "end": time.time()})
    del a, b, c

    # Phase 2: memory-bound elementwise (streams ~4 GiB per kernel, no tensor cores).
    x = torch.empty(1024 * 1024 * 1024, device=dev, dtype=torch.float32).fill_(1.0)
    y = torch.empty_like(x)
    torch.cuda.synchronize()
    t0 = time.time()
    while time.time() - t0 < seconds:
        for _ in range(10):
            torch.mul(x, 1.0001, out=y)
            torch.add(y, 1.0, out=x)
        torch.cuda.synchronize()
    phases.append({"phase": "elementwise_memory_bound", "start": t0, "end": time.time()})
    del y

    # Phase 3: idle while holding memory (x stays allocated: 4 GiB).
    torch.cuda.synchronize()
    t0 = time.time()
    time.sleep(seconds)
    phases.append({"phase": "idle_holding_memory", "start": t0, "end": time.time()})
    with open(out, "w") as fh:
        json.dump(phases, fh, indent=1)
    del x


if __name__ == "__main__":
    main()
