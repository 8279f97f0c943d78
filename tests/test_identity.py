"""The spec rebuilt from run.json: what `report --recover` plans the killed run from."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from loadgen.identity import spec_from_resolved
from loadgen.plans import plan_work
from loadgen.spec import WorkloadSpec, load

WORKLOADS = sorted((Path(__file__).parent.parent / "workloads").glob("*.yaml"))


def stored(spec: WorkloadSpec) -> dict[str, Any]:
    """The spec as run.json keeps it (`run._run_info`): asdict, no raw, header names only."""
    data = dataclasses.asdict(spec)
    data.pop("raw")
    data["target"]["headers"] = sorted(spec.target.headers)
    return dict(json.loads(json.dumps(data)))


@pytest.mark.parametrize("path", WORKLOADS, ids=lambda p: p.name)
def test_every_shipped_workload_is_rebuilt_from_run_json_with_the_same_plan(path: Path) -> None:
    """spec → run.json form → spec plans exactly the same requests (what --recover relies on)."""
    spec = load(path)
    rebuilt = spec_from_resolved(stored(spec))
    assert rebuilt.classes == spec.classes
    assert plan_work(rebuilt, 7).plans == plan_work(spec, 7).plans
