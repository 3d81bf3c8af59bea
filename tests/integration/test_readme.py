"""The README's first ten minutes, run as pasted: make up, the glance, the token block, the curl
examples, the demo and its look (report, gpus, job, the notification log).

The commands are read from README.md itself (the code blocks marked ``<!-- first-ten: NAME -->``)
and ``make up``'s command from the Makefile, so the README cannot drift from what works. The only
change made to them is the port: each service gets a free one instead of 8000.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]


def readme_blocks(name: str) -> list[str]:
    """The shell code blocks of README.md marked ``<!-- first-ten: name -->``."""
    text = (ROOT / "README.md").read_text()
    found = re.findall(rf"<!-- first-ten: {name} -->\n```sh\n(.*?)```", text, re.S)
    assert found, f"README.md has no block marked first-ten: {name}"
    return found


def make_up_command() -> list[str]:
    """The command ``make up`` runs, from the Makefile's recipe."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^up:.*\n\t(.+)$", makefile, re.M)
    assert recipe is not None
    return shlex.split(recipe.group(1).lstrip("@").replace("$(BIN)", ".venv/bin"))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A clean clone: the checkout's files as git lists them (tracked and new, not ignored),
    without its .venv, so ``make up`` installs from nothing as on a new machine."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True, timeout=60,
    ).stdout.decode()  # fmt: skip
    checkout = tmp_path / "checkout"
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, checkout / name)
    return checkout


@pytest.fixture
def env() -> dict[str, str]:
    """The environment of a new user's shell: no GPUWARDEN_ settings, no state directory, no
    virtualenv of ours."""
    out = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GPUWARDEN_")
        and k not in ("STATE_DIRECTORY", "XDG_STATE_HOME", "VIRTUAL_ENV", "PYTHONPATH")
    }
    out["COLUMNS"] = "80"
    return out


def sh(folder: Path, env: dict[str, str], script: str, port: int) -> str:
    """Run README lines in bash (failing on the first error); stdout and stderr together."""
    script = script.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    r = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"README lines failed:\n{script}\n--- output:\n{out}"
    return out


