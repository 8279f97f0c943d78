"""Fuzz the front door: Hypothesis-made workload files and argument lists through `check`
and `run --dry-run` must end in exit 0 or 1 with a message, never a traceback.

Three generators: (1) workload documents built from the real schema (every key, process,
distribution and kind) where each value is usually sane and sometimes hostile (NaN, ±inf,
1e308, huge integers, numeric strings, dates, nesting, the wrong type); (2) raw bytes and
text as the file; (3) argument lists for `check` and `run --dry-run` drawn from their real
options with hostile values. A plan that passes is kept small by `--max-memory-gb` (about
8,000 requests), so a valid document costs milliseconds. The fast suite runs a modest
number of examples; the `slow` test runs the same properties on many more.

The `@example`s pin inputs that broke the front door before: a `window_s` of strings, a
non-JSON `extra_body`, an agent class replaying a trace (empty trajectories), a trace
window thinned to no request (IndexError), `--start-at inf` (OverflowError).
"""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from loadgen.adapters import REGISTRY
from loadgen.cli import cli
from loadgen.engine.transport import encode_request, make_endpoint

SMALL_PLANS = ("--max-memory-gb", "0.05")  # ~8,000 requests: valid plans stay cheap
FAST = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
LONG = settings(max_examples=5000, deadline=None, suppress_health_check=list(HealthCheck))

TRACE = "t_s,prompt_tokens,output_tokens\n0,10,5\n0.5,20,4\n1.5,5,9\n"

# -- values -------------------------------------------------------------------------------

HOSTILE = st.one_of(
    st.sampled_from([
        0, -1, 1, 2**31, 2**63, 10**30, -(10**30), 0.0, -0.0, 1e-12, 1e308, -1e308,
        float("nan"), float("inf"), float("-inf"), True, False, None, "", "1e-12", "40",
        "many", " ", "\x00", "é" * 50, [], {}, [1, 2], {"a": 1}, dt.date(2024, 1, 1),
    ]).map(copy.deepcopy),  # a fresh copy: `workloads` mutates what it draws, in place
    st.integers(), st.floats(), st.text(max_size=20),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)  # fmt: skip


def length_dist(hi: int) -> st.SearchStrategy[dict[str, Any]]:
    """A valid token-count (or turn-count) distribution up to `hi`."""
    count = st.integers(1, hi)
    return st.one_of(
        st.builds(lambda v: {"dist": "fixed", "value": v}, count),
        st.builds(lambda a, b: {"dist": "uniform", "min": min(a, b), "max": max(a, b)}, count, count),
        st.builds(lambda m, cv: {"dist": "lognormal", "mean": m, "cv": cv, "max": hi},
                  st.floats(1, hi), st.floats(0.1, 2)),
        st.builds(lambda m: {"dist": "exponential", "mean": m}, st.floats(1, hi)),
    )  # fmt: skip


SECONDS = st.one_of(
    st.builds(lambda v: {"dist": "fixed", "value": v}, st.floats(0, 3)),
    st.builds(lambda m: {"dist": "exponential", "mean": m, "max": 5}, st.floats(0.01, 2)),
)
RATE = st.floats(0.5, 200)
ARRIVALS = st.one_of(
    st.builds(lambda r: {"process": "constant", "rate_per_s": r}, RATE),
    st.builds(lambda r: {"process": "poisson", "rate_per_s": r}, RATE),
    st.builds(lambda r, cv: {"process": "gamma", "rate_per_s": r, "cv": cv}, RATE, st.floats(0.1, 5)),
    st.builds(lambda on, off, a, b: {"process": "onoff", "on_rate_per_s": on, "off_rate_per_s": off,
                                     "on_mean_s": a, "off_mean_s": b},
              RATE, st.floats(0, 5), st.floats(0.1, 3), st.floats(0.1, 3)),
    st.builds(lambda steps: {"process": "ramp", "steps": steps}, st.lists(st.fixed_dictionaries(
        {"rate_per_s": st.floats(1, 50), "duration_s": st.floats(0.1, 3)}), min_size=1, max_size=3)),
    st.builds(lambda scale, window: {"process": "trace", "path": "trace.csv",
                                     "rate_scale": scale, **window},
              st.floats(0.1, 3), st.sampled_from([{}, {"window_s": [0, 1]}])),
)  # fmt: skip


