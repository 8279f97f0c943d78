"""The workload spec: the issue's file is accepted as is; every bad input names file, key, fix."""

from __future__ import annotations

import pytest

from loadgen.errors import ConfigError
from loadgen.workload.spec import load, loads, override

SMOKE = """
name: chat-smoke
target:
  api: openai-chat          # or openai-completions
  model: sim
classes:
  chat:
    arrival: {process: poisson, rate_per_s: 4}
    requests: 40
    prompt_tokens: {dist: fixed, value: 200}
    output_tokens: {dist: fixed, value: 32}
    slo: {ttft_ms: 1000, tpot_ms: 50, percentile: 99}
    deadlines: {first_token_s: 10, stall_s: 5, total_s: 60}
"""


def test_issue_example_is_accepted_as_is() -> None:
    """The file from the issue parses into the values it states."""
    spec = loads(SMOKE, "smoke.yaml")
    chat = spec.classes["chat"]
    assert spec.name == "chat-smoke"
    assert spec.target.api == "openai-chat"
    assert chat.arrival.process == "poisson"
    assert chat.arrival.rate_per_s == 4
    assert chat.requests == 40
    assert chat.duration_s is None
    assert chat.prompt_tokens.value == 200
    assert chat.output_tokens.value == 32
    assert (chat.slo.ttft_ms, chat.slo.tpot_ms, chat.slo.percentile) == (1000, 50, 99)
    assert (chat.deadlines.first_token_s, chat.deadlines.stall_s, chat.deadlines.total_s) == (
        10,
        5,
        60,
    )


def _bad(replace: str, by: str) -> str:
    assert replace in SMOKE
    return SMOKE.replace(replace, by)


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        (_bad("rate_per_s: 4", "rate_per_s: -1"), "classes.chat.arrival.rate_per_s", "must be > 0"),
        (_bad("process: poisson", "process: poison"), "classes.chat.arrival.process", "use one of"),
        (
            _bad("requests: 40", "requests: 40\n    duration_s: 5"),
            "classes.chat.requests",
            "exactly one",
        ),
        (_bad("requests: 40", "reqests: 40"), "classes.chat.reqests", "did you mean 'requests'"),
        (
            _bad("dist: fixed, value: 200", "dist: uniform, min: 5"),
            "classes.chat.prompt_tokens.min",
            "both",
        ),
        (
            _bad("value: 32", "value: many"),
            "classes.chat.output_tokens.value",
            "must be an integer",
        ),
        (_bad("percentile: 99", "percentile: 120"), "classes.chat.slo.percentile", "(0, 100]"),
        (_bad("api: openai-chat", "api: grpc"), "target.api", "use one of"),
        (
            _bad("model: sim", "model: sim\n  headers: {Authorization: Bearer x}"),
            "target.headers.Authorization",
            "api_key_env",
        ),
        (
            _bad("process: poisson, rate_per_s: 4", "process: poisson, rate_per_s: 4, cv: 2"),
            "classes.chat.arrival.cv",
            "unknown key",
        ),
        ("name: x\nclasses: {}\n", "classes", "at least one class"),
        ("name: [unclosed\n", "line 2", "YAML syntax error"),
        ("- a list\n", "(top level)", "must be a mapping"),
    ],
)
def test_bad_files_name_file_key_and_fix(text: str, key: str, fragment: str) -> None:
    """Each invalid file raises a ConfigError naming the file, the key path and the problem."""
    with pytest.raises(ConfigError) as info:
        loads(text, "bad.yaml")
    message = str(info.value)
    assert message.startswith("bad.yaml: "), message
    assert key in message, message
    assert fragment in message, message


def test_missing_file_is_a_config_error(tmp_path) -> None:
    """A path that does not exist is reported as such, not as a traceback."""
    with pytest.raises(ConfigError, match="file not found"):
        load(tmp_path / "nope.yaml")


