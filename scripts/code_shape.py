"""Print the shape of loadgen's code: the figures a re-layout is judged by.

    python scripts/code_shape.py [--top N] [PACKAGE_DIR]

- modules over 600 lines (the house style splits a module past ~400);
- the N most complex functions (McCabe, as ruff's C901 counts it);
- the N largest signatures (parameters, `self`/`cls` not counted);
- the import-linter contracts (`lint-imports`: kept and broken).

Repeated code is not counted here: `python -m pylint --disable=all --enable=duplicate-code
loadgen` lists the repeated blocks (pylint is not a dependency: install it to run that).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

LONG_MODULE = 600


def long_modules(root: Path) -> list[tuple[int, str]]:
    """(lines, path) of every module over LONG_MODULE lines, longest first."""
    sizes = [(len(p.read_text(encoding="utf-8").splitlines()), str(p)) for p in root.rglob("*.py")]
    return sorted((s for s in sizes if s[0] > LONG_MODULE), reverse=True)


def complexity(root: Path) -> list[tuple[int, str, str]]:
    """(McCabe complexity, path, function) of every function, most complex first."""
    cmd = [sys.executable, "-m", "ruff", "check", str(root), "--select", "C901", "--config",
           "lint.mccabe.max-complexity = 0", "--output-format", "json", "--exit-zero",
           "--no-cache"]  # fmt: skip
    found = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    rows = []
    for item in found:
        score = re.search(r"\((\d+) >", item["message"])
        name = re.search(r"`([^`]+)`", item["message"])
        if score and name:
            rows.append((int(score.group(1)), _relative(item["filename"], root), name.group(1)))
    return sorted(rows, key=lambda r: (-r[0], r[1], r[2]))


def signatures(root: Path) -> list[tuple[int, str, str]]:
    """(parameters, path, function) of every function, largest first."""
    rows = []
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = node.args
                names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
                names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
                count = len([n for n in names if n not in ("self", "cls")])
                rows.append((count, _relative(str(path), root), node.name))
    return sorted(rows, key=lambda r: (-r[0], r[1], r[2]))


def contracts() -> str:
    """lint-imports' last line: contracts kept and broken."""
    done = subprocess.run(["lint-imports"], capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("Contracts:")]
    return lines[-1] if lines else f"lint-imports exited {done.returncode}"


def _relative(path: str, root: Path) -> str:
    full = Path(path).resolve()
    base = root.resolve().parent
    return str(full.relative_to(base)) if full.is_relative_to(base) else path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", nargs="?", default="loadgen", type=Path)
    parser.add_argument("--top", type=int, default=10)
    options = parser.parse_args()
    root: Path = options.root
    print(f"import contracts: {contracts()}")
    modules = long_modules(root)
    print(f"\nmodules over {LONG_MODULE} lines: {len(modules)}")
    for lines, path in modules:
        print(f"  {lines:5d}  {path}")
    print(f"\nthe {options.top} most complex functions (McCabe):")
    for score, path, name in complexity(root)[: options.top]:
        print(f"  {score:5d}  {path}  {name}")
    print(f"\nthe {options.top} largest signatures (parameters):")
    for count, path, name in signatures(root)[: options.top]:
        print(f"  {count:5d}  {path}  {name}")


if __name__ == "__main__":
    main()
