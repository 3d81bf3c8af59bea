"""Cost of the agent's once-per-cycle kubelet pod-resources List, client side.

A fake kubelet (tests/kubelet_fake.py, real grpcio) runs in a child process on a unix socket and
answers with ``--gpu-pods`` pods holding one GPU each and ``--other-pods`` pods holding none (the
kubelet lists every pod of the node). The agent's client calls List ``--calls`` times; the numbers
are this process's wall time and CPU (user + system) per call.

Run: .venv/bin/python bench/podresources.py [--gpu-pods 8] [--other-pods 100] [--calls 2000]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from service.collectors.kubelet.podresources import PodResourcesClient

SERVER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
from tests.kubelet_fake import FakeContainer, FakePod, fake_kubelet
pods = [FakePod("ml", f"train-{{i}}", [FakeContainer("main", {{"nvidia.com/gpu": [f"GPU-{{i:04d}}"]}},
        cpu_ids=list(range(8)))]) for i in range({gpu_pods})]
pods += [FakePod("system", f"other-{{i}}", [FakeContainer("c", {{}}, cpu_ids=[1])])
         for i in range({other_pods})]
with fake_kubelet(Path({sock!r}), pods):
    print("ready", flush=True)
    sys.stdin.read()
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu-pods", type=int, default=8)
    ap.add_argument("--other-pods", type=int, default=100)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    sock = Path(tempfile.mkdtemp()) / "kubelet.sock"
    repo = str(Path(__file__).resolve().parents[1])
    code = SERVER.format(
        repo=repo, gpu_pods=args.gpu_pods, other_pods=args.other_pods, sock=str(sock)
    )
    server = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        client = PodResourcesClient(sock)
        assert len(client.list()) == args.gpu_pods
        before = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        for _ in range(args.calls):
            client.list()
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_SELF)
        client.close()
    finally:
        server.communicate("", timeout=30)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    print(
        f"List of {args.gpu_pods} GPU pods + {args.other_pods} others, {args.calls} calls: "
        f"{wall / args.calls * 1000:.3f} ms wall, {cpu / args.calls * 1000:.3f} ms CPU per call "
        f"(at a 10 s interval: {cpu / args.calls / 10 * 100:.4f}% of a core)"
    )


if __name__ == "__main__":
    main()
