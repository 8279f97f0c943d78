"""Workload identity (what the store pools by) and the spec rebuilt from run.json (recovery)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from loadgen.workload.identity import fingerprint, identity, identity_of_run, spec_from_resolved
from loadgen.workload.plans import plan_work
from loadgen.workload.spec import WorkloadSpec, load, loads, override

WORKLOADS = sorted((Path(__file__).parent.parent / "workloads").glob("*.yaml"))
CHAT = """
name: chat
target: {api: openai-chat, model: m, url: "http://a:8000"}
classes:
  chat:
    arrival: {process: poisson, rate_per_s: 4}
    requests: 40
    prompt_tokens: {dist: fixed, value: 200}
    output_tokens: {dist: fixed, value: 32}
    slo: {ttft_ms: 1000, tpot_ms: 50, percentile: 99}
"""


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


def test_seed_run_length_url_and_path_leave_the_identity_alone() -> None:
    """A nightly job that varies the seed, --requests/--duration, the URL or where the file
    lies runs one workload."""
    spec = loads(CHAT, "workloads/chat.yaml")
    same = [
        dataclasses.replace(spec, seed=9),
        override(spec, requests=500),
        override(spec, duration_s=120),
        dataclasses.replace(spec, target=dataclasses.replace(spec.target, url="http://b:9000")),
        loads(CHAT, "/elsewhere/chat.yaml"),
    ]
    assert {fingerprint(s) for s in same} == {fingerprint(spec)}


def test_rate_slo_model_cap_and_simulator_make_another_workload() -> None:
    """--rate 3x, another SLO, model, --max-in-flight or simulator profile: another workload."""
    spec = loads(CHAT)
    chat = spec.classes["chat"]
    stricter = dataclasses.replace(chat, slo=dataclasses.replace(chat.slo, ttft_ms=500))
    other = [
        override(spec, rate="3x"),
        override(spec, rate="8"),
        override(spec, model="big"),
        dataclasses.replace(spec, classes={"chat": stricter}),
        dataclasses.replace(spec, sim={"max_batch": 8}),
        dataclasses.replace(spec, name="chat-2"),
    ]
    prints = [fingerprint(s) for s in other] + [fingerprint(spec, max_in_flight=4)]
    assert len(set(prints)) == len(prints)
    assert fingerprint(spec) not in prints
    assert identity(override(spec, rate="3x"))["offered_rate_per_s"] == 12.0


def test_an_older_run_gets_the_identity_a_new_one_records() -> None:
    """A run.json without workload.identity (an older loadgen) derives the same key from its
    stored spec, also when the stored spec lacks a setting added since (at its default)."""
    spec = loads(CHAT)
    recorded = identity(spec)
    info = {"workload": {"name": "chat", "spec": stored(spec)}, "options": {}}
    assert identity_of_run(info) == recorded
    del info["workload"]["spec"]["classes"]["chat"]["priority"]  # a key an older loadgen lacked
    assert identity_of_run(info)["key"] == recorded["key"]
    assert identity_of_run({**info, "options": {"max_in_flight": 4}})["key"] != recorded["key"]


def test_a_stored_spec_that_cannot_be_rebuilt_still_has_a_stable_identity() -> None:
    """A partial spec (hand-written, or of a loadgen this one cannot read) is hashed as stored:
    equal specs share a key, a different rate does not."""
    partial = {"classes": {"chat": {"slo": {"ttft_ms": 400}, "arrival": {"rate_per_s": 4}}}}
    faster = {"classes": {"chat": {"slo": {"ttft_ms": 400}, "arrival": {"rate_per_s": 12}}}}
    a = identity_of_run({"workload": {"name": "chat", "spec": partial}})
    b = identity_of_run({"workload": {"name": "chat", "spec": json.loads(json.dumps(partial))}})
    c = identity_of_run({"workload": {"name": "chat", "spec": faster}})
    assert a["key"] == b["key"] != c["key"]
    assert a["key"].startswith("chat@")


def test_a_dataset_counts_by_file_name_and_a_mix_or_prefix_set_is_another_workload(
    tmp_path: Path,
) -> None:
    """The same dataset in two folders is one workload; a model mix or a prefix set is another."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "rows.jsonl").write_text('{"prompt": "hello there"}\n')
    dataset = CHAT.replace("    prompt_tokens: {dist: fixed, value: 200}\n",
                           "    dataset: {path: rows.jsonl, format: jsonl}\n")  # fmt: skip
    here, there = (loads(dataset, str(tmp_path / f / "w.yaml")) for f in ("a", "b"))
    assert fingerprint(here) == fingerprint(there)
    base = loads(CHAT)
    mixed = loads(CHAT.replace("    slo:", "    models: [{name: a}, {name: b}]\n    slo:"))
    shared = loads(CHAT.replace(
        "    prompt_tokens: {dist: fixed, value: 200}\n",
        "    prompt: {shared_prefix_tokens: 100, groups: 2, suffix_tokens: {dist: fixed, value: 100}}\n",
    ))  # fmt: skip
    prints = {fingerprint(s) for s in (base, mixed, shared, here)}
    assert len(prints) == 4
