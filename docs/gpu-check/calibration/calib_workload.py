"""Before/after workloads for the recoverable-share calibration: one run of one workload.

Run: python calib_workload.py RUN SECONDS OUT_JSON, RUN being ``<cause>:before`` (the wasteful
version), ``<cause>:after`` (the same work with the fix applied) or ``<name>:target`` (what a
fed GPU reaches, measured on work different from the pairs). The run lasts SECONDS; its first
WARM seconds are left out of the timing, and OUT_JSON gets the steps done after them, the
seconds per step and the run's start and end (Unix time).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch

GIB = 1024**3
MIB = 1024**2
WARM = float(os.environ.get("WARM_SECONDS", "3"))
dev = torch.device("cuda")
Step = Callable[[], None]


# --- input_starved: a training loop fed by CPU decoding ------------------------------------

DECODE_SECONDS = 0.040  # CPU work per batch, as a JPEG decode and augment would take
BATCH, FEATURES, WIDTH, LAYERS = 4096, 1024, 4096, 6


class Decoded(torch.utils.data.Dataset[torch.Tensor]):
    """Batches "decoded" on the CPU: DECODE_SECONDS of numpy work each, uint8 out."""

    def __init__(self) -> None:
        self.raw = np.random.default_rng(0).integers(0, 255, (BATCH, FEATURES), dtype=np.uint8)

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> torch.Tensor:
        t = time.perf_counter()
        img = self.raw
        while time.perf_counter() - t < DECODE_SECONDS:
            f = self.raw.astype(np.float32) * (1.0 / 255.0)
            img = ((f - f.mean()) * 255.0 / (f.std() + 1e-6)).clip(0, 255).astype(np.uint8)
        return torch.from_numpy(img)


def _mlp() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    layers: list[torch.nn.Module] = [torch.nn.Linear(FEATURES, WIDTH)]
    for _ in range(LAYERS):
        layers += [torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH)]
    model = torch.nn.Sequential(*layers).to(dev)
    return model, torch.optim.SGD(model.parameters(), lr=1e-4)


def _train_steps(workers: int, pin: bool) -> Iterator[None]:
    model, opt = _mlp()
    loader = torch.utils.data.DataLoader(
        Decoded(), batch_size=None, shuffle=False, num_workers=workers, pin_memory=pin,
        prefetch_factor=4 if workers else None, persistent_workers=bool(workers),
    )  # fmt: skip
    for batch in loader:
        x = batch.to(dev, non_blocking=pin).to(torch.bfloat16)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()  # the loop logs its loss every step
        yield


def input_starved(fixed: bool) -> Iterator[None]:
    """Without workers every batch is decoded in the training process while the GPU waits;
    fixed: 12 DataLoader workers and pinned memory keep batches ready."""
    return _train_steps(12, True) if fixed else _train_steps(0, False)


# --- compute_no_tensor: fp32 GEMMs without TF32 vs bf16 autocast ---------------------------


def compute_no_tensor(fixed: bool) -> Iterator[None]:
    """An MLP of 8192-wide GEMMs (forward, batch 8192) in fp32 with TF32 off; fixed: the same
    model under bf16 autocast."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    ws = [torch.randn(8192, 8192, device=dev) / 90.0 for _ in range(4)]
    x = torch.randn(8192, 8192, device=dev)

    def steps() -> Iterator[None]:
        while True:
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=fixed):
                h = x
                for w in ws:
                    h = torch.relu(h @ w)
                h.sum().item()
            yield

    return steps()


# --- launch_bound: hundreds of tiny kernels, eager vs one CUDA graph -----------------------

TINY_KERNELS = 400


