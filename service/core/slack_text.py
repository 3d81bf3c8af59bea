"""Slack's limits on a message (characters, blocks) and the escaping its mrkdwn needs, for
alerts and reports alike."""

from __future__ import annotations

# Block Kit's limits, in characters (BLOCKS_MAX and FIELDS_MAX are counts).
HEADER_MAX = 150
SECTION_MAX = 3000
FIELD_MAX = 2000
FIELDS_MAX = 10
TEXT_MAX = 3000
BLOCKS_MAX = 50


def cut(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, an ellipsis marking the cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def escape(text: str) -> str:
    """``text`` safe inside Slack mrkdwn: ``&``, ``<`` and ``>`` as the entities Slack expects.

    Unescaped, ``<!channel>`` in a description, a label or a job id pings the whole channel and
    a stray ``<`` turns the text up to the next ``>`` into a link.
    """
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def cut_escaped(text: str, limit: int) -> str:
    """Escape ``text``, then cut it to ``limit`` characters without splitting an entity."""
    out = escape(text)
    if len(out) <= limit:
        return out
    cut_text = out[: limit - 1]
    amp = cut_text.rfind("&")
    if amp != -1 and ";" not in cut_text[amp:]:
        cut_text = cut_text[:amp]
    return cut_text + "…"
