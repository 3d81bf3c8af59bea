"""The agent's own reader of dcgm-exporter's text against prometheus_client's parser: the same
samples and the same readings on every real capture, on the corners of the text format, and
on captures with characters put where they do not belong (where the reader steps aside)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from service.collectors.dcgm_exporter import (
    _sample_name,
    parse_exposition,
    parse_with_prometheus_client,
)
from service.collectors.exposition_lines import read_lines
from service.collectors.mig import MigIdentities

DATA = Path(__file__).resolve().parents[1] / "data" / "dcgm-exporter"
CAPTURES = sorted(DATA.glob("*.prom"))
CREATED = datetime(2026, 12, 1, tzinfo=UTC)  # a MIG instance's first sight, in its identity
LABELS = 'gpu="0",UUID="GPU-0a",modelName="NVIDIA H100 80GB HBM3",Hostname="n1"'


def parser_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample as the backend took them from the parser."""
    return [
        (_sample_name(f.name, s.name), s.labels, float(s.value))
        for f in text_string_to_metric_families(text)
        for s in f.samples
    ]


def reader_samples(text: str) -> list[tuple[str, dict[str, str], float]] | None:
    lines = read_lines(text)
    if lines is None:
        return None
    return [(name, lines.labels[key], value) for name, key, value in lines.samples]


def outcome(parse: object, text: str) -> str:
    """The exposition's repr (NaN equal to NaN), or the error the parse raised."""
    try:
        return repr(parse(text, MigIdentities(clock=lambda: CREATED)))  # type: ignore[operator]
    except Exception as exc:
        return f"raised {type(exc).__name__}"


def same_as_the_parser(text: str) -> None:
    assert outcome(parse_exposition, text) == outcome(parse_with_prometheus_client, text)


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_every_capture_is_read_by_the_reader_and_equals_the_parser(path: Path) -> None:
    text = path.read_text()
    got = reader_samples(text)
    assert got is not None  # the fast path reads every real exporter's text
    assert repr(got) == repr(parser_samples(text))
    same_as_the_parser(text)


READ = {
    "escaped label values": (
        f'DCGM_FI_DEV_GPU_UTIL{{{LABELS},pod="a\\"b\\\\c\\nd\\te",namespace="x,y}}z"}} 57\n'
    ),
    "comments": (
        "# a comment\n#\n# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}}} 57\n# trailing comment\n"
    ),
    "NaN and infinities": (
        f"DCGM_FI_DEV_POWER_USAGE{{{LABELS}}} NaN\nDCGM_FI_DEV_GPU_TEMP{{{LABELS}}} +Inf\n"
        f"DCGM_FI_DEV_SM_CLOCK{{{LABELS}}} -Inf\nDCGM_FI_DEV_GPU_UTIL{{{LABELS}}} nan\n"
    ),
    "timestamps": (
        f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}}} 57 1700000000000\n"
        f"DCGM_FI_DEV_GPU_TEMP{{{LABELS}}} 41.5 -12\n"
    ),
    "sentinels and exponents": (
        f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}}} 9223372036854775794\n"
        f"DCGM_FI_DEV_POWER_USAGE{{{LABELS}}} 3.2e2\nDCGM_FI_DEV_GPU_TEMP{{{LABELS}}} .5\n"
    ),
    "counters declared with and without _total": (
        "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"
        f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{LABELS}}} 123456\n"
        "# TYPE DCGM_FI_DEV_XID_ERRORS_total counter\n"
        f"DCGM_FI_DEV_XID_ERRORS_total{{{LABELS}}} 43\n"
        f"DCGM_FI_DEV_XID_ERRORS{{{LABELS}}} 13\n"
        f"DCGM_FI_DEV_XID_ERRORS_total{{{LABELS}}} 31\n"
    ),
    "summaries, histograms, a HELP that opens a family": (
        "# TYPE x summary\nx_sum 1\nx_count 2\nx 3\n# TYPE h histogram\nh_bucket 1\n"
        "# HELP DCGM_FI_DEV_XID_ERRORS_total the last XID\n"
        f"DCGM_FI_DEV_XID_ERRORS_total{{{LABELS}}} 43\n"
    ),
    "lower-cased names, empty and missing labels": (
        f"dcgm_fi_dev_gpu_util{{{LABELS}}} 12\nDCGM_FI_DEV_GPU_TEMP{{}} 40\n"
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="1"}} 40\nno_labels 1\n'
        f'DCGM_FI_DEV_FB_USED{{{LABELS},pod="",namespace=""}} 1024\n'
    ),
    "spaces after commas (NVIDIA's README)": (
        'DCGM_FI_DEV_SM_CLOCK{gpu="0", UUID="GPU-0a",  modelName="T4"} 139\n'
    ),
    "CRLF line ends and blank lines": f"\r\n\nDCGM_FI_DEV_GPU_UTIL{{{LABELS}}} 57\r\n\n",
}

