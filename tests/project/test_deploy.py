"""The shipped deployment files (deploy/): valid YAML of the kind they say, whose loadgen
command lines use only flags `loadgen run` has."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from loadgen.cli.run import run

ROOT = Path(__file__).parents[2]
DEPLOY = ROOT / "deploy"
EXAMPLES = {"${JOB_COMPLETION_INDEX}": "1", "${START_AT}": "2026-11-29T02:00:00Z",
            "$(date +%F)": "2026-11-29"}  # fmt: skip


def loadgen_commands(texts: list[str]) -> list[list[str]]:
    """Each `loadgen run ...` in these shell texts (one command a line, up to a `;`), as
    words, the example values put in for the pods' variables."""
    found = []
    for text in texts:
        for name, value in EXAMPLES.items():
            text = text.replace(name, value)
        commands = re.finditer(r"(?m)(?:^ *|-- +)(loadgen run [^;\n]*)", text)  # kubectl exec --
        found += [shlex.split(m.group(1)) for m in commands]
    return found


def comment_text(text: str) -> str:
    """The manifest's comments as shell text: `# ` dropped, `\\` continuations joined."""
    lines = [line.strip()[1:].strip() for line in text.splitlines() if line.strip().startswith("#")]
    return "\n".join(lines).replace("\\\n", " ")


def strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [s for v in node.values() for s in strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in strings(v)]
    return [node] if isinstance(node, str) else []


@pytest.mark.parametrize(
    ("path", "kind"),
    [("kubernetes/indexed-job.yaml", "Job"), ("kuberay/rayjob.yaml", "RayJob"),
     ("kuberay/raycluster.yaml", "RayCluster")],
)  # fmt: skip
def test_each_manifest_is_yaml_of_its_kind(path: str, kind: str) -> None:
    """One document, the kind and API group it says."""
    document = yaml.safe_load((DEPLOY / path).read_text())
    assert document["kind"] == kind
    assert document["apiVersion"] == ("batch/v1" if kind == "Job" else "ray.io/v1")


@pytest.mark.parametrize("path", ["kubernetes/indexed-job.yaml", "kuberay/rayjob.yaml",
                                  "kuberay/raycluster.yaml"])  # fmt: skip
def test_every_loadgen_command_in_a_manifest_parses_as_loadgen_run(path: str) -> None:
    """Every `loadgen run` line (in the manifest's values and its comments) is accepted by
    run's own option parser: a renamed or removed flag fails here."""
    text = (DEPLOY / path).read_text()
    commands = loadgen_commands([*strings(yaml.safe_load(text)), comment_text(text)])
    assert commands, f"{path} runs no loadgen"
    for words in commands:
        assert words[:2] == ["loadgen", "run"], words
        args = words[2:]
        with click.Context(run) as ctx:
            parser = run.make_parser(ctx)
            values, rest, _ = parser.parse_args(args=list(args))
        assert str(values["workload"]).endswith(".yaml"), words
        assert not rest, words


def test_the_ray_manifests_shard_with_ray_and_the_job_with_shards() -> None:
    """The KubeRay manifests run `--ray auto`; the Indexed Job `--shard i/N --start-at`."""
    job = (DEPLOY / "kubernetes" / "indexed-job.yaml").read_text()
    assert "--shard ${JOB_COMPLETION_INDEX}/4 --start-at ${START_AT}" in job
    for name in ("rayjob.yaml", "raycluster.yaml"):
        assert "--ray auto" in (DEPLOY / "kuberay" / name).read_text()
