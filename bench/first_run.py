"""The first minutes from a clean clone: ``make up`` until the console answers, then ``gpuwarden
demo`` until every default policy's alert is in its notification log.

The checkout's files (as git lists them) are copied to a temporary folder without ``.venv``; uv's
cache is a fresh folder too (``--warm-cache`` keeps the user's), so packages come from the
registry as on a new machine. Targets: the console within 60 s of ``make up``; every default
alert within a minute of ``demo``.

    flock /tmp/bench.lock .venv/bin/python -m bench.first_run
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import free_port, machine
from service.thresholds.default_policies import default_policies
from service.thresholds.policy import SILENT_SECONDS

ROOT = Path(__file__).resolve().parents[1]


def clean_clone(into: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, into / name)
    return into


def seconds_until(check, proc: subprocess.Popen[bytes], began: float, limit: float = 900) -> float:
    while time.monotonic() - began < limit:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}")
        try:
            if check():
                return time.monotonic() - began
        except (OSError, httpx.HTTPError):
            pass
        time.sleep(0.25)
    raise RuntimeError("timed out")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm-cache", action="store_true", help="keep the user's uv cache")
    args = parser.parse_args()
    print(f"machine: {machine()}; load: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="gpuwarden-first-run-") as tmp:
        checkout = clean_clone(Path(tmp) / "checkout")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "VIRTUAL"))}
        env.pop("PYTHONPATH", None)
        if not args.warm_cache:
            env["UV_CACHE_DIR"] = str(Path(tmp) / "uv-cache")
            env["PIP_NO_CACHE_DIR"] = "1"
        port = free_port()
        began = time.monotonic()
        up = subprocess.Popen(
            ["make", "up"], cwd=checkout, env={**env, "GPUWARDEN_PORT": str(port)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        took = seconds_until(
            lambda: httpx.get(f"http://127.0.0.1:{port}/").status_code == 200, up, began
        )
        print(f"make up -> console answers: {took:.1f} s (load {os.getloadavg()[0]:.2f})")
        os.killpg(up.pid, signal.SIGINT)
        up.wait(60)

        log = checkout / "gpuwarden-data" / "notifications.log"
        names = [p.name for p in default_policies(channels=["x"]) if p.metric != SILENT_SECONDS]
        began = time.monotonic()
        demo = subprocess.Popen(
            [".venv/bin/gpuwarden", "demo", "--port", str(free_port())], cwd=checkout, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            took = seconds_until(
                lambda: all(f"[FIRING] {n} on " in log.read_text() for n in names), demo, began
            )
            print(f"demo -> all {len(names)} default alerts logged: {took:.1f} s "
                  f"(load {os.getloadavg()[0]:.2f})")  # fmt: skip
        finally:
            demo.send_signal(signal.SIGINT)
            demo.wait(60)


if __name__ == "__main__":
    main()
