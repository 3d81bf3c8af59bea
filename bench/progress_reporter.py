"""What ``ProgressReporter.advance`` costs a training loop: nanoseconds per call while its
background thread sends to a loopback receiver every second, beside a bare Python counter
function (the reference: the least a call can cost) and the target.

The receiver answers every POST 201 at once (a stdlib HTTP server in a thread), so the figure is
the reporter's own cost: the lock, the clock read and the thread's sends competing for the GIL.

    flock /tmp/bench.lock .venv/bin/python -m bench.progress_reporter          # --calls 2000000
"""

from __future__ import annotations

import argparse
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench.common import machine
from service.progress import ProgressReporter

TARGET_NS_PER_CALL = 2_000  # 2 µs: a training step takes milliseconds


class _Receiver(BaseHTTPRequestHandler):
    posts = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).posts += 1
        self.send_response(201)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        pass


def _ns_per_call(fn: object, calls: int) -> float:
    assert callable(fn)
    began = time.perf_counter_ns()
    for _ in range(calls):
        fn(1)
    return (time.perf_counter_ns() - began) / calls


def main() -> None:
    """Time the calls and print the figures beside the target."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=2_000_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    total = [0.0]

    def bare(n: float) -> None:
        total[0] += n

    reporter = ProgressReporter(
        "samples", every_seconds=1, central_url=url, token="t", job_id="bench:1", env={}
    )
    bare_ns = min(_ns_per_call(bare, args.calls) for _ in range(args.runs))
    began = time.monotonic()
    advance_ns = min(_ns_per_call(reporter.advance, args.calls) for _ in range(args.runs))
    seconds = time.monotonic() - began
    reporter.close()
    server.shutdown()
    print(machine())
    print(f"calls per run: {args.calls:,}, best of {args.runs}")
    print(f"bare counter function (reference): {bare_ns:,.0f} ns per call")
    print(
        f"ProgressReporter.advance: {advance_ns:,.0f} ns per call "
        f"(target <= {TARGET_NS_PER_CALL:,} ns: {'met' if advance_ns <= TARGET_NS_PER_CALL else 'MISSED'})"
    )
    print(f"sends during the {seconds:.1f} s of advance runs: {_Receiver.posts}")


if __name__ == "__main__":
    main()
