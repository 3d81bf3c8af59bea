"""Slack's limits on a message (characters, blocks) and the escaping its mrkdwn needs, for
alerts and reports alike."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from typing import Any

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


# --- Block Kit's blocks, as every Slack message here builds them ------------------------------
# Each takes text already escaped and cut to its limit (a caller may cut it its own way).
Block = dict[str, Any]


def header_block(text: str) -> Block:
    """A header block of plain ``text``."""
    return {"type": "header", "text": {"type": "plain_text", "text": text}}


def section_block(mrkdwn: str) -> Block:
    """A section block of ``mrkdwn`` text."""
    return {"type": "section", "text": _mrkdwn(mrkdwn)}


def fields_block(fields: Iterable[str]) -> Block:
    """A section block of ``fields`` (mrkdwn), the first FIELDS_MAX of them."""
    return {"type": "section", "fields": [_mrkdwn(f) for f in islice(fields, FIELDS_MAX)]}


def context_block(mrkdwn: str) -> Block:
    """A context block of one ``mrkdwn`` element."""
    return {"type": "context", "elements": [_mrkdwn(mrkdwn)]}


def message_blocks(
    header: str, body: str, fields: Iterable[str], context: str | None = None
) -> list[Block]:
    """A notice's blocks: ``header`` (cut), ``body`` (escaped and cut), up to FIELDS_MAX
    ``fields`` and, when there is one, a ``context`` line (links)."""
    blocks = [
        header_block(cut(header, HEADER_MAX)),
        section_block(cut_escaped(body, SECTION_MAX)),
        fields_block(fields),
    ]
    if context:
        blocks.append(context_block(context))
    return blocks


def field_text(title: str, body: str) -> str:
    """A field's mrkdwn: ``title`` in bold over ``body``, escaped and cut to FIELD_MAX."""
    return cut_escaped(f"*{title}*\n{body}", FIELD_MAX)


def _mrkdwn(text: str) -> Block:
    return {"type": "mrkdwn", "text": text}