@st.composite
def classes(draw: st.DrawFn) -> dict[str, Any]:
    """A valid class of any kind."""
    arrival = draw(ARRIVALS)
    is_trace = arrival["process"] == "trace"  # a trace row is one request: chat, no sessions
    kind = "chat" if is_trace else draw(st.sampled_from(["chat", "summarization", "agent"]))
    cls: dict[str, Any] = {"kind": kind, "arrival": arrival}
    if kind == "summarization" and draw(st.booleans()):
        cls["concurrency"] = draw(st.integers(1, 8))
        cls["requests"] = draw(st.integers(1, 50))
    elif arrival["process"] not in ("ramp", "trace") or draw(st.booleans()):
        key = draw(st.sampled_from(["requests", "duration_s"]))
        cls[key] = draw(st.integers(1, 100) if key == "requests" else st.floats(0.1, 10))
    if arrival["process"] != "trace" or draw(st.booleans()):
        cls["prompt_tokens"] = draw(length_dist(4000))
        cls["output_tokens"] = draw(length_dist(500))
    total = draw(st.floats(1, 100))
    cls["deadlines"] = {"total_s": total, "first_token_s": draw(st.floats(0.1, total)),
                        "stall_s": draw(st.floats(0.1, total))}  # fmt: skip
    cls["slo"] = draw(st.fixed_dictionaries({}, optional={
        "ttft_ms": st.floats(1, 5000), "tpot_ms": st.floats(1, 500), "percentile": st.floats(1, 100),
    }))  # fmt: skip
    if kind == "chat" and not is_trace and draw(st.booleans()):
        cls.update(turns=draw(length_dist(5)), think_time_s=draw(SECONDS),
                   system_prompt_tokens=draw(st.integers(0, 300)))  # fmt: skip
    if kind == "agent":
        cls.update(hops=draw(length_dist(8)), tool_time_s=draw(SECONDS),
                   trajectory_budget_s=draw(st.floats(1, 100)))  # fmt: skip
    return cls


TARGET = st.fixed_dictionaries({}, optional={
    "api": st.sampled_from(list(REGISTRY)),
    "model": st.text(min_size=1, max_size=10),
    "url": st.sampled_from(["http://127.0.0.1:8000", "https://h.example/v1", "http://[::1]:80"]),
    "headers": st.dictionaries(st.from_regex(r"\AX-[A-Za-z]{1,5}\Z"), st.text("abc ", max_size=5),
                               max_size=2),
    "include_usage": st.booleans(), "force_output_tokens": st.booleans(),
    "extra_body": st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5),
                                  max_size=3),
})  # fmt: skip
SIM = st.fixed_dictionaries({}, optional={
    "max_batch": st.integers(1, 64), "chunk_tokens": st.integers(16, 512),
    "prefill_tokens_per_s": st.floats(100, 10000), "speed": st.floats(0.5, 100),
})  # fmt: skip


