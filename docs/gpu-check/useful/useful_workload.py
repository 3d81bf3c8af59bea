"""One workload of the useful-work check (issue 47), run as its own process under the agent.

Run: python useful_workload.py PHASES_JSON PHASE:SECONDS [PHASE:SECONDS ...]. Keep-alive loops that do no useful
work (``pid_matmul``, ``relu_bursts``, ``spin_sleep``), a hung kernel (``hung_flag``) and real
work that must never be called sham or hung (``starved_training``, ``inference_light``,
``checkpoint_write``, ``eval_loop``, ``notebook_cell``). Appends the phase's start (after the
CUDA context exists) and end (Unix time) to PHASES_JSON as it goes. One process runs its
phases in turn, as one job would (``hung_flag`` never returns: run it last, or alone).
"""

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

dev = torch.device("cuda")
GIB = 1024**3


def pid_matmul(seconds: float) -> None:
    """fp32 matmuls and sleeps held at a 50% duty cycle by a PID controller (as published
    keep-alive packages do to keep NVML's utilisation at a target)."""
    a = torch.randn(4096, 4096, device=dev)
    target, kp, ki = 0.5, 0.6, 0.2
    integral, sleep_s, period = 0.0, 0.05, 0.1
    end = time.time() + seconds
    while time.time() < end:
        t0 = time.perf_counter()
        busy_until = t0 + period * (1 - sleep_s / period)
        while time.perf_counter() < busy_until:
            a @ a
            torch.cuda.synchronize()
        busy = time.perf_counter() - t0
        time.sleep(max(0.0, sleep_s))
        share = busy / (time.perf_counter() - t0)
        err = share - target
        integral += err
        sleep_s = min(period, max(0.0, sleep_s + kp * err * period + ki * integral * period * 0.1))


def relu_bursts(seconds: float) -> None:
    """In-place ReLU bursts over a held 8 GiB block every 3 s ("convinces most schedulers that
    the GPU is still busy")."""
    x = torch.randn(2 * GIB, device=dev)  # 8 GiB of fp32
    end = time.time() + seconds
    while time.time() < end:
        t0 = time.time()
        for _ in range(40):
            torch.relu_(x)
            x.neg_()
        torch.cuda.synchronize()
        time.sleep(max(0.0, 3.0 - (time.time() - t0)))


def spin_sleep(seconds: float) -> None:
    """A spin kernel (torch.cuda._sleep, one block) of about 200 ms, then 10 ms of host sleep."""
    cycles = int(1.8e9 * 0.2)  # about 200 ms at the H100/H200 boost clock
    end = time.time() + seconds
    while time.time() < end:
        torch.cuda._sleep(cycles)
        torch.cuda.synchronize()
        time.sleep(0.01)


_HUNG: dict[str, object] = {}


def prepare_hung() -> None:
    """Compile the waiting kernel (it returns at once while the flag is set) and hold 3 GiB,
    before the phase starts: the compiler's file reads are not the hung job's."""
    flag = torch.ones(1, dtype=torch.int32, device=dev)
    buf = torch.empty(3 * GIB, dtype=torch.uint8, device=dev)  # what the job held
    buf.fill_(1)
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def wait(flag_ptr):
            seen = tl.load(flag_ptr, volatile=True)
            while seen == 0:
                seen = tl.load(flag_ptr, volatile=True)

        wait[(1,)](flag)
        torch.cuda.synchronize()
        _HUNG["wait"] = wait
        print("hung_flag: triton kernel compiled", flush=True)
    except Exception as exc:  # no Triton: a spin that outlives the phase stands in
        print(f"hung_flag: triton failed ({exc!r}); torch.cuda._sleep instead", flush=True)
    _HUNG["flag"], _HUNG["buf"] = flag, buf


def hung_flag(seconds: float) -> None:
    """A kernel waiting on a flag that is never set: a collective waiting for a dead peer.
    The process is killed from outside when the phase ends."""
    flag = _HUNG["flag"]
    flag.zero_()  # type: ignore[attr-defined]
    torch.cuda.synchronize()
    if "wait" in _HUNG:
        _HUNG["wait"][(1,)](flag)  # type: ignore[index]
    else:
        torch.cuda._sleep(2**62)
    torch.cuda.synchronize()  # never returns


