"""Bounded reading of the files a user names: a size cap, strict UTF-8, a YAML node budget.

The front door of the pipeline (workload YAML → spec): whatever a file holds, reading it
takes bounded time and memory and ends either in text or in a `ConfigError` that says what
is wrong, where and how to fix it. A file over its cap is refused before it is read whole;
a byte that is not UTF-8 is named by its offset; a YAML document whose aliases would expand
past `YAML_NODE_BUDGET` nodes (a "billion laughs" bomb), or that nests deeper than
`YAML_MAX_DEPTH`, is refused after composing, before anything is constructed from it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from loadgen.errors import ConfigError
from loadgen.units import MIB

WORKLOAD_MAX_BYTES = 1 * MIB  # the shipped workloads are ~2 KB; request data goes in a trace
TRACE_MAX_BYTES = 1024 * MIB  # a trace is read whole (polars): ~3x its size in memory
YAML_NODE_BUDGET = 100_000  # nodes after alias expansion; a workload needs a few hundred
YAML_MAX_DEPTH = 64  # nesting levels (JSON encoders refuse ~255; a workload needs ~6)

# YAML 1.2 floats: `1e-12` and `1e11` are numbers (YAML 1.1, PyYAML's default, reads them as
# strings because they lack a dot). Integers still resolve first, so `12` stays an int.
_YAML12_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")

_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when installed


class _BoundedLoader(_BaseLoader):  # type: ignore[misc]  # PyYAML's loaders are untyped
    """PyYAML's safe loader with YAML 1.2 floats and a budget on the composed graph."""

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            _check_graph(node)
            _check_unique_keys(node)
        return node  # type: ignore[no-any-return]  # PyYAML's loaders are untyped


class _DuplicateKey(Exception):
    """A mapping names one key twice (PyYAML would keep the last silently)."""

    def __init__(self, key: str, line: int, first_line: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first_line = key, line, first_line


def _check_unique_keys(root: yaml.Node) -> None:
    """Refuse a mapping that repeats a key: `requests: 40` then `requests: 400` further down
    would run 400 without a word. Merge keys (`<<: *base`) may be overridden, as YAML means."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[str, int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    line = key.start_mark.line + 1
                    if key.value in first:
                        raise _DuplicateKey(key.value, line, first[key.value])
                    first[key.value] = line
                stack.extend((key, value))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


_BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", _YAML12_FLOAT, list("-+0123456789.")
)


_DEPTH_FIX = "a workload nests about 6 levels deep"


class _GraphError(Exception):
    """The composed YAML graph is over budget: what was found, and how to fix it."""

    def __init__(self, problem: str, fix: str = "a workload needs a few hundred nodes") -> None:
        super().__init__(problem)
        self.problem, self.fix = problem, fix


def _check_graph(root: yaml.Node) -> None:
    """Count the nodes the document expands to (an alias counts its whole target again) and
    its depth, in time linear in the distinct nodes: each node's expanded size is memoised."""
    sizes: dict[int, int] = {}
    depths: dict[int, int] = {}
    open_nodes: set[int] = set()
    aliased = False

    def visit(node: yaml.Node, level: int) -> int:
        nonlocal aliased
        key = id(node)
        if key in open_nodes:
            raise _GraphError(
                "an alias refers to a node that contains it (a recursive anchor)",
                "an alias (*name) may only repeat a node defined before it, outside it",
            )
        if key in sizes:
            aliased = True
            if level + depths[key] > YAML_MAX_DEPTH:
                raise _GraphError(f"it nests deeper than {YAML_MAX_DEPTH} levels", _DEPTH_FIX)
            return sizes[key]
        if level > YAML_MAX_DEPTH:
            raise _GraphError(f"it nests deeper than {YAML_MAX_DEPTH} levels", _DEPTH_FIX)
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        open_nodes.add(key)
        size, depth = 1, 0
        for child in children:
            size += visit(child, level + 1)
            depth = max(depth, depths[id(child)] + 1)
            if size > YAML_NODE_BUDGET:
                raise _GraphError(f"it expands to more than {YAML_NODE_BUDGET:,} nodes")
        open_nodes.discard(key)
        sizes[key], depths[key] = size, depth
        return size

    try:
        visit(root, 0)
    except _GraphError as exc:
        how = " through its aliases (*name)" if aliased and "alias" not in exc.problem else ""
        raise _GraphError(exc.problem + how, exc.fix) from None


def read_text(path: Path, *, cap_bytes: int, what: str, fix: str) -> str:
    """The UTF-8 text of `path` (a byte-order mark is dropped), refused past `cap_bytes`.

    Reads at most cap + 1 bytes whatever the file is (a FIFO, /dev/zero), so a huge or
    endless file costs no more than the cap. `what` names the file in errors ("workload
    file"); `fix` says what to do about a file over the cap.
    """
    source = str(path)
    try:
        with path.open("rb") as file:
            data = file.read(cap_bytes + 1)
            size = path.stat().st_size if path.is_file() else 0
    except FileNotFoundError:
        raise ConfigError(source, "", f"{what} not found", "check the path") from None
    except IsADirectoryError:
        raise ConfigError(source, "", f"is a directory, not a {what}", "give a file") from None
    except OSError as exc:
        raise ConfigError(source, "", f"cannot read the {what}: {exc.strerror}") from None
    if len(data) > cap_bytes:
        held = f"is {size_text(size)}" if size > cap_bytes else "holds more than that"
        raise ConfigError(
            source, "", f"the {what} {held}: over the {size_text(cap_bytes)} cap", fix
        )
    return decode_utf8(data, source)


def decode_utf8(data: bytes, source: str) -> str:
    """`data` as text; a byte that is not UTF-8 is named by its offset, line and column."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        start = exc.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        line = data.count(b"\n", 0, start) + 1
        column = start - (data.rfind(b"\n", 0, start) + 1) + 1
        raise ConfigError(
            source,
            f"byte {start:,} (line {line}, column {column})",
            f"not UTF-8 text (byte 0x{data[start]:02x})",
            "save the file as UTF-8",
        ) from None


def load_yaml(text: str, source: str) -> Any:
    """One YAML document, within the node budget; a `ConfigError` for anything malformed."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader subclass
    except _GraphError as exc:
        raise ConfigError(source, "", f"YAML document refused: {exc.problem}", exc.fix) from None
    except _DuplicateKey as exc:
        raise ConfigError(
            source, f"line {exc.line}",
            f"duplicate key {exc.key[:60]!r} (first at line {exc.first_line}): YAML would keep "
            "only the last one, silently", "remove one of them",
        ) from None  # fmt: skip
    except RecursionError:  # the pure-Python loader on deep nesting (libyaml stops at 1000)
        raise ConfigError(
            source, "", "YAML document refused: it nests too deeply", _DEPTH_FIX
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(source, where, f"YAML syntax error: {problem}") from None


def json_problem(exc: ValueError) -> str:
    """Why a JSON text did not parse, as a reader can act on it: "nested too deeply" for
    orjson's depth limit (1,024 levels; a dataset row or trace line nests a few)."""
    text = str(exc)
    if "depth limit" in text or "recursion" in text.lower():
        return "nested too deeply (over 1,024 levels of [ or {; a row nests a few)"
    return f"not valid JSON: {text}"


def size_text(size: int) -> str:
    """Bytes as `1.5 MiB` / `640 KiB` / `12 B`."""
    for unit, scale in (("GiB", 1024 * MIB), ("MiB", MIB), ("KiB", 1024)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}".replace(".0 ", " ")
    return f"{size} B"