def _tiny(x: torch.Tensor, y: torch.Tensor) -> None:
    for i in range(TINY_KERNELS // 4):
        x.mul_(0.999)
        x.add_(y)
        y.sub_(x, alpha=1e-3)
        x.clamp_(-10.0, 10.0 + i)


def _graph_or_eager(fn: Callable[[], None], fixed: bool) -> Iterator[None]:
    if fixed:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run: Callable[[], None] = g.replay
    else:
        run = fn
    while True:
        run()
        torch.cuda.synchronize()
        yield


def launch_bound(fixed: bool) -> Iterator[None]:
    """A step of 400 tiny elementwise kernels on 4096 floats (an optimizer over many small
    tensors), launched one by one; fixed: captured once and replayed as one CUDA graph."""
    x = torch.randn(4096, device=dev)
    y = torch.randn(4096, device=dev)
    return _graph_or_eager(lambda: _tiny(x, y), fixed)


# --- transfer_bound: pageable copies vs pinned async on two streams ------------------------

COPY_BYTES = 256 * MIB


def transfer_bound(fixed: bool) -> Iterator[None]:
    """256 MiB to the GPU per step from pageable host memory; fixed: from pinned memory, two
    halves async on two streams."""
    host = torch.ones(COPY_BYTES, dtype=torch.uint8)
    if fixed:
        host = host.pin_memory()
    d = torch.empty(COPY_BYTES, dtype=torch.uint8, device=dev)
    half = COPY_BYTES // 2
    streams = (torch.cuda.Stream(), torch.cuda.Stream())

    def steps() -> Iterator[None]:
        while True:
            if fixed:
                for k, s in enumerate(streams):
                    with torch.cuda.stream(s):
                        d[k * half : (k + 1) * half].copy_(
                            host[k * half : (k + 1) * half], non_blocking=True
                        )
            else:
                d.copy_(host)
            torch.cuda.synchronize()
            yield

    return steps()


# --- memory_bound: an elementwise chain over 4 GiB, fp32 vs bf16 ---------------------------


def memory_bound(fixed: bool) -> Iterator[None]:
    """An elementwise chain (scale, shift, clamp) over 4 GiB of fp32 tensors; fixed: the same
    chain on bf16 tensors (half the bytes)."""
    dtype = torch.bfloat16 if fixed else torch.float32
    n = GIB  # elements: 4 GiB in fp32
    x = torch.ones(n, device=dev, dtype=dtype)
    y = torch.empty_like(x)

    def steps() -> Iterator[None]:
        while True:
            torch.mul(x, 1.0001, out=y)
            torch.add(y, 0.5, out=x)
            x.clamp_(max=1e4)
            torch.cuda.synchronize()
            yield

    return steps()


# --- targets: what a fed GPU reaches, on work other than the pairs' -------------------------


def fed_target() -> Iterator[None]:
    """bf16 GEMMs back to back from data on the GPU: the duty cycle a fed GPU reaches."""
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)

    def steps() -> Iterator[None]:
        while True:
            for _ in range(10):
                a @ a
            torch.cuda.synchronize()
            yield

    return steps()


def _ones_added(graph: bool) -> Iterator[None]:
    x = torch.zeros(1, device=dev)

    def fn() -> None:
        for _ in range(1000):
            x.add_(1.0)

    return _graph_or_eager(fn, graph)


def launch_target() -> Iterator[None]:
    """1000 1-element adds a step (not the pair's kernels) replayed as one CUDA graph: the
    duty cycle tiny kernels reach once the launch rate is no limit, and their time each."""
    return _ones_added(True)


def launch_eager_target() -> Iterator[None]:
    """The same 1-element adds launched one by one: with ``launch_target`` the engine time a
    tiny kernel takes from a graph over its engine time launched alone."""
    return _ones_added(False)


def transfer_target() -> Iterator[None]:
    """1 GiB pinned copies to the GPU, async on two streams: the link's practical peak one
    way."""
    host = torch.ones(GIB, dtype=torch.uint8).pin_memory()
    d = torch.empty(GIB, dtype=torch.uint8, device=dev)
    half = GIB // 2
    streams = (torch.cuda.Stream(), torch.cuda.Stream())

    def steps() -> Iterator[None]:
        while True:
            for k, s in enumerate(streams):
                with torch.cuda.stream(s):
                    d[k * half : (k + 1) * half].copy_(
                        host[k * half : (k + 1) * half], non_blocking=True
                    )
            torch.cuda.synchronize()
            yield

    return steps()


def memory_target() -> Iterator[None]:
    """A 2 GiB device-to-device copy: the DRAM activity a pure streaming kernel reaches."""
    x = torch.ones(2 * GIB, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)

    def steps() -> Iterator[None]:
        while True:
            y.copy_(x)
            x.copy_(y)
            torch.cuda.synchronize()
            yield

    return steps()


PAIRS: dict[str, Callable[[bool], Iterator[None]]] = {
    "input_starved": input_starved,
    "compute_no_tensor": compute_no_tensor,
    "launch_bound": launch_bound,
    "transfer_bound": transfer_bound,
    "memory_bound": memory_bound,
}
TARGETS: dict[str, Callable[[], Iterator[None]]] = {
    "fed": fed_target,
    "launch": launch_target,
    "launch_eager": launch_eager_target,
    "transfer": transfer_target,
    "memory": memory_target,
}


def steps_of(run: str) -> Iterator[None]:
    name, kind = run.split(":")
    if kind == "target":
        return TARGETS[name]()
    return PAIRS[name](kind == "after")


def main() -> None:
    run, seconds, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    torch.zeros(1, device=dev)
    torch.cuda.synchronize()
    start = time.time()
    steps = steps_of(run)
    end = start + seconds
    warm_at = start + WARM
    counted, t_warm, t_last = 0, None, None
    for _ in steps:
        now = time.time()
        if t_warm is not None:
            counted, t_last = counted + 1, now
        elif now >= warm_at:
            t_warm = now
        if now >= end:
            break
    t_end = time.time()
    timed = (t_last - t_warm) if t_last is not None and t_warm is not None else 0.0
    result = {
        "run": run,
        "start": start,
        "end": t_end,
        "warm_seconds": WARM,
        "timed_from": t_warm,
        "timed_seconds": timed,
        "steps": counted,
        "seconds_per_step": timed / counted if counted else None,
    }
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps(result), flush=True)
    os._exit(0)  # the DataLoader's persistent workers need no orderly shutdown


if __name__ == "__main__":
    main()
