"""The test suite's own rules: no module imports a test module (what tests share lives in
support modules), the fast loop leaves the schema fuzz out and `make test` runs it."""

from __future__ import annotations

import ast
import re
import shlex
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"


def imported_modules(source: str, package: str) -> set[str]:
    """Every module ``source`` (a module of ``package``) imports, relative ones resolved."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0]
                base = f"{parent}.{base}" if base else parent
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
    return out


def package_of(path: Path) -> str:
    """The package a file of the repository belongs to (``tests.unit``)."""
    return ".".join(path.relative_to(REPO).parent.parts)


def is_test_module(module: str) -> bool:
    """A module pytest collects tests from (``test_*``), as opposed to a support module
    (``*_support``, ``conftest``, ``fake_*``, ``oracles``, ``cost_data``, ...)."""
    return module.startswith("tests.") and module.rsplit(".", 1)[-1].startswith("test_")


def test_no_module_imports_a_test_module() -> None:
    """A test module imported by another runs its fixtures and its module set-up twice and
    couples two files' tests: what tests share belongs in a support module."""
    found = {
        f"{path.relative_to(REPO)} imports {module}"
        for path in sorted(TESTS.rglob("*.py"))
        for module in imported_modules(path.read_text(), package_of(path))
        if is_test_module(module)
    }
    assert not found, "move what they share into a *_support.py module: " + "; ".join(sorted(found))


def test_the_rule_sees_every_spelling_of_such_an_import() -> None:
    for code in (
        "from tests.unit.test_x import a",
        "from tests.unit import test_x",
        "import tests.unit.test_x",
        "from .test_x import a",
        "from ..unit.test_x import a",
    ):
        assert any(map(is_test_module, imported_modules(code, "tests.unit"))), code
    allowed = "from tests.unit.attribution_support import make_proc\nimport tests.conftest"
    assert not any(map(is_test_module, imported_modules(allowed, "tests.unit")))


def test_a_plain_run_leaves_the_fuzz_out_and_make_test_runs_it() -> None:
    pytest_ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]
    addopts = shlex.split(pytest_ini["ini_options"]["addopts"])
    plain = addopts[addopts.index("-m") + 1]
    assert "not fuzz" in plain and "not gpu" in plain
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.M)
    assert recipe is not None
    pytest_line = next(line for line in recipe.group(1).splitlines() if "pytest" in line)
    words = shlex.split(pytest_line.strip())
    assert "-m" in words and "fuzz" not in words[words.index("-m") + 1]
    fuzz = (TESTS / "integration" / "test_api_schema_fuzz.py").read_text()
    assert "pytestmark = pytest.mark.fuzz" in fuzz