@st.composite
def valid_workloads(draw: st.DrawFn) -> dict[str, Any]:
    """A workload document that should pass (it may still plan too much or nothing)."""
    names = draw(st.lists(st.sampled_from(["chat", "docs", "agent", "x y", "1"]), min_size=1,
                          max_size=2, unique=True))  # fmt: skip
    doc: dict[str, Any] = {"name": "fuzz", "classes": {n: draw(classes()) for n in names}}
    doc.update(draw(st.fixed_dictionaries({}, optional={
        "target": TARGET, "seed": st.integers(0, 10), "sim": SIM, "description": st.text(max_size=9),
    })))  # fmt: skip
    return doc


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path into a document (the root is ())."""
    found = [path]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*path, index))
    return found


@st.composite
def workloads(draw: st.DrawFn) -> Any:
    """A valid document with 0-2 mutations: a value replaced by a hostile one, a key removed,
    or an unknown key added, each at a random place."""
    # A copy: the mutations below work in place, and the strategies share constants.
    doc = copy.deepcopy(draw(valid_workloads()))
    for _ in range(draw(st.integers(0, 2))):
        path = draw(st.sampled_from(_paths(doc)))
        if not path:
            return draw(HOSTILE)
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        # a copy: HOSTILE's sampled [] and {} are shared, and a later mutation writing into
        # one would change every later example (hypothesis: FlakyStrategyDefinition)
        if action == "replace":
            parent[path[-1]] = copy.deepcopy(draw(HOSTILE))
        elif action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = copy.deepcopy(draw(HOSTILE))
    return doc


def dump(doc: Any) -> str:
    """YAML text of a document; a value YAML cannot represent becomes its repr."""
    try:
        return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)
    except yaml.YAMLError:
        return repr(doc)


# -- the property -------------------------------------------------------------------------


def assert_clean(args: list[str]) -> None:
    """The command ends with exit 0 or 1, by `sys.exit` (never an exception), no traceback."""
    result = CliRunner().invoke(cli, args)
    assert result.exit_code in (0, 1), (args, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        args, result.exception,
    )  # fmt: skip
    assert "Traceback" not in result.output, (args, result.output)
    if result.exit_code == 1:
        assert result.output.strip(), args  # a refusal always says why


def write(folder: Path, data: str | bytes) -> Path:
    (folder / "trace.csv").write_text(TRACE)
    path = folder / "w.yaml"
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8", errors="surrogatepass")
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("front-door")


def check_documents(folder: Path, doc: Any) -> None:
    path = write(folder, dump(doc))
    assert_clean(["check", str(path), *SMALL_PLANS])
    assert_clean(["run", str(path), "--dry-run", "--out", str(folder / "out"), *SMALL_PLANS])


def check_raw(folder: Path, data: bytes) -> None:
    assert_clean(["check", str(write(folder, data)), *SMALL_PLANS])


OPTION_VALUES = st.one_of(
    st.sampled_from(["0", "1", "-1", "2x", "0x", "nan", "inf", "-inf", "1e400", "1e-300",
                     "100000000000", "0.5", "", " ", "../escape", "a/b", "..", "x" * 300,
                     "http://127.0.0.1:99999", "http://127.0.0.1:1", "ftp://x", "0/1", "1/1",
                     "3/2", "2026-11-29T12:00:00Z", "9999-12-31T23:59:59", "X:1", "X A:1",
                     "X:a\r\nY: b", "X:${NO_SUCH_VAR_FD}", "\udcff", "r\udcff", "X:\udcff",
                     "http://256.1.1.1:8000", "http://127.0.0.1:0", "http://1.2.3:80",
                     "http://[::g]:80", "http://a..b:80", "https://[::1]:443/v1",
                     "http://u:p@127.0.0.1:8000/v1?k=1", "auto", "100000", "1000001",
                     "Accept-Encoding: gzip", "X-Id:\u2028"]),
    # What argv can hold: no NUL, and of the surrogates only those surrogateescape makes of
    # bytes that are not UTF-8 ("\udcff" above).
    st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12),
)  # fmt: skip
CHECK_OPTIONS = ["--requests", "--duration", "--rate", "--seed", "--api", "--model",
                 "--max-memory-gb"]  # fmt: skip
RUN_OPTIONS = [
    *CHECK_OPTIONS,
    "--url", "--out", "--run-id", "--max-in-flight", "--lag-bound-ms", "--grace", "--header",
    "--watchdog", "--workers", "--shard", "--start-at", "--warm-connections",
]  # fmt: skip
FLAGS = ["--force-output-tokens", "--no-force-output-tokens", "--schedule", "--no-preflight",
         "--sim-trace", "-q", "--bogus"]  # fmt: skip


@st.composite
def argument_lists(draw: st.DrawFn, options: list[str]) -> list[str]:
    args: list[str] = []
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.integers(0, 4)) == 0:
            args.append(draw(st.sampled_from(FLAGS)))
        else:
            args.extend([draw(st.sampled_from(options)), draw(OPTION_VALUES)])
    return args


def check_arguments(folder: Path, check_args: list[str], run_args: list[str]) -> None:
    path = write(folder, (Path(__file__).parents[2] / "workloads" / "chat.yaml").read_text())
    assert_clean(["check", str(path), *SMALL_PLANS, *check_args])
    out = ["--out", str(folder / "out")]
    assert_clean(["run", str(path), "--dry-run", *out, *SMALL_PLANS, *run_args])


# -- the fast suite: a modest number of examples ------------------------------------------


@FAST
@given(doc=workloads())
@example(
    doc={
        "name": "w",
        "classes": {
            "c": {"arrival": {"process": "trace", "path": "trace.csv", "window_s": ["a", "b"]}}
        },
    }
)
@example(
    doc={
        "name": "w",
        "target": {"extra_body": {"when": dt.date(2024, 1, 1)}},
        "classes": {"c": {"arrival": {"process": "constant", "rate_per_s": 1}, "requests": 2}},
    }
)
@example(
    doc={
        "name": "w",
        "classes": {"c": {"kind": "agent", "arrival": {"process": "trace", "path": "trace.csv"}}},
    }
)  # planned empty trajectories
@example(
    doc={
        "name": "w",
        "classes": {
            "c": {
                "arrival": {
                    "process": "trace",
                    "path": "trace.csv",
                    "rate_scale": 0.3,
                    "window_s": [0, 1],
                }
            }
        },
    }
)
def test_generated_workloads_exit_0_or_1(folder: Path, doc: Any) -> None:
    """A generated workload document passes `check` and `run --dry-run` or is refused."""
    check_documents(folder, doc)


@FAST
@given(data=st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode)))
def test_raw_bytes_as_a_workload_exit_0_or_1(folder: Path, data: bytes) -> None:
    """Any bytes as the workload file end `check` with exit 0 or 1."""
    check_raw(folder, data)


@FAST
@given(check_args=argument_lists(CHECK_OPTIONS), run_args=argument_lists(RUN_OPTIONS))
@example(check_args=[], run_args=["--shard", "0/1", "--start-at", "inf"])
@example(check_args=["--rate", "1e300"], run_args=["--start-at", "1e400", "--shard", "0/2"])
def test_generated_argument_lists_exit_0_or_1(
    folder: Path, check_args: list[str], run_args: list[str]
) -> None:
    """Generated flags for `check` and `run --dry-run` are accepted or refused with exit 1."""
    check_arguments(folder, check_args, run_args)


# A base URL that --dry-run calls valid is one a run can connect to: httpx (the preflight)
# and the engine's own request writer both accept it. Hosts are drawn from the pieces that
# broke it: numbers past 255, too few or many of them, empty labels, bad IPv6 literals.
HOST_PIECES = st.sampled_from(
    [
        "127",
        "0",
        "1",
        "255",
        "256",
        "999",
        "01",
        "a",
        "-a",
        "a-",
        "x_y",
        "",
        "é",
        "[::1]",
        "[::g]",
        "[1::2::3]",
        "localhost",
    ]
)
URLS = st.builds(
    lambda scheme, labels, port, path: f"{scheme}://{'.'.join(labels)}{port}{path}",
    st.sampled_from(["http", "https"]), st.lists(HOST_PIECES, min_size=1, max_size=5),
    st.sampled_from(["", ":0", ":1", ":8000", ":65535", ":65536", ":-1", ":x"]),
    st.sampled_from(["", "/", "/v1", "/v1?x=1"]),
)  # fmt: skip


@FAST
@given(url=URLS)
@example(url="http://256.1.1.1:8000")
def test_a_url_dry_run_accepts_is_one_a_run_can_send_to(folder: Path, url: str) -> None:
    """`--url` as `run --dry-run` judges it: accepted only if httpx and the engine's request
    writer accept it too (256.1.1.1 passed the dry run and broke the run); else exit 1."""
    path = write(folder, (Path(__file__).parents[2] / "workloads" / "chat.yaml").read_text())
    result = CliRunner().invoke(cli, ["run", str(path), "--dry-run", "--url", url, "--out",
                                      str(folder / "out"), *SMALL_PLANS])  # fmt: skip
    assert result.exit_code in (0, 1), result.output
    assert "Traceback" not in result.output
    if result.exit_code == 0:
        httpx.URL(url)  # raises httpx.InvalidURL for what the preflight could not send
        endpoint = make_endpoint(url, "/v1/chat/completions", {})
        assert encode_request(endpoint, b"{}", {}).startswith(b"POST /")
    else:
        assert "--url" in result.output


# -- the long run: the same properties, many more examples --------------------------------


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_front_door_holds_for_many_more_examples(folder: Path) -> None:
    """The three properties above, 5,000 examples each."""
    LONG(given(doc=workloads())(lambda doc: check_documents(folder, doc)))()
    LONG(given(data=st.binary(max_size=2000))(lambda data: check_raw(folder, data)))()
    LONG(
        given(check_args=argument_lists(CHECK_OPTIONS), run_args=argument_lists(RUN_OPTIONS))(
            lambda check_args, run_args: check_arguments(folder, check_args, run_args)
        )
    )()