def wait_for(what: str, check, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, ValueError, httpx.HTTPError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def background(folder: Path, env: dict[str, str]) -> Iterator[list[subprocess.Popen[str]]]:
    """Processes started in the background; stopped (Ctrl-C) at the end."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGINT) if leads_group(p) else p.send_signal(signal.SIGINT)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL) if leads_group(p) else p.kill()
            p.wait(10)


def leads_group(p: subprocess.Popen[str]) -> bool:
    try:
        return os.getpgid(p.pid) == p.pid
    except ProcessLookupError:
        return False


def start(
    folder: Path, env: dict[str, str], procs: list[subprocess.Popen[str]], cmd: list[str], port: int
) -> subprocess.Popen[str]:
    with (folder / f"{cmd[1]}-{port}.log").open("w") as log:
        p = subprocess.Popen(
            [*cmd, "--port", str(port)], cwd=folder, env=env, stdout=log,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    procs.append(p)

    def ready() -> bool:
        assert p.poll() is None, (folder / f"{cmd[1]}-{port}.log").read_text()
        run = json.loads((folder / "gpuwarden-data" / "running.json").read_text())
        return bool(run["pid"] == p.pid) and httpx.get(f"{run['url']}/healthz").status_code == 200

    wait_for(f"{cmd} to serve", ready)
    return p


def stop(p: subprocess.Popen[str], folder: Path) -> None:
    p.send_signal(signal.SIGINT)  # Ctrl-C
    assert p.wait(30) in (0, 130)
    assert not (folder / "gpuwarden-data" / "running.json").exists()


def make_up(
    folder: Path, env: dict[str, str], procs: list[subprocess.Popen[str]], port: int
) -> subprocess.Popen[str]:
    """``make up`` as typed, in its own process group (as a terminal runs it, for Ctrl-C)."""
    with (folder / f"up-{port}.log").open("w") as log:
        p = subprocess.Popen(
            ["make", "up"], cwd=folder, env={**env, "GPUWARDEN_PORT": str(port)}, stdout=log,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
    procs.append(p)
    return p


def ctrl_c(p: subprocess.Popen[str], folder: Path) -> None:
    """Ctrl-C as a terminal sends it: SIGINT to the whole foreground process group."""
    os.killpg(p.pid, signal.SIGINT)
    # make dies of the signal itself (as in a terminal); gpuwarden exits 0 or 130
    assert p.wait(60) in (0, 130, -signal.SIGINT)
    assert not (folder / "gpuwarden-data" / "running.json").exists()


def test_the_first_ten_minutes_as_pasted(folder: Path, env, background, capsys) -> None:
    up_port = free_port()
    began = time.monotonic()
    up = make_up(folder, env, background, up_port)

    def console_answers() -> bool:
        assert up.poll() is None, (folder / f"up-{up_port}.log").read_text()
        return httpx.get(f"http://127.0.0.1:{up_port}/").status_code == 200

    # Generous: this catches a hang, not a slow registry (bench and docs/benchmarks.md time it).
    wait_for("make up to serve the console", console_answers, timeout=900)
    took = time.monotonic() - began
    with capsys.disabled():
        print(f"\nmake up from a clean clone: console reachable after {took:.1f} s")
    installing = (folder / f"up-{up_port}.log").read_text()
    assert "[3/3] installing GPU Warden and its runtime dependencies" in installing
    assert not list((folder / ".venv").glob("lib/python*/site-packages/pytest")), "dev extra"
    banner = (folder / f"up-{up_port}.log").read_text()
    assert "reader token: gw_" in banner and "notifications.log" in banner

    # a second `up` on the same port fails, before any banner or token (60 s: a hang)
    again = subprocess.run(
        [*make_up_command(), "--port", str(up_port)],
        cwd=folder, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert again.returncode == 1
    assert "reader token" not in again.stdout and f"127.0.0.1:{up_port}" in again.stderr

    glance = sh(folder, env, "\n".join(readme_blocks("glance")), up_port)
    assert "GPUs at" in glance and "GPU cost by job" in glance

    (tokens,) = readme_blocks("tokens")
    curl = "\n".join(readme_blocks("curl"))
    out = sh(folder, env, tokens + curl + "\nCOLUMNS=200 .venv/bin/gpuwarden token list\n", up_port)
    assert "of the running gpuwarden up" in out  # the token commands found up's database
    assert re.search(r"revoked token id=\d+ \(reader\)", out)
    assert '"samples_received":1' in out  # the agent token works against the running service
    assert '"uuid":"GPU-0b9c6a3e"' in out  # and the reader token
    assert '"resolution":"raw"' in out  # the series with start=-10m and step=10s
    assert '"type":"less_than_equal"' in out and '"sm_active"' in out
    assert "missing or invalid bearer token" not in out
    listing = out[out.rindex("┏") :]
    assert listing.count("gpuwarden up: local") == 2  # up's own two, not two more per start
    ctrl_c(up, folder)
    said = (folder / f"up-{up_port}.log").read_text()
    assert f"gpuwarden up stopped: the central service at http://127.0.0.1:{up_port}" in said
    assert "data kept in ./gpuwarden-data: the database ./gpuwarden-data/gpuwarden.db" in said
    after = subprocess.run(
        [".venv/bin/gpuwarden", "gpus"], cwd=folder, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert after.returncode == 1 and "nothing is running in ./gpuwarden-data" in after.stderr

    demo_port = free_port()
    (demo_block,) = readme_blocks("demo")
    demo = start(folder, env, background, shlex.split(demo_block.split("#")[0]), demo_port)
    log = folder / "gpuwarden-data" / "notifications.log"

    def demo_ready() -> bool:
        report = sh(folder, env, ".venv/bin/gpuwarden report cost --since 1h --csv", demo_port)
        # The replayed alerts reach the log one delivery at a time: wait for the one asserted.
        return "slurm:" in report and "[FIRING] gpu-hardware-fault" in log.read_text()

    wait_for("the demo's jobs and its hardware-fault alert", demo_ready, timeout=150)
    look = sh(folder, env, "\n".join(readme_blocks("demo-look")), demo_port)
    assert "idle-held" in look  # gpus --state idle-held
    assert "GPU cost by team" in look
    assert "Time and dollars by cause (cost, waste):" in look and "Recommendations" in look
    assert "[FIRING] gpu-hardware-fault" in look  # the default policies, no setup
    first_log = (folder / f"demo-{demo_port}.log").read_text()
    assert "demo: a new history in sqlite:///" in first_log

    # A window closed before the restart, the XID (45 min into the hour) and the loss inside it.
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=2)
    window = f"--start {(end - timedelta(minutes=45)).isoformat()} --end {end.isoformat()}"
    closed = f".venv/bin/gpuwarden report cost {window} --group-by job --csv"

    def csv_rows() -> list[str]:
        out = sh(folder, env, closed, demo_port)
        return [line for line in out.splitlines() if line.startswith(("slurm:", "__unallocated"))]

    before = csv_rows()
    assert any("XID 79" in row for row in before) and len(before) > 5

    stop(demo, folder)
    said = (folder / f"demo-{demo_port}.log").read_text()
    assert "gpuwarden demo stopped" in said and "3 agents (demo-node-0, demo-node-1" in said
    assert "data kept in ./gpuwarden-data: the database ./gpuwarden-data/demo.db" in said

    # Started again, the demo resumes its history: the closed window reads the same (issue 50).
    demo = start(folder, env, background, shlex.split(demo_block.split("#")[0]), demo_port)
    restarted = (folder / f"demo-{demo_port}.log").read_text()
    assert "demo: resuming the history in sqlite:///" in restarted, restarted
    assert "nothing recorded is written again" in restarted
    wait_for("the restarted demo's jobs", demo_ready, timeout=150)
    assert csv_rows() == before
    stop(demo, folder)
