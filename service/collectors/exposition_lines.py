"""A reader of the Prometheus text lines exporters write, for the agent's dcgm-exporter backend.

It gives each sample's name, label set and value as prometheus_client's text parser does (with
the backend's naming: a counter declared ``x_total`` names its samples ``x``), several times
faster: it reads only the plain form (``name{label="value",...} value [timestamp]`` and the
``# HELP`` / ``# TYPE`` comments) and parses each distinct label set once (a GPU repeats its own
on every field). A line outside that form makes it answer None, and the caller then reads the
whole text with prometheus_client's parser, so what either accepts is read alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
# One label: a legacy name (not one of the reserved ``__`` names), a quoted value, then a
# comma and spaces before the next (NVIDIA's README writes ``gpu="0", UUID=...``) or the end.
_PAIR = re.compile(r'(?!__)([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:, *(?!\Z)|\Z)', re.S)
_ESCAPE = re.compile(r'\\[\\n"]')
_ESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
# The suffixes a family's samples may carry, by the family's type (the parser's rule).
_ALLOWED = {"summary": ("_count", "_sum", ""), "histogram": ("_count", "_sum", "_bucket")}
_TYPES = frozenset(("counter", "gauge", "summary", "histogram", "gaugehistogram", "unknown",
                    "info", "stateset", "untyped"))  # fmt: skip
# An integer this long may not fit a double, which the parser refuses in its own way.
_LONGEST_VALUE = 300


class Unreadable(Exception):
    """A line outside the plain form: the caller reads the text with the full parser."""


@dataclass
class Lines:
    """The samples of one exposition: (name, label-set key, value) in order, and the labels
    of each distinct key (the text between the braces)."""

    samples: list[tuple[str, str, float]] = field(default_factory=list)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)


def _plain(text: str) -> bool:
    """ASCII, and no white space but spaces and tabs (where the two splitters agree)."""
    return text.isascii() and text.replace("\t", " ").isprintable()


def _unescape(match: re.Match[str]) -> str:
    return _ESCAPED[match.group(0)]


def _labels(body: str) -> dict[str, str]:
    """The labels between one sample's braces; raises Unreadable outside the plain form."""
    out: dict[str, str] = {}
    at = 0
    while at < len(body):
        m = _PAIR.match(body, at)
        if m is None or m.group(1) in out:  # a duplicate name: the parser refuses the line
            raise Unreadable(body)
        value = m.group(2)
        out[m.group(1)] = _ESCAPE.sub(_unescape, value) if "\\" in value else value
        at = m.end()
    return out


def _number(text: str) -> float:
    """A value or timestamp as the parser reads it (int, else float), as a double."""
    if "_" in text or not text.isascii() or len(text) > _LONGEST_VALUE:
        raise Unreadable(text)
    try:
        return float(text)  # equal to float(int(text)) for every integer text this short
    except ValueError:
        raise Unreadable(text) from None


class _Families:
    """The parser's family state: which sample names the current ``# TYPE`` or ``# HELP``
    family takes, and whether it is a counter declared with ``_total``."""

    def __init__(self) -> None:
        self.name = ""
        self.type = "untyped"
        self.allowed: tuple[str, ...] = ()

    def comment(self, line: str) -> None:
        """Take a ``#`` line: HELP and TYPE open or retype a family, others are ignored."""
        parts = line.split(None, 3)
        if len(parts) < 2:
            return
        if parts[1] not in ("TYPE", "HELP"):
            # Ignored, if the parser's second word is no TYPE or HELP either: it starts where
            # this one does (no quote before it: the parser keeps a quoted text whole) and
            # the white space up to here is ASCII's, which the two splitters agree on.
            at = line.index(parts[1])
            if '"' in line[:at] or not _plain(line[: at + len(parts[1])]):
                raise Unreadable(line)
            return
        if len(parts) < 3 or '"' in line or "\\" in line or not _plain(line):
            raise Unreadable(line)  # quoted names and escapes: the full parser's work
        name = parts[2]
        if _NAME.match(name) is None:
            raise Unreadable(line)
        if parts[1] == "HELP":
            if name != self.name:
                self.name, self.type, self.allowed = name, "untyped", (name,)
            return
        # The parser refuses a family of another type, or a counter named ``_total`` alone.
        if len(parts) < 4 or parts[3] not in _TYPES or name == "_total":
            raise Unreadable(line)
        self.name = name
        self.type = parts[3]
        self.allowed = tuple(name + s for s in _ALLOWED.get(self.type, ("",)))

    def sample_name(self, name: str) -> str:
        """The name the backend gives a sample written ``name``, as the parser's family says."""
        if name not in self.allowed:  # outside the family: a family of its own, untyped
            self.name, self.type, self.allowed = "", "untyped", ()
            return name
        if self.type == "counter" and name == self.name and name.endswith("_total"):
            return name[:-6]
        return name


def read_lines(text: str) -> Lines | None:
    """Every sample of ``text`` (name upper-cased where a pipeline lower-cased ``dcgm_fi_``),
    or None where a line is outside the plain form."""
    out = Lines()
    labels = out.labels
    samples = out.samples
    families = _Families()
    names: dict[str, str] = {}  # a written name -> checked
    try:
        for raw in text.split("\n"):
            line = raw.strip()
            if not line:
                continue
            if line[0] == "#":
                families.comment(line)
                continue
            brace = line.find("{")
            if brace >= 0:
                end = line.rfind("}")
                written, body, rest = line[:brace], line[brace + 1 : end], line[end + 1 :]
                if end < brace:
                    raise Unreadable(line)
                if body not in labels:
                    labels[body] = _labels(body)
            else:
                written, _, rest = line.partition(" ")
                rest = " " + rest
                body = ""
                labels.setdefault("", {})
            if written not in names:
                if _NAME.match(written) is None:
                    raise Unreadable(line)
                names[written] = written
            parts = rest.split(" ")
            if parts[0] or len(parts) < 2:  # the value follows a space
                raise Unreadable(line)
            tokens = [p for p in parts if p]
            if not 1 <= len(tokens) <= 2 or "\t" in rest:
                raise Unreadable(line)
            value = _number(tokens[0])
            if len(tokens) == 2:
                _number(tokens[1])  # a timestamp: read, then not used
            name = families.sample_name(written)
            if name.startswith("dcgm_fi_"):
                name = name.upper()
            samples.append((name, body, value))
    except Unreadable:
        return None
    return out
