"""Workloads that each exercise one cause of docs/diagnosis.md, for the real-GPU cause check.

Run: python causes_workload.py SECONDS PHASES_JSON PHASE [PHASE ...]; PHASE is one of PHASES
below (or "mixed": a job passing through several causes, SECONDS / 4 each). Appends each
phase's start/end (Unix time) and the cause it should get to PHASES_JSON as it goes.
"""

import json
import sys
import time

import numpy as np
import torch

GIB = 1024**3
dev = torch.device("cuda")


def until(deadline: float) -> bool:
    return time.time() < deadline


def idle_held(seconds: float) -> None:
    """Nothing running while 22 GiB stay allocated (a forgotten notebook)."""
    x = torch.empty(22 * GIB, dtype=torch.uint8, device=dev)
    x.fill_(1)
    torch.cuda.synchronize()
    time.sleep(seconds)
    del x


def launch_bound(seconds: float) -> None:
    """Tiny kernels back to back: the GPU is busy most of the time but fills few SMs."""
    x = torch.zeros(1024, device=dev)
    end = time.time() + seconds
    while until(end):
        for _ in range(1000):
            x.add_(1.0)
        torch.cuda.synchronize()


def input_starved(seconds: float) -> None:
    """A training step fed by CPU decoding: full-size kernels, but only a small part of the time.

    Each step decodes a batch on the CPU (about 60 ms of numpy work, as a DataLoader without
    enough workers would), copies it to the GPU and runs about 15 ms of bf16 matmuls.
    """
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 255, size=(32, 3, 224, 224), dtype=np.uint8)
    end = time.time() + seconds
    while until(end):
        t = time.perf_counter()
        while time.perf_counter() - t < 0.06:  # "decode": CPU-bound work
            img = raw.astype(np.float32) / 255.0
            img = (img - img.mean()) / (img.std() + 1e-6)
        batch = torch.from_numpy(img).to(dev, non_blocking=False)
        for _ in range(8):
            c = a @ a
        c.add_(batch.mean())
        torch.cuda.synchronize()


def transfer_bound(seconds: float) -> None:
    """Pinned host-device copies both ways on their own streams while the SMs wait."""
    h2d_src = torch.empty(1 * GIB, dtype=torch.uint8).pin_memory()
    d2h_dst = torch.empty(1 * GIB, dtype=torch.uint8).pin_memory()
    d_in = torch.empty(1 * GIB, dtype=torch.uint8, device=dev)
    d_out = torch.ones(1 * GIB, dtype=torch.uint8, device=dev)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    end = time.time() + seconds
    while until(end):
        with torch.cuda.stream(s1):
            d_in.copy_(h2d_src, non_blocking=True)
        with torch.cuda.stream(s2):
            d2h_dst.copy_(d_out, non_blocking=True)
        torch.cuda.synchronize()


def memory_bound(seconds: float) -> None:
    """Elementwise kernels streaming 4 GiB each: SMs busy, DRAM bandwidth the limit."""
    x = torch.ones(GIB, device=dev, dtype=torch.float32)
    y = torch.empty_like(x)
    end = time.time() + seconds
    while until(end):
        for _ in range(10):
            torch.mul(x, 1.0001, out=y)
            torch.add(y, 1.0, out=x)
        torch.cuda.synchronize()


def compute_no_tensor(seconds: float) -> None:
    """fp32 SGEMM with TF32 off: SMs busy on FMA pipes, tensor cores idle."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    a = torch.randn(8192, 8192, device=dev, dtype=torch.float32)
    end = time.time() + seconds
    while until(end):
        for _ in range(4):
            c = a @ a
        torch.cuda.synchronize()
    del c


def compute_tensor(seconds: float) -> None:
    """bf16 matmuls on tensor cores (healthy)."""
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    end = time.time() + seconds
    while until(end):
        for _ in range(20):
            c = a @ a
        torch.cuda.synchronize()
    del c


def mig_fit(seconds: float) -> None:
    """A fifth of an H200's memory (28 GiB) held, bf16 matmuls about a fifth of the time:
    a job a MIG slice would hold."""
    x = torch.empty(27 * GIB, dtype=torch.uint8, device=dev)
    x.fill_(1)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    end = time.time() + seconds
    while until(end):
        for _ in range(10):
            c = a @ a
        torch.cuda.synchronize()
        time.sleep(0.08)
    del c, x


PHASES = {
    "idle_held": idle_held,
    "launch_bound": launch_bound,
    "input_starved": input_starved,
    "transfer_bound": transfer_bound,
    "memory_bound": memory_bound,
    "compute_no_tensor": compute_no_tensor,
    "compute_tensor": compute_tensor,
    "mig_fit": mig_fit,
}
MIXED = ("launch_bound", "compute_tensor", "transfer_bound", "idle_held")


def main() -> None:
    seconds = float(sys.argv[1])
    out = sys.argv[2]
    torch.zeros(1, device=dev)  # the CUDA context first, outside any phase
    torch.cuda.synchronize()
    phases = []
    for name in sys.argv[3:]:
        steps = [(f"mixed:{p}", p, seconds / len(MIXED)) for p in MIXED] if name == "mixed" else [
            (name, name, seconds)
        ]  # fmt: skip
        for label, cause, length in steps:
            t0 = time.time()
            PHASES[cause](length)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            phases.append({"phase": label, "cause": cause, "start": t0, "end": time.time()})
            with open(out, "w") as fh:
                json.dump(phases, fh, indent=1)


if __name__ == "__main__":
    main()
