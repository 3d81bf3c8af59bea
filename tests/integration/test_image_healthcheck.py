"""The image's HEALTHCHECK, read from deploy/docker/Dockerfile and run as Docker would (its exec
form, the image's ENV, the script where COPY puts it mapped back to the repository), against a
real central service and a real agent: each reads healthy while it works, an agent too (its
/healthz port, not the central's), and unhealthy once nothing answers or the server hangs."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.process_support import start_agent, stop, wait_until
from tests.support import free_port, live_server

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"


def final_stage() -> str:
    """The Dockerfile's last stage, continuation lines joined."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    return text.split("\nFROM ")[-1]


def image_env() -> dict[str, str]:
    """The final stage's ENV, as the container sees it."""
    env: dict[str, str] = {}
    for line in re.findall(r"^ENV (.+)$", final_stage(), flags=re.M):
        env |= dict(word.split("=", 1) for word in shlex.split(line))
    return env


def healthcheck() -> tuple[list[str], str]:
    """The HEALTHCHECK's command (exec form, image paths mapped to the repository's files) and
    its options."""
    stage = final_stage()
    (options, argv_json), *more = re.findall(r"^HEALTHCHECK (.*?)CMD (.+)$", stage, flags=re.M)
    assert not more
    argv: list[str] = json.loads(argv_json)  # exec form: no shell, exit status as is
    copies = {dest: src for src, dest in re.findall(r"^COPY (?!--)(\S+) (\S+)$", stage, flags=re.M)}
    assert argv[0] == "python" and argv[1] in copies, argv
    return [sys.executable, str(REPO / copies[argv[1]]), *argv[2:]], options


def check(**ports: int) -> tuple[int, str]:
    """Run the HEALTHCHECK in the image's environment with ``ports`` (variable: port) set."""
    argv, options = healthcheck()
    timeout = float(re.search(r"--timeout=(\d+)s", options).group(1))  # type: ignore[union-attr]
    env = {"PATH": os.environ["PATH"]} | image_env() | {k: str(v) for k, v in ports.items()}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


def test_the_image_serves_the_agent_s_health_port_and_checks_both_roles() -> None:
    env = image_env()
    assert (env["GPUWARDEN_PORT"], env["GPUWARDEN_AGENT_METRICS_PORT"]) == ("8000", "9105")
    assert re.search(r"^EXPOSE 8000 9105$", final_stage(), flags=re.M)
    ignore = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text()
    assert "!deploy/docker/healthcheck.py" in ignore.splitlines()


def test_the_central_service_reads_healthy_while_it_serves(app) -> None:
    port = free_port()
    with live_server(app, port=port):
        assert check(GPUWARDEN_PORT=port, GPUWARDEN_AGENT_METRICS_PORT=free_port()) == (
            0,
            f"http://127.0.0.1:{port}/healthz answered 200\n",
        )
    code, said = check(GPUWARDEN_PORT=port, GPUWARDEN_AGENT_METRICS_PORT=free_port())
    assert code == 1 and "nothing listens" in said


def test_an_agent_reads_healthy_while_it_cycles_and_unhealthy_once_it_hangs(
    tmp_path: Path,
) -> None:
    central, metrics = free_port(), free_port()  # no central: the agent spools and cycles on
    agent = start_agent(
        central_url=f"http://127.0.0.1:{central}", token="gw_agent_test", state=tmp_path,
        metrics_port=metrics,
        args=["--backend", "simulated", "--node-name", "node-a", "--interval-seconds", "0.2"],
    )  # fmt: skip
    try:

        def up() -> bool:
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-2000:]
            try:
                return httpx.get(f"http://127.0.0.1:{metrics}/healthz", timeout=1).is_success
            except httpx.HTTPError:
                return False

        wait_until("the agent's /healthz", up)
        # The image's check as it was (the central's port only) read every agent unhealthy.
        code, said = check(GPUWARDEN_PORT=central, GPUWARDEN_AGENT_METRICS_PORT=metrics)
        assert (code, said) == (0, f"http://127.0.0.1:{metrics}/healthz answered 200\n")
        agent.send_signal(signal.SIGSTOP)  # wedged: it accepts connections, answers nothing
        code, said = check(GPUWARDEN_PORT=central, GPUWARDEN_AGENT_METRICS_PORT=metrics)
        assert code == 1 and "answered nothing" in said
    finally:
        agent.send_signal(signal.SIGCONT)
        stop(agent)