def starved_training(seconds: float) -> None:
    """A training step fed by one slow reader: batches read from a file and decoded on the CPU."""
    data = Path("/tmp/gwu-data.bin")
    if not data.exists():
        data.write_bytes(np.random.default_rng(0).integers(0, 255, 256 * 2**20, np.uint8).tobytes())
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(8),
        torch.nn.Flatten(), torch.nn.Linear(64 * 64, 1000),
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    size = 32 * 3 * 224 * 224
    end, off = time.time() + seconds, 0
    with data.open("rb", buffering=0) as fh:
        while time.time() < end:
            fh.seek(off % (256 * 2**20 - size))
            raw = np.frombuffer(fh.read(size), np.uint8).reshape(32, 3, 224, 224)
            off += size
            img = (raw.astype(np.float32) / 255.0 - 0.5) / 0.25
            x = torch.from_numpy(img).to(dev)
            loss = model(x).logsumexp(1).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            loss.item()


def inference_light(seconds: float) -> None:
    """A model server answering a request every 2 to 5 s over a local socket."""
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).to(dev).half()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    end = time.time() + seconds

    def client() -> None:
        rng = np.random.default_rng(1)
        while time.time() < end - 1:
            with socket.create_connection(("127.0.0.1", port)) as c:
                c.sendall(rng.standard_normal(64 * 4096).astype(np.float16).tobytes())
                c.shutdown(socket.SHUT_WR)
                c.recv(1 << 20)
            time.sleep(rng.uniform(2, 5))

    threading.Thread(target=client, daemon=True).start()
    srv.settimeout(1.0)
    while time.time() < end:
        try:
            conn, _ = srv.accept()
        except TimeoutError:
            continue
        with conn:
            body = b""
            while chunk := conn.recv(1 << 20):
                body += chunk
            x = torch.frombuffer(bytearray(body), dtype=torch.float16).view(64, 4096).to(dev)
            with torch.no_grad():
                for _ in range(50):
                    x = torch.tanh(model(x))
            conn.sendall(x.float().cpu().numpy().tobytes()[:4096])


def checkpoint_write(seconds: float) -> None:
    """A training loop that writes a 1 GiB checkpoint every few steps."""
    model = torch.nn.Sequential(*[torch.nn.Linear(8192, 8192) for _ in range(4)]).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 8192, device=dev)
    end, step = time.time() + seconds, 0
    while time.time() < end:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        step += 1
        if step % 20 == 0:
            torch.save(model.state_dict(), "/tmp/gwu-ckpt.pt")
            os.sync()


def eval_loop(seconds: float) -> None:
    """Evaluation: a held-out set on the host, batch by batch to the GPU, accuracy summed."""
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 128, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
        torch.nn.Flatten(), torch.nn.Linear(128 * 16, 100),
    ).to(dev).eval()
    images = torch.randn(64, 64, 3, 224, 224).pin_memory()
    labels = torch.randint(0, 100, (64, 64))
    end, i, right = time.time() + seconds, 0, 0
    with torch.no_grad():
        while time.time() < end:
            x = images[i % 64].to(dev, non_blocking=True)
            right += int((model(x).argmax(1).cpu() == labels[i % 64]).sum())
            i += 1


def notebook_cell(seconds: float) -> None:
    """A notebook: a third of the time idle (the user reading), then a cell fitting a model on a
    host-side table, batch by batch."""
    xs = torch.randn(200_000, 1024)
    ys = torch.randn(200_000, 1)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 1)).to(dev)  # fmt: skip
    opt = torch.optim.Adam(model.parameters())
    time.sleep(seconds / 3)
    end = time.time() + 2 * seconds / 3
    while time.time() < end:
        for i in range(0, 200_000, 4096):
            x, y = xs[i : i + 4096].to(dev), ys[i : i + 4096].to(dev)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            if time.time() >= end:
                break


PHASES = {f.__name__: f for f in (pid_matmul, relu_bursts, spin_sleep, hung_flag,
          starved_training, inference_light, checkpoint_write, eval_loop, notebook_cell)}  # fmt: skip
WASTE = {"pid_matmul": "sham", "relu_bursts": "sham", "spin_sleep": "sham", "hung_flag": "hung"}


def main() -> None:
    out = Path(sys.argv[1])
    torch.zeros(1, device=dev)
    torch.cuda.synchronize()
    for arg in sys.argv[2:]:
        name, seconds = arg.split(":")
        if name == "hung_flag":
            prepare_hung()
        t0 = time.time()
        phases = json.loads(out.read_text()) if out.exists() else []
        phases.append({"phase": name, "want": WASTE.get(name, "useful"), "start": t0,
                       "end": t0 + float(seconds), "pid": os.getpid()})  # fmt: skip
        out.write_text(json.dumps(phases, indent=1))
        PHASES[name](float(seconds))
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        phases[-1]["end"] = time.time()
        out.write_text(json.dumps(phases, indent=1))


if __name__ == "__main__":
    main()
