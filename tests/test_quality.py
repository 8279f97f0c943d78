"""The lint gate runs with the tests: ruff (check and format), mypy --strict, and the layering."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The comment that lets a function import a loadgen module: it names what it defers.
DEFERS = re.compile(r"#.*\bdefers\s+([A-Za-z_][\w.]*)")


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(
    shutil.which("ruff") is None and not (Path(sys.executable).parent / "ruff").exists(),
    reason="ruff not installed",
)
def test_ruff_check_and_format_are_clean() -> None:
    """`ruff check` and `ruff format --check` pass on the whole tree."""
    ruff = (
        str(Path(sys.executable).parent / "ruff")
        if (Path(sys.executable).parent / "ruff").exists()
        else "ruff"
    )
    check = run(ruff, "check", "loadgen", "tests", "benchmarks")
    assert check.returncode == 0, check.stdout + check.stderr
    fmt = run(ruff, "format", "--check", "loadgen", "tests", "benchmarks")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


@pytest.mark.slow
def test_mypy_strict_is_clean() -> None:
    """`mypy --strict` (configured in pyproject.toml) passes on loadgen/."""
    result = run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_stage_packages_import_only_downward() -> None:
    """import-linter's contracts in pyproject.toml hold: the stages are layers, the simulator
    imports nothing of the client, nothing of the tool imports test support."""
    result = run(str(Path(sys.executable).parent / "lint-imports"), "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert f"Contracts: {len(contracts['contracts'])} kept, 0 broken." in result.stdout


def imports_in_functions(source: str) -> list[tuple[int, str]]:
    """(line number, line) of every import of a loadgen module (or a relative one) made
    inside a function, however deeply nested, in line order."""
    lines = source.splitlines()
    found: dict[int, str] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.Import):
                modules = [alias.name for alias in inner.names]
            elif isinstance(inner, ast.ImportFrom):
                modules = ["loadgen"] if inner.level else [inner.module or ""]
            else:
                continue
            if any(m.split(".")[0] == "loadgen" for m in modules):
                found[inner.lineno] = lines[inner.lineno - 1]
    return sorted(found.items())


def defers_a_heavy_dependency(line: str) -> bool:
    """True when the line's comment names an installed module outside loadgen it defers."""
    named = DEFERS.search(line)
    if named is None or named.group(1).split(".")[0] == "loadgen":
        return False
    return importlib.util.find_spec(named.group(1).split(".")[0]) is not None


def test_the_import_check_sees_imports_inside_functions() -> None:
    """The check below flags a loadgen import in a (nested) function, relative ones too, and
    accepts only a comment naming a real dependency it defers."""
    source = (
        "import loadgen.cli\n"
        "def f():\n"
        "    import os\n"
        "    from loadgen.run import execute\n"
        "    def g():\n"
        "        from . import drive\n"
        "    from loadgen.render import plots  # defers matplotlib\n"
    )
    found = list(imports_in_functions(source))
    assert [number for number, _ in found] == [4, 6, 7]
    assert [defers_a_heavy_dependency(line) for _, line in found] == [False, False, True]
    assert not defers_a_heavy_dependency("from loadgen.run import x  # defers loadgen.engine")
    assert not defers_a_heavy_dependency("from loadgen.run import x  # defers no_such_module")


def test_no_loadgen_module_is_imported_inside_a_function() -> None:
    """Imports of loadgen modules sit at the top of each module, where they show the
    layering (and a circle fails at once); a function may defer one only to defer a heavy
    dependency, with a comment naming it (`# defers matplotlib`)."""
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "loadgen").rglob("*.py"))
        for number, line in imports_in_functions(path.read_text(encoding="utf-8"))
        if not defers_a_heavy_dependency(line)
    ]
    assert offenders == [], "\n".join(offenders)