def test_rate_override_total_and_multiplier() -> None:
    """`--rate 8` sets the total rate; `--rate 0.5x` halves every class."""
    two = SMOKE.replace(
        "classes:\n",
        "classes:\n  other:\n    arrival: {process: constant, rate_per_s: 12}\n"
        "    requests: 3\n    prompt_tokens: {dist: fixed, value: 1}\n"
        "    output_tokens: {dist: fixed, value: 1}\n",
    )
    spec = loads(two, "two.yaml")
    total = override(spec, rate="8")
    assert total.classes["chat"].arrival.rate_per_s == pytest.approx(2.0)
    assert total.classes["other"].arrival.rate_per_s == pytest.approx(6.0)
    half = override(spec, rate="0.5x")
    assert half.classes["chat"].arrival.rate_per_s == pytest.approx(2.0)
    with pytest.raises(ConfigError, match="--rate"):
        override(spec, rate="fast")


def test_requests_and_duration_overrides_replace_each_class() -> None:
    """`--requests`/`--duration` replace whichever of the two a class had."""
    spec = loads(SMOKE, "s.yaml")
    assert override(spec, requests=7).classes["chat"].requests == 7
    by_time = override(spec, duration_s=3.0).classes["chat"]
    assert by_time.duration_s == 3.0
    assert by_time.requests is None


def test_kind_specific_keys_are_checked() -> None:
    """Agent keys on a chat class are unknown keys; each kind accepts its own."""
    agent = SMOKE.replace("    requests: 40", "    kind: agent\n    requests: 4\n    hops: {dist: fixed, value: 3}\n"
                          "    tool_time_s: {dist: exponential, mean: 0.5}\n    trajectory_budget_s: 30")  # fmt: skip
    cls = loads(agent, "a.yaml").classes["chat"]
    assert (cls.kind, cls.hops.value, cls.trajectory_budget_s) == ("agent", 3, 30)
    with pytest.raises(ConfigError, match=r"classes\.chat\.hops: unknown key"):
        loads(
            SMOKE.replace(
                "    requests: 40", "    requests: 40\n    hops: {dist: fixed, value: 3}"
            ),
            "c.yaml",
        )
    with pytest.raises(ConfigError, match="concurrency"):
        loads(
            SMOKE.replace(
                "    requests: 40", "    kind: summarization\n    duration_s: 5\n    concurrency: 2"
            ),
            "s.yaml",
        )


def test_api_model_and_force_output_tokens_overrides() -> None:
    """--api replaces the API (the path follows it), --model and --force-output-tokens theirs."""
    spec = override(loads(SMOKE, "smoke.yaml"), api="anthropic", model="tiny",
                    force_output_tokens=False)  # fmt: skip
    assert (spec.target.api, spec.target.model, spec.target.path) == ("anthropic", "tiny", None)
    assert spec.target.force_output_tokens is False
    unchanged = override(loads(SMOKE, "smoke.yaml"))
    assert unchanged.target == loads(SMOKE, "smoke.yaml").target


@pytest.mark.parametrize(("api", "key"), [("mistral", "--api"), ("generic", "--api generic")])
def test_api_override_errors(api: str, key: str) -> None:
    """An unknown API, or generic without a described API in the file, is a ConfigError."""
    with pytest.raises(ConfigError) as err:
        override(loads(SMOKE, "smoke.yaml"), api=api)
    assert err.value.key == key


def test_every_api_name_is_accepted() -> None:
    """Each built-in API name validates (generic needs its section and a path)."""
    for api in ("openai-responses", "anthropic", "tgi", "ollama-chat", "ollama-generate"):
        assert loads(_bad("api: openai-chat", f"api: {api}"), "w.yaml").target.api == api
    with pytest.raises(ConfigError) as err:
        loads(_bad("api: openai-chat", "api: generic"), "w.yaml")
    assert err.value.key == "target.path"


def test_limits_set_the_event_cap_per_class_with_a_1_mib_default() -> None:
    """`limits: {max_event_bytes}` is read per class; a class without it gets 1 MiB."""
    two = SMOKE.replace(
        "    deadlines: {first_token_s: 10, stall_s: 5, total_s: 60}\n",
        "    deadlines: {first_token_s: 10, stall_s: 5, total_s: 60}\n"
        "    limits: {max_event_bytes: 4096}\n",
    )
    assert loads(two).classes["chat"].limits.max_event_bytes == 4096
    assert loads(SMOKE).classes["chat"].limits.max_event_bytes == 1 << 20


