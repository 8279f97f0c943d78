"""The lint gate runs with the tests: ruff (check and format), mypy --strict, and the layering."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


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
    assert "Contracts: 3 kept, 0 broken." in result.stdout
