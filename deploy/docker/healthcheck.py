"""The image's HEALTHCHECK: exit 0 when the container's server answers /healthz with 200, else 1.

One image runs the central service (``gpuwarden serve`` on GPUWARDEN_PORT) or the agent
(``gpuwarden agent``, its /healthz on GPUWARDEN_AGENT_METRICS_PORT, which the image sets): the
first of those ports that something listens on decides, so either role reads healthy while it
works, and unhealthy once its server stops answering or answers 503 (an agent loop stalled).
Standard library only: it runs with the image's Python in a few milliseconds."""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

# (host variable, port variable, the server's default port): the central's, then the agent's.
SERVERS = (
    ("GPUWARDEN_HOST", "GPUWARDEN_PORT", "8000"),
    ("GPUWARDEN_AGENT_METRICS_HOST", "GPUWARDEN_AGENT_METRICS_PORT", ""),
)
TIMEOUT_SECONDS = 2.0  # under the HEALTHCHECK's --timeout


def reachable_host(bound: str) -> str:
    """Where a server bound to ``bound`` is reached from inside the container."""
    if bound in ("", "0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{bound}]" if ":" in bound else bound


def status(host: str, port: str) -> int | None:
    """The HTTP status /healthz answers on ``host:port``, 0 for no answer, None if none listens."""
    try:
        url = f"http://{host}:{port}/healthz"
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except urllib.error.URLError as exc:
        return None if isinstance(exc.reason, ConnectionRefusedError) else 0
    except OSError:  # a read that timed out: the server is wedged
        return 0


def main() -> int:
    """Probe the central's port, then the agent's; 0 for the first that answers 200."""
    for host_var, port_var, default in SERVERS:
        port = os.environ.get(port_var) or default
        if not port:
            continue
        host = reachable_host(os.environ.get(host_var, ""))
        code = status(host, port)
        if code is not None:
            print(f"http://{host}:{port}/healthz answered {code or 'nothing'}")
            return 0 if code == 200 else 1
    print("nothing listens on GPUWARDEN_PORT or GPUWARDEN_AGENT_METRICS_PORT")
    return 1


if __name__ == "__main__":
    sys.exit(main())