STEPPED_ASIDE = {
    "a label without quotes": f"DCGM_FI_DEV_GPU_UTIL{{{LABELS},pod=a}} 1\n",
    "a duplicate label": f'DCGM_FI_DEV_GPU_UTIL{{{LABELS},gpu="1"}} 1\n',
    "a trailing comma": f"DCGM_FI_DEV_GPU_UTIL{{{LABELS},}} 1\n",
    "a trailing comma and space": f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}, }} 1\n",
    "a type the parser refuses": "# TYPE DCGM_FI_DEV_GPU_UTIL gaeuge\n",
    "a quote in a comment's first word": '#"x TYPE" y\n',
    "spaces in the braces": 'DCGM_FI_DEV_GPU_UTIL{ gpu = "0", UUID="GPU-0a" } 1\n',
    "no value": f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}}}\n",
    "no space before the value": f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}}}1\n",
    "a value that is no number": f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}}} high\n",
    "an underscore in the value": f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}}} 1_000\n",
    "a bad timestamp": f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}}} 1 soon\n",
    "three fields": f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}}} 1 2 3\n",
    "tabs": f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}}}\t1\n",
    "a reserved label": f'DCGM_FI_DEV_GPU_UTIL{{{LABELS},__name__="x"}} 1\n',
    "an unclosed brace": f"DCGM_FI_DEV_GPU_UTIL{{{LABELS} 1\n",
    "a TYPE without a type": "# TYPE DCGM_FI_DEV_GPU_UTIL\n",
    "a TYPE of a bad name": "# TYPE 1bad gauge\n",
    "a quoted name": '# TYPE "DCGM.FI" gauge\n',
    "a name of the wrong characters": f"DCGM-FI{{{LABELS}}} 1\n",
    "an integer too long for a double": f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}}} {'9' * 400}\n",
    "a number in other digits": f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}}} \u0665\n",
}


@pytest.mark.parametrize("case", READ)
def test_the_reader_reads_the_corners_of_the_format_as_the_parser(case: str) -> None:
    text = READ[case]
    got = reader_samples(text)
    assert got is not None, case
    assert repr(got) == repr(parser_samples(text))
    same_as_the_parser(text)


@pytest.mark.parametrize("case", STEPPED_ASIDE)
def test_outside_the_plain_form_the_parser_reads_it(case: str) -> None:
    text = STEPPED_ASIDE[case]
    assert read_lines(text) is None, case
    same_as_the_parser(text)  # the parser's answer, or its refusal


def test_the_lines_labels_are_parsed_once_per_label_set() -> None:
    text = "".join(f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}}} {k}\n" for k in range(5))
    lines = read_lines(text)
    assert lines is not None and len(lines.samples) == 5 and len(lines.labels) == 1


NOISE = st.sampled_from(['"', "\\", "{", "}", ",", "=", " ", "\t", "#", "\n", "_", "e", "x", "1"])


@settings(max_examples=300, deadline=None)
@given(
    capture=st.sampled_from(CAPTURES),
    edits=st.lists(st.tuples(st.floats(0, 1), NOISE, st.booleans()), min_size=1, max_size=3),
)
def test_a_capture_with_characters_put_in_or_taken_out_reads_as_the_parser_reads_it(
    capture: Path, edits: list[tuple[float, str, bool]]
) -> None:
    text = capture.read_text()
    for where, char, insert in edits:
        at = int(where * (len(text) - 1))
        text = text[:at] + char + text[at:] if insert else text[:at] + text[at + 1 :]
    same_as_the_parser(text)
