"""A job's verdict in one short line for Slurm's ``AdminComment``, where ``sacct`` and site tools
show it: cost, GPU-hours, waste, top cause, its fix and a link to the job's page.

Pure: figures in, text out. The text is printable lower-case ASCII without ``|`` (sacct's
``--parsable`` separator), quotes or backslashes, so it survives every tool between central and
a site's report unchanged: sacctmgr (the only way to set a finished job's AdminComment on Slurm
22.05) turns quotes into backticks and every letter to lower case (seen on 22.05.8), so the line
is lower case from the start and sacct shows what central said. A percent-escape in the link
means the same in lower case (RFC 3986).
"""

from __future__ import annotations

import re
import unicodedata

MAX_CHARS = 250
PREFIX = "gpuwarden:"
# What may not stand in the text, and what stands in its place.
_REPLACE = str.maketrans(
    {"|": "/", "\\": "/", '"': "", "'": "", "`": "",
     # The fixes' own symbols that have no ASCII decomposition.
     "\u00d7": "x", "\u2192": "->", "\u2026": "...", "\u2013": "-", "\u2014": "-",
     "\u2264": "<=", "\u2265": ">=", "\u2248": "~"}
)  # fmt: skip
_NOT_PRINTABLE = re.compile(r"[^\x20-\x7e]+")


def ascii_text(text: str) -> str:
    """``text`` as printable ASCII without ``|``, quotes or backslashes, spaces collapsed."""
    plain = unicodedata.normalize("NFKD", text.translate(_REPLACE))
    plain = _NOT_PRINTABLE.sub(" ", plain.encode("ascii", "ignore").decode("ascii"))
    return " ".join(plain.split())


def _usd(value: float | None) -> str:
    return "unpriced" if value is None else f"${value:,.2f}"


def verdict_line(
    *,
    cost_usd: float | None,
    held_seconds: float,
    waste_usd: float | None,
    top_cause: str | None,
    fix: str | None,
    link: str,
) -> str:
    """The verdict line in lower case (at most ``MAX_CHARS`` where the link allows): the fix
    is cut first, then dropped; the figures and the link are never cut."""
    parts = [f"{PREFIX} {_usd(cost_usd)} on {held_seconds / 3600:.1f} GPU-h"]
    if waste_usd is not None:
        share = f" ({waste_usd / cost_usd:.0%})" if cost_usd else ""
        parts.append(f", waste {_usd(waste_usd)}{share}")
    if top_cause:
        parts.append(f", top {ascii_text(top_cause)}")
    head = "".join(parts)
    tail = f"; {ascii_text(link)}"
    fix_text = ascii_text(fix or "")
    room = MAX_CHARS - len(head) - len(tail) - len("; fix: ")
    if fix_text and room >= 12:  # a fix cut shorter than this says nothing
        if len(fix_text) > room:
            fix_text = fix_text[: room - 3].rstrip() + "..."
        return f"{head}; fix: {fix_text}{tail}".lower()
    return (head + tail).lower()
