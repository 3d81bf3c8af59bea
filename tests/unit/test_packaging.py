"""`make up` stays short: the runtime only, its steps said, no setuptools deprecation box, pip's
chatter kept in a log; the test targets add the dev extra."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_license_is_an_spdx_string_and_setuptools_understands_it() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # A TOML table here makes setuptools >= 77 print its deprecation box on every install.
    assert config["project"]["license"] == "Apache-2.0"
    (req,) = [r for r in config["build-system"]["requires"] if r.startswith("setuptools")]
    assert int(re.search(r">=(\d+)", req).group(1)) >= 77  # type: ignore[union-attr]


def make_n(target: str, folder: Path) -> str:
    """What ``make TARGET`` would run in a fresh checkout (``make -n``: nothing is run)."""
    shutil.copy(ROOT / "Makefile", folder / "Makefile")
    shutil.copy(ROOT / "pyproject.toml", folder / "pyproject.toml")
    # Under a parent make (`make test`) a child prints "Entering directory" lines unless told not.
    r = subprocess.run(["make", "--no-print-directory", "-n", target], cwd=folder,
                       capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return r.stdout


def test_make_up_installs_the_runtime_only_and_says_what_it_does(tmp_path: Path) -> None:
    up = make_n("up", tmp_path)
    assert "uv pip install --python .venv/bin/python -e ." in up
    assert "[dev]" not in up  # the test tool chain is the test targets' business
    steps = re.findall(r'echo "\[(\d)/3\] ([^"]+)"', up)
    assert [n for n, _ in steps] == ["1", "2", "3"] and "runtime" in steps[2][1]
    assert up.rstrip().endswith(".venv/bin/gpuwarden up")
    # pip's own output (uv's bootstrap, the fallback) goes to the log, shown only on failure
    assert all("install.log" in ln for ln in up.splitlines() if "pip install -q" in ln)


def test_the_test_targets_add_the_dev_extra(tmp_path: Path) -> None:
    for target in ("lint", "unit", "test"):
        assert "-e '.[dev]'" in make_n(target, tmp_path), target


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
