"""Artifact schemas: a key added, renamed or removed in summary.json or run.json needs a
schema_version bump (and a new snapshot), so old runs stay readable by what reads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from loadgen.cli import cli
from loadgen.results.runfolder import SCHEMA_VERSION
from loadgen.testing import ScriptedServer, simple_chat
from loadgen.testing.builders import chat_workload, workload_file

SNAPSHOT = Path(__file__).parents[1] / "schema" / "keys.json"
KEYED_BY_NAME = {
    "classes",
    "per_hop_ms",
    "finish_reasons",
    "n_from",
    "per_hop",
    "models",
    "asked",
}  # mappings whose keys are class names or hop numbers

WORKLOAD = chat_workload("schema", requests=30, deadlines=None)  # a p90 is judged from 29


def key_paths(value: Any, prefix: str = "") -> set[str]:
    """Dotted paths of every key; names under a keyed-by-name mapping become `*`."""
    paths: set[str] = set()
    if isinstance(value, dict):
        keyed_by_name = prefix.rstrip(".").rsplit(".", 1)[-1] in KEYED_BY_NAME
        for key, child in value.items():
            path = f"{prefix}{'*' if keyed_by_name else key}"
            paths.add(path)
            paths |= key_paths(child, f"{path}.")
    elif isinstance(value, list) and value and isinstance(value[0], dict):
        paths |= key_paths(value[0], f"{prefix}[].")
    return paths


def current_keys(tmp_path: Path) -> dict[str, list[str]]:
    workload = workload_file(tmp_path, WORKLOAD)
    with ScriptedServer(lambda r: simple_chat(3)) as server:
        result = CliRunner().invoke(cli, ["run", str(workload), "--url", server.url, "--out", str(tmp_path),
                                          "--run-id", "r", "-q", "--lag-bound-ms", "1000",
                                          "--price-per-hour", "2"])  # fmt: skip  # the cost keys too
    assert result.exit_code == 0, result.output
    return {
        name: sorted(key_paths(json.loads((tmp_path / "r" / name).read_text())))
        for name in ("summary.json", "run.json")
    }


def test_artifact_keys_match_the_snapshot_of_this_schema_version(tmp_path: Path) -> None:
    """Changing a key of summary.json or run.json without a schema_version bump fails here."""
    keys = current_keys(tmp_path)
    snapshot = json.loads(SNAPSHOT.read_text())
    assert snapshot["schema_version"] == SCHEMA_VERSION, (
        "schema_version changed: regenerate tests/schema/keys.json (see its 'how' entry)"
    )
    for name, paths in keys.items():
        added = sorted(set(paths) - set(snapshot[name]))
        removed = sorted(set(snapshot[name]) - set(paths))
        message = (
            f"{name} keys changed without a schema_version bump: added {added}, removed {removed}. "
            "Bump loadgen.run.execute.SCHEMA_VERSION and regenerate the snapshot."
        )
        assert not added, message
        assert not removed, message
