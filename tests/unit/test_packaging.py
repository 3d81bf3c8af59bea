"""`make up` stays short: no setuptools deprecation box, pip's chatter kept in a log."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_license_is_an_spdx_string_and_setuptools_understands_it() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # A TOML table here makes setuptools >= 77 print its deprecation box on every install.
    assert config["project"]["license"] == "Apache-2.0"
    (req,) = [r for r in config["build-system"]["requires"] if r.startswith("setuptools")]
    assert int(re.search(r">=(\d+)", req).group(1)) >= 77  # type: ignore[union-attr]


def test_make_up_keeps_pip_output_in_a_log() -> None:
    makefile = (ROOT / "Makefile").read_text()
    installs = [ln for ln in makefile.splitlines() if "pip install" in ln]
    assert installs and all("install.log" in ln for ln in installs)
    up = makefile.split("\nup:", 1)[1].split("\n\n", 1)[0]
    assert "@$(BIN)/gpuwarden up" in up
