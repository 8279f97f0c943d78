"""Every shipped workload, run as shipped on the built-in simulator, meets its objectives with margin.

A new user's first run is one of these files; a file that misses its own SLOs out of the box
teaches that the tool (or the simulator) is wrong. Each file runs exactly as the README says,
`loadgen run workloads/X.yaml`, at the simulator's real speed (the physics its comments
describe), beside two busy loops (a box loaded like a shared CI runner), and the test asserts
the verdict (exit 0, no bound raised: every check MET at its confidence, so each file is sized
to be judged, and the client's lag did not change it) and that every judged figure keeps at least
`MIN_MARGIN` of headroom, so a change that pushes a workload to its edge fails here before
a user sees a coin-flip verdict. The judged figure is the one the verdict acts on: a
percentile's upper confidence bound, a trajectory share's lower one. The measured margins
are printed (`-s`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = sorted((ROOT / "workloads").glob("*.yaml"))
MIN_MARGIN = 0.10  # tuned for >= 20 %; 10 % leaves room for a busy CI machine


def margins(summary: dict[str, Any]) -> dict[str, float]:
    """Headroom of every judged figure as a share of its limit: 1 − value / limit (> 0 holds)."""
    found: dict[str, float] = {}
    for name, block in summary["classes"].items():
        judged_by = block["slo"].get("judged_by")
        if judged_by == "batch":
            batch = block["batch"]
            assert batch["ok"] == batch["documents"], (name, batch)
            found[f"{name} batch time"] = 1 - batch["completion_time_s"] / batch["deadline_s"]
        elif judged_by == "trajectory":
            trajectory = block["trajectory"]
            attained, target = trajectory["attainment_low"], trajectory["target_attainment"]
            unused = (attained - target) / (1 - target) if target < 1 else attained - 1
            found[f"{name} trajectories ok"] = unused  # of the share above the target, unused
            longest = trajectory["duration_s"]["p99"]
            found[f"{name} longest trajectory"] = 1 - longest / trajectory["budget_s"]
        else:
            for check in block["slo"]["checks"]:
                label = f"{name} {check['metric']} p{check['percentile']:g}"
                assert check["verdict"] == "met", (label, check)
                assert check["high_ms"] is not None, (label, check)  # open, or a failure
                found[label] = 1 - check["high_ms"] / check["target_ms"]
    return found


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("path", WORKLOADS, ids=lambda p: p.stem)
def test_shipped_workload_meets_its_objectives_as_shipped(
    path: Path, tmp_path: Path, busy_machine: list[int]
) -> None:
    """`loadgen run workloads/X.yaml` on the built-in simulator, beside two busy loops (a
    box loaded like a shared CI runner), meets its objectives with every judged figure in
    margin: exit 0, no bound raised. The client's lag is charged to the figures judged
    and did not change the verdict (the generator-health rule); it is printed."""
    command = [sys.executable, "-m", "loadgen", "run", str(path), "--out", str(tmp_path), "-q"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=400, check=False)
    said = done.stdout + done.stderr
    (run_dir,) = tmp_path.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    generator = summary["generator"]
    lag = f"send lag p99 {generator['lag_ms']['p99']} ms, rate shortfall {generator['rate_shortfall']}"
    assert done.returncode == 0, f"{lag}; {generator['reason']}: {said}"
    assert generator["planned"] == generator["recorded"]
    found = margins(summary)
    assert found, "no judged figure: the workload judges nothing"
    print(path.name, {label: f"{share:.0%}" for label, share in found.items()}, lag)
    thin = {label: round(share, 3) for label, share in found.items() if share < MIN_MARGIN}
    assert not thin, f"{path.name}: margin under {MIN_MARGIN:.0%}: {thin}; {lag}"
