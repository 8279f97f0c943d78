"""The nightly workflow of docs/nightly.md, run as the page writes it: green from night one.

The GitHub Actions workflow is read from the page itself (its `nightly-slo` YAML block), so
the docs cannot drift from what is tested: every step with a `run:` is run with bash, as
Actions runs it, in a folder holding `workloads/chat.yaml`, against a simulator started
on loopback (`vars.INFERENCE_URL`), night after night into one store. Night one has no
baseline yet and is green; a night whose generator falls behind (`--lag-bound-ms` added
to its run step: a strict bound the client cannot keep) is refused by `compare` and left
out of the next night's baseline and of the rolling view; every night's job summary step
finds the JUnit and Markdown files.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from loadgen.run.processes.simulator import running_sim

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # where `loadgen` is installed beside this Python
PAGE = ROOT / "docs" / "nightly.md"


@dataclass(frozen=True)
class Step:
    """One `run:` step of the workflow: its name, command and environment."""

    name: str
    command: str
    env: dict[str, str]


def workflow_steps() -> list[Step]:
    """The `run:` steps of the page's GitHub Actions workflow, in order (not the install)."""
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.DOTALL)
    (text,) = [b for b in blocks if "name: nightly-slo" in b]
    job = yaml.safe_load(text)["jobs"]["slo"]
    return [
        Step(name=step.get("name", step["run"]), command=step["run"],
             env={k: str(v) for k, v in (step.get("env") or {}).items()})
        for step in job["steps"]
        if "run" in step and not step["run"].startswith("pip install")
    ]  # fmt: skip


def test_the_page_has_the_steps_this_test_runs() -> None:
    """The workflow runs `loadgen run`, `loadgen compare --baseline-window` and the job
    summary, each with the files the next one reads."""
    steps = workflow_steps()
    assert [s.command.split()[:2] for s in steps] == [["loadgen", "run"], ["loadgen", "compare"],
                                                      ["cat", "slo.md"]]  # fmt: skip
    assert "--junit slo-junit.xml --markdown slo.md" in steps[0].command
    assert "--junit junit.xml --markdown summary.md" in steps[1].command


def fill(command: str, url: str) -> str:
    """The workflow's `${{ … }}` expressions as Actions fills them for this test."""
    values = {"vars.INFERENCE_URL": url, "vars.REPLICA_PRICE_PER_HOUR": "2.50",
              "secrets.INFERENCE_KEY": "test-key", "github.run_id": "1"}  # fmt: skip
    return re.sub(r"\$\{\{\s*([\w.]+)\s*\}\}", lambda m: values[m.group(1)], command)


def night(folder: Path, url: str, run_id: str, *, extra: str = "") -> list[tuple[int, str]]:
    """One night: every step run with bash (-e, as Actions does), `extra` appended to the
    run step; (exit code, output) per step."""
    env = {**os.environ, "RUN_ID": run_id, "GITHUB_STEP_SUMMARY": str(folder / "summary.txt"),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    done = []
    for index, step in enumerate(workflow_steps()):
        command = fill(step.command, url) + (f" {extra}" if index == 0 and extra else "")
        result = subprocess.run(
            ["bash", "-e", "-c", command], cwd=folder, capture_output=True, text=True,
            env={**env, **{k: fill(v, url) for k, v in step.env.items()}}, timeout=300,
            check=False,
        )  # fmt: skip
        done.append((result.returncode, result.stdout + result.stderr))
    return done


@pytest.mark.slow  # three nights of workloads/chat.yaml: ~2 minutes
@pytest.mark.timeout(900)
def test_the_documented_workflow_is_green_from_night_one(tmp_path: Path) -> None:
    """Night one: run 0, compare 0 ("no baseline yet", JUnit and Markdown written), summary
    0. Night two falls behind: run 3, compare refuses it (1, naming why), summary 0. Night
    three: compare 0 against night one alone, night two left out with its reason; the
    rolling view pools nights one and three and names night two."""
    (tmp_path / "workloads").mkdir()
    shutil.copy(ROOT / "workloads" / "chat.yaml", tmp_path / "workloads" / "chat.yaml")
    with running_sim() as sim:
        first = night(tmp_path, sim.url, "nightly-1")
        assert [code for code, _ in first] == [0, 0, 0], first
        assert "no baseline yet" in first[1][1]
        assert "days," not in first[1][1]
        assert "0:00:00" not in first[1][1]
        summary = (tmp_path / "summary.txt").read_text()
        assert "### loadgen run: SLO MET (exit 0)" in summary
        assert "### loadgen compare: no baseline yet" in summary
        second = night(tmp_path, sim.url, "nightly-2", extra="--lag-bound-ms 0.001")
        assert [code for code, _ in second] == [3, 1, 0], second
        said = " ".join(second[1][1].split())
        assert (
            "CURRENT nightly-2 is not compared: the generator fell behind: the send lag p99" in said
        )
        assert "### loadgen compare: not compared" in (tmp_path / "summary.md").read_text()
        third = night(tmp_path, sim.url, "nightly-3")
    assert [code for code, _ in third] == [0, 0, 0], third
    store = tmp_path / "store"
    compared = subprocess.run(
        [str(BIN / "loadgen"), "compare", "--baseline-window", "30d", "--store", str(store),
         str(store / "nightly-3"), "--format", "json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    data = json.loads(compared.stdout)
    assert data["baseline"]["runs"] == ["nightly-1"]
    (left_out,) = data["baseline"]["left_out"]
    assert left_out.startswith("nightly-2 (the generator fell behind: the send lag p99")
    rolling = subprocess.run([str(BIN / "loadgen"), "report", "store/", "--window", "30d", "--step", "1d",
                              "--out", str(tmp_path / "rolling")],
                             cwd=tmp_path, capture_output=True, text=True, check=False)  # fmt: skip
    assert rolling.returncode == 0, rolling.stderr
    said = " ".join(rolling.stdout.split())
    assert "left out, no measure of the server (--include-incomplete pools them): nightly-2" in said
    rows = json.loads((tmp_path / "rolling" / "rolling.json").read_text())
    assert {row["runs"] for row in rows} == {2}
