"""The owner directory's lookup command (``getent passwd {user}``, an LDAP query), run once per
user with a timeout and read by a configured regular expression."""

from __future__ import annotations

import logging
import re
import shlex
import subprocess
from dataclasses import dataclass

from service.thresholds.owners import OWNER_NAME_PATTERN, OwnerEntry, parse_lookup_output

log = logging.getLogger(__name__)
OUTPUT_MAX_BYTES = 64 * 1024  # a passwd line or an LDAP entry; more is not read


@dataclass(frozen=True, slots=True)
class LookupAnswer:
    """What the command said of a user: an entry, or none with ``error`` when it failed."""

    entry: OwnerEntry | None
    error: str | None = None


def run_lookup(command: str, pattern: str, *, user: str, timeout_seconds: float) -> LookupAnswer:
    """Run ``command`` for ``user`` (``{user}`` replaced in each argument, no shell) and read
    its output by ``pattern``; a command that fails, times out or says nothing gives no entry."""
    if not re.match(OWNER_NAME_PATTERN, user):
        return LookupAnswer(None, f"user name {user!r} is not looked up")
    argv = [part.replace("{user}", user) for part in shlex.split(command)]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            timeout=timeout_seconds,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return LookupAnswer(None, f"the lookup command timed out after {timeout_seconds:g} s")
    except OSError as exc:
        return LookupAnswer(None, f"the lookup command could not run: {exc.strerror or exc}")
    if done.returncode != 0:
        # getent says 2 for "no such user": an answer, not a failure.
        error = None if done.returncode == 2 else f"the lookup command exited {done.returncode}"
        return LookupAnswer(None, error)
    text = done.stdout[:OUTPUT_MAX_BYTES].decode("utf-8", "replace")
    return LookupAnswer(parse_lookup_output(text, pattern, user=user))
