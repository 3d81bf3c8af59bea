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


def test_package_data_ships_every_console_and_docs_asset() -> None:
    # `pip install .` must carry the console and the vendored uPlot, Swagger UI and ReDoc: the
    # service serves them itself, with no CDN to fall back on.
    from fnmatch import fnmatch

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["service.api"]
    static = ROOT / "service" / "api" / "static"
    files = [p.relative_to(static.parent).as_posix() for p in static.rglob("*") if p.is_file()]
    assert len(files) >= 15
    for name in files:
        assert any(fnmatch(name, p) and name.count("/") == p.count("/") for p in patterns), name