@pytest.mark.parametrize(
    ("limits", "fragment"),
    [
        ("{max_event_bytes: 10}", "max_event_bytes: must be >= 64 (got 10)"),
        ("{max_event_bytes: 2000000000}", "must be at most 1 GiB"),
        ("{max_event_bytes: 1.5}", "must be an integer"),
        ("{max_bytes: 100}", "unknown key (did you mean 'max_event_bytes'?)"),
    ],
)
def test_bad_limits_name_the_key(limits: str, fragment: str) -> None:
    """A cap too small, too large, not an integer or misspelt is a config error."""
    text = SMOKE.replace("    requests: 40\n", f"    requests: 40\n    limits: {limits}\n")
    with pytest.raises(ConfigError) as caught:
        loads(text, "w.yaml")
    assert "classes.chat.limits" in str(caught.value)
    assert fragment in str(caught.value)


def test_the_cache_mode_defaults_to_cold_and_is_checked() -> None:
    """`cache:` is cold unless the file or --cache says warm or reset; another value names
    the key and the choices."""
    assert loads(SMOKE).cache == "cold"
    assert loads(SMOKE + "cache: reset\n").cache == "reset"
    assert override(loads(SMOKE + "cache: reset\n"), cache="warm").cache == "warm"
    with pytest.raises(
        ConfigError, match=r"cache: unknown value 'lukewarm' \(use one of: cold, warm, reset"
    ):
        loads(SMOKE + "cache: lukewarm\n")
    with pytest.raises(ConfigError, match=r"--cache: unknown mode 'hot'"):
        override(loads(SMOKE), cache="hot")


# --- the file's keys are the model's fields ---------------------------------------------------

# One non-default value per key of `target` (a key the parser forgot to read leaves its
# field at its default, and the test below says which).
TARGET_SAMPLES = {
    "api": "generic",
    "model": "m",
    "url": "http://a:8000",
    "path": "/v1/generate",
    "api_key_env": "KEY",
    "headers": {"X-Team": "infra"},
    "include_usage": False,
    "force_output_tokens": False,
    "allow_early_stops": True,
    "extra_body": {"top_k": 5},
    "priority_header": "X-Priority",
    "tokenizer": "tok.json",
    "generic": {"body": {"input": "$prompt", "max": "$max_tokens"}, "content": "text"},
    "request_id": {"header": "X-Id", "format": "counter", "body": "on"},
    "server_metrics_url": "/metrics",
    "server_metrics_interval_s": 2,
    "server_metrics_headers": {"X-Scope": "lab"},
    "accept_encoding": True,
    "path_buffers": True,
    "traceparent": False,
    "tracestate": "vendor=v1",
}


def _every_target_key(tmp_path) -> object:
    import json

    from loadgen.workload.parse import TARGET_KEYS

    missing = [key for key in TARGET_KEYS if key not in TARGET_SAMPLES]
    assert not missing, f"target keys without a sample here: {missing} (add one)"
    (tmp_path / "tok.json").write_text("{}")
    text = SMOKE.replace(
        "target:\n  api: openai-chat          # or openai-completions\n  model: sim\n",
        f"target: {json.dumps(TARGET_SAMPLES)}\n",
    )
    return loads(text, str(tmp_path / "w.yaml"))


def test_every_target_field_is_a_key_the_parser_reads(tmp_path) -> None:
    """target's keys are TargetSpec's fields (request_id sets three): a file giving every
    key a non-default value leaves no field at its default. A field added to TargetSpec is
    a key at once, and this test fails until it has a sample and the parser reads it."""
    import dataclasses

    from loadgen.workload.model import TargetSpec

    target = _every_target_key(tmp_path).target
    at_default = [
        f.name
        for f in dataclasses.fields(TargetSpec)
        if getattr(target, f.name)
        == (f.default if f.default is not dataclasses.MISSING else f.default_factory())
    ]
    assert at_default == []


