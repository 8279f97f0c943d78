"""The lint gate runs with the tests: ruff (check and format), mypy --strict, and the layering."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[2]
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


# Calls that write a file. A frame or a figure may be written into memory (an `io.BytesIO`
# buffer of the same module), which is how render/ returns bytes for the caller to write.
WRITING_METHODS = frozenset({
    "write_text", "write_bytes", "touch", "mkdir", "unlink", "rmdir", "symlink_to",
    "hardlink_to",
})  # fmt: skip
TO_A_BUFFER = frozenset({
    "savefig", "write_parquet", "write_csv", "write_ipc", "write_json", "write_ndjson",
    "write_excel", "write_avro", "sink_parquet", "sink_csv", "sink_ipc", "sink_ndjson",
})  # fmt: skip
WRITING_MODULES = frozenset({"shutil", "tempfile"})
OS_WRITES = frozenset({
    "replace", "rename", "renames", "remove", "unlink", "rmdir", "removedirs", "mkdir",
    "makedirs", "utime", "truncate", "ftruncate", "link", "symlink", "write", "mkfifo",
})  # fmt: skip
OS_OPEN_FLAGS = frozenset({"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"})


def _is_write_mode(node: ast.expr | None) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)
            and any(c in node.value for c in "wax+"))  # fmt: skip


def _buffers(tree: ast.AST) -> set[str]:
    """Names a module binds to `io.BytesIO(...)` / `io.StringIO(...)` (memory, not files)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("BytesIO", "StringIO"):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def file_writes(source: str) -> list[tuple[int, str]]:
    """(line number, line) of every call in `source` that writes a file: `open` in a write
    mode, `Path.write_text` / `write_bytes` / `touch` / `mkdir` / `unlink`, a frame or a
    figure written anywhere but an in-memory buffer (`write_parquet`, `savefig`, ...),
    `os.replace` and the other writes of `os`, `os.open` with a write flag, `shutil`,
    `tempfile` and a logging `FileHandler`."""
    tree = ast.parse(source)
    lines = source.splitlines()
    buffers = _buffers(tree)
    found: dict[int, str] = {}
    for node in ast.walk(tree):
        hit = False
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                node.module or ""]  # fmt: skip
            hit = any(m.split(".")[0] in WRITING_MODULES for m in modules)
        elif (isinstance(node, ast.Name) and node.id == "FileHandler") or (
            isinstance(node, ast.Attribute) and node.attr == "FileHandler"
        ):
            hit = True
        elif isinstance(node, ast.Call):
            func = node.func
            mode = next((k.value for k in node.keywords if k.arg == "mode"), None)
            if isinstance(func, ast.Name) and func.id == "open":
                hit = _is_write_mode(node.args[1] if len(node.args) > 1 else mode)
            elif isinstance(func, ast.Attribute):
                owner = func.value.id if isinstance(func.value, ast.Name) else None
                if owner == "os" and func.attr == "open":
                    hit = any(isinstance(n, ast.Attribute) and n.attr in OS_OPEN_FLAGS
                              for a in node.args[1:2] for n in ast.walk(a))  # fmt: skip
                elif owner == "os":
                    hit = func.attr in OS_WRITES
                elif owner in WRITING_MODULES:
                    hit = True
                elif func.attr == "open":  # Path.open(mode)
                    hit = _is_write_mode(node.args[0] if node.args else mode)
                elif func.attr in WRITING_METHODS:
                    hit = True
                elif func.attr in TO_A_BUFFER:
                    target = node.args[0] if node.args else None
                    hit = not (isinstance(target, ast.Name) and target.id in buffers)
        if hit:
            found[node.lineno] = lines[node.lineno - 1]
    return sorted(found.items())


