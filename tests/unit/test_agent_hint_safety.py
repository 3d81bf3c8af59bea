"""The agent never ships a hint or label central would refuse for a control character (a 422
sets the whole batch aside): environment and job-map values with one are left out, node labels
with one stop the start."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.collectors.attribution import JobAttributor
from service.collectors.runner import parse_labels
from service.errors import ConfigError
from service.wire import IngestBatch


def test_a_job_map_line_with_a_control_character_is_left_out(tmp_path: Path) -> None:
    (tmp_path / "0").write_text("slurm:7\x1b[2J\n")
    (tmp_path / "1").write_text("\n  slurm:8  \r\n")  # surrounding whitespace is only trimmed
    attributor = JobAttributor(proc_root=tmp_path / "proc", job_map_dir=tmp_path)
    assert attributor.mapped_job(0) is None
    assert attributor.mapped_job(1) == "slurm:8"


def test_node_labels_with_a_control_character_stop_the_start() -> None:
    with pytest.raises(ConfigError, match=r"node_labels: .*control characters \(found U\+0007\)"):
        parse_labels("rack=r1\x07")
    labels = parse_labels("rack=r1,zone=a")
    batch = {"node": {"hostname": "gpu-7", "labels": labels}}
    assert IngestBatch.model_validate(batch).node.labels == labels  # what starts, central takes