def test_the_fingerprint_hashes_every_target_field_not_marked_otherwise(tmp_path) -> None:
    """Each TargetSpec field set away from its default changes the workload's fingerprint,
    unless the model marks it NOT_TRAFFIC (then it leaves it alone): a new field is part of
    the workload unless it says otherwise, with no list elsewhere to forget."""
    import dataclasses

    from loadgen.workload.identity import fingerprint
    from loadgen.workload.model import FINGERPRINT, NOT_TRAFFIC, TargetSpec

    spec = loads(SMOKE)
    full = _every_target_key(tmp_path).target
    moved, still = set(), set()
    for f in dataclasses.fields(TargetSpec):
        changed = dataclasses.replace(spec.target, **{f.name: getattr(full, f.name)})
        print_ = fingerprint(dataclasses.replace(spec, target=changed))
        (still if print_ == fingerprint(spec) else moved).add(f.name)
    left_out = {
        f.name
        for f in dataclasses.fields(TargetSpec)
        if f.metadata.get(FINGERPRINT) == NOT_TRAFFIC[FINGERPRINT]
    }
    assert still == left_out
    # Where it is sent, how requests are labelled, how the server is watched (as before).
    assert left_out == {"url", "request_id_header", "request_id_format", "server_metrics_url",
                        "server_metrics_interval_s", "server_metrics_headers",
                        "path_buffers", "traceparent", "tracestate"}  # fmt: skip
    assert {"model", "api", "headers", "extra_body", "request_id_body"} <= moved


def test_known_keys_are_listed_as_before_in_field_order() -> None:
    """The derived key lists say the same as the lists once kept by hand: an unknown key
    with no close match lists the known ones in the file's order."""
    cases = {
        "target:\n  api: openai-chat          # or openai-completions\n  model: sim\n": (
            "target:\n  zzzzzz: 1\n",
            "api, model, url, path, api_key_env, headers, include_usage, force_output_tokens, "
            "allow_early_stops, extra_body, priority_header, tokenizer, generic, request_id, "
            "traceparent, tracestate, server_metrics_url, server_metrics_interval_s, "
            "server_metrics_headers, "
            "accept_encoding, path_buffers",
        ),
        "    requests: 40\n": (
            "    requests: 40\n    zzzzzz: 1\n",
            "kind, arrival, requests, duration_s, prompt_tokens, output_tokens, slo, deadlines, "
            "priority, limits, dataset, prompt, model, models, turns, think_time_s, "
            "system_prompt_tokens",
        ),
        "    deadlines: {first_token_s: 10, stall_s: 5, total_s: 60}\n": (
            "    deadlines: {first_token_s: 10, zzzzzz: 5}\n",
            "first_token_s, stall_s, total_s",
        ),
    }
    for old, (new, known) in cases.items():
        with pytest.raises(ConfigError) as err:
            loads(SMOKE.replace(old, new), "w.yaml")
        assert f"(known keys: {known})" in str(err.value)


def test_section_keys_come_from_their_dataclasses() -> None:
    """Each section's keys are its dataclass's fields, with the few renames the file makes
    (a dataset's min/max filters, a trace's window), and a kind's keys are class keys."""
    from loadgen.workload import parse, sections

    assert sections.DATASET_KEYS == (
        "path", "format", "prompt_field", "messages_field", "answer_field",
        "output_tokens_field", "sample", "replacement", "limit", "prompt_tokens",
        "output_tokens", "turns", "history",
    )  # fmt: skip
    assert sections.ARRIVAL_KEYS["trace"] == (
        "path", "format", "window_s", "speed", "rate_scale", "spread_s", "include_failed",
        "limit",
    )  # fmt: skip
    assert parse.WORKLOAD_KEYS == ("name", "description", "target", "classes", "seed",
                                   "cache", "sim")  # fmt: skip
    for kind, keys in parse.KIND_KEYS.items():
        assert set(keys) <= set(parse.CLASS_KEYS), kind


def test_an_api_key_header_is_a_credential_header() -> None:
    """One definition of credential header names: the API key's own headers (refused in
    target.headers) are among the names whose values are redacted everywhere."""
    from loadgen.engine.secrets import run_secrets
    from loadgen.workload.checks import API_KEY_HEADERS, CREDENTIAL_NAMES

    for name in API_KEY_HEADERS:
        assert CREDENTIAL_NAMES.search(name), name
        assert run_secrets({name.title(): "s3cret-value"}, [], None) == ["s3cret-value"]
    assert not CREDENTIAL_NAMES.search("X-Team")