def test_the_write_scan_sees_each_kind_of_file_write() -> None:
    """The scan below flags every way of writing a file it names, and lets a frame or a
    figure be written into a memory buffer, and files be read."""
    source = (
        "import io, os, json\n"
        "import shutil\n"
        "def f(path, frame, fig):\n"
        "    open(path, 'w').write('x')\n"
        "    path.write_text('x')\n"
        "    path.write_bytes(b'x')\n"
        "    frame.write_parquet(path)\n"
        "    fig.savefig(path / 'knee.png')\n"
        "    os.replace(path, path)\n"
        "    shutil.rmtree(path)\n"
        "    path.open(mode='ab')\n"
        "    os.open(path, os.O_RDWR | os.O_CREAT)\n"
        "    path.mkdir()\n"
        "    h = logging.FileHandler(path)\n"
        "    buffer = io.BytesIO()\n"
        "    fig.savefig(buffer, format='png')\n"
        "    frame.write_parquet(buffer)\n"
        "    open(path).read()\n"
        "    open(path, 'rb').read()\n"
        "    path.read_text()\n"
        "    os.open(path, os.O_RDONLY)\n"
        "    frame.rename({'a': 'b'})\n"
        "    'text'.replace('a', 'b')\n"
    )
    assert [number for number, _ in file_writes(source)] == [2, *range(4, 15)]


def test_analysis_and_render_write_no_file() -> None:
    """analysis/ and render/ compute and return (frames, a Summary, bytes): no call of theirs
    writes a file; `loadgen.results.write` writes what they return (and import-linter
    forbids them that module, pyproject.toml)."""
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for package in ("analysis", "render")
        for path in sorted((ROOT / "loadgen" / package).rglob("*.py"))
        for number, line in file_writes(path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], "\n".join(offenders)


def _opened_names(tree: ast.AST) -> set[str]:
    """Names bound by `with <x>.open(...) as name` (an open file, not a path)."""
    return {
        item.optional_vars.id
        for node in ast.walk(tree)
        if isinstance(node, ast.With)
        for item in node.items
        if isinstance(item.optional_vars, ast.Name)
        and isinstance(item.context_expr, ast.Call)
        and getattr(item.context_expr.func, "attr", getattr(item.context_expr.func, "id", ""))
        == "open"
    }


def path_reads_that_glob(source: str) -> list[tuple[int, str]]:
    """(line number, line) of every polars read or scan (`pl.read_*`, `pl.scan_*`) that
    would take its path as a glob pattern: polars globs by default, so `runs[prod]/…` reads
    nothing and `runs*/…` every run of the name. A call passes when it says `glob=False`,
    or (a reader with no such parameter: read_ndjson, read_ipc, …) reads an open file."""
    tree = ast.parse(source)
    opened = _opened_names(tree)
    lines = source.splitlines()
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "pl"
                and node.func.attr.startswith(("read_", "scan_"))):  # fmt: skip
            continue
        reader = getattr(pl, node.func.attr, None)
        if reader is None or "source" not in inspect.signature(reader).parameters:
            continue  # not a reader of files
        if "glob" in inspect.signature(reader).parameters:
            safe = any(k.arg == "glob" and isinstance(k.value, ast.Constant)
                       and k.value.value is False for k in node.keywords)  # fmt: skip
        else:
            safe = bool(node.args) and isinstance(node.args[0], ast.Name) and (
                node.args[0].id in opened)  # fmt: skip
        if not safe:
            found.append((node.lineno, lines[node.lineno - 1]))
    return found


def test_the_glob_scan_sees_a_read_that_globs() -> None:
    """The scan flags a read without glob=False and an NDJSON read of a path, not a read with
    glob=False or of an open file."""
    source = (
        "import polars as pl\n"
        "def f(path):\n"
        "    pl.read_parquet(path)\n"
        "    pl.scan_parquet(path, glob=True)\n"
        "    pl.read_ndjson(path)\n"
        "    pl.read_csv(path, glob=False)\n"
        "    with path.open('rb') as handle:\n"
        "        pl.read_ndjson(handle)\n"
        "    pl.DataFrame({'a': [1]})\n"
    )
    assert [number for number, _ in path_reads_that_glob(source)] == [3, 4, 5]


def test_every_polars_read_takes_its_path_as_a_path() -> None:
    """No read or scan in loadgen/ takes its path as a glob pattern (`path_reads_that_glob`)."""
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "loadgen").rglob("*.py"))
        for number, line in path_reads_that_glob(path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], "\n".join(offenders)
