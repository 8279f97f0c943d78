"""Run the simulator as a subprocess: the embedded default target of the client CLI.

`target_url` is the one place that decides between the URL a user gave and the built-in
simulator (`loadgen run` and `loadgen capacity` both ask it).

A separate process (a `child.Child` command: `python -m loadgen.sim`), so the simulator
never competes with the client's event loop and the client's timing is measured against a
server it does not share a GIL with. It dies with the process that started it, whatever
kills that one (`lifeline`: SIGTERM, so it still flushes its trace), so a killed `loadgen
run` never leaves a simulator behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from loadgen.errors import ConfigError, LoadgenError
from loadgen.run.processes.child import Child, NotReady
from loadgen.sim.config import format_decode_table, validate
from loadgen.workload.spec import WorkloadSpec

_LISTENING = "loadgen sim listening on "
_NOT_IN_SIM_SECTION = {"host", "port"}
_FLAG_KEYS = {"no_done", "usage_in_finish", "close_after_stream", "per_request_metrics"}
STARTUP_TIMEOUT_S = 15.0  # the simulator imports little: it listens within this or is broken
STOP_WAIT_S = 10.0  # after SIGTERM (it flushes its trace), then SIGKILL


@dataclass(frozen=True, slots=True, kw_only=True)
class SimProcess:
    """A running simulator subprocess."""

    url: str  # e.g. http://127.0.0.1:40123
    pid: int
    trace_file: Path | None


def sim_args_from_mapping(mapping: Mapping[str, Any], source: str) -> list[str]:
    """Validate a workload's `sim:` section and turn it into `loadgen sim` arguments."""
    if not isinstance(mapping, Mapping):
        raise ConfigError(source, "sim", "must be a mapping of simulator settings", "or omit it")
    for key in mapping:
        if key in _NOT_IN_SIM_SECTION:
            fix = "the embedded simulator always listens on 127.0.0.1 on a free port"
            raise ConfigError(source, f"sim.{key}", "cannot be set here", fix)
    parsed = validate(mapping, source, prefix="sim.")
    args: list[str] = []
    for key, value in parsed.items():
        flag = "--" + key.replace("_", "-")
        if key == "faults":
            args.extend(f"--fault={name}={prob!r}" for name, prob in value.items())
        elif key in _FLAG_KEYS:
            args.extend([flag] if value else [])
        elif key == "decode_table":
            args.extend([flag, format_decode_table(value)])
        elif key == "output_dist":
            args.extend([flag, _output_dist_arg(mapping[key])])
        else:
            args.extend([flag, str(value)])
    return args


def _output_dist_arg(raw: object) -> str:
    return str(raw) if isinstance(raw, str) else f"fixed:{raw}"


def _stderr_tail(stderr: IO[bytes], limit: int = 2000) -> str:
    stderr.seek(0)
    text = stderr.read().decode("utf-8", "replace").strip()
    return text[-limit:] or "(no output on stderr)"


def _listening_url(line: str) -> str | None:
    """The URL of the simulator's `listening on` line (None: another line)."""
    return line[len(_LISTENING) :].strip() if line.startswith(_LISTENING) else None


@contextlib.contextmanager
def running_sim(
    args: Sequence[str] = (),
    *,
    trace_file: Path | None = None,
    spans_url: str | None = None,
    startup_timeout_s: float = STARTUP_TIMEOUT_S,
) -> Iterator[SimProcess]:
    """Start `python -m loadgen.sim --host 127.0.0.1 --port 0 *args`; stop it on exit.

    Start it from the main thread: it dies when the thread that started it does (see
    `lifeline`), which for the main thread means when this process does.
    """
    command = [sys.executable, "-m", "loadgen.sim", "--host", "127.0.0.1", "--port", "0", *args]
    if trace_file is not None:
        command += ["--trace-file", str(trace_file)]
    if spans_url is not None:  # its spans to the run's OTLP receiver
        command += ["--otlp-traces-endpoint", spans_url]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryFile() as stderr:
        child = Child.command(command, ready_line=_listening_url, stderr=stderr,
                              lifeline=signal.SIGTERM, env=env)  # fmt: skip
        try:
            try:
                url = child.wait_ready(startup_timeout_s)
            except NotReady as why:
                said = _stderr_tail(stderr)
                if why.exit_code is None:
                    raise LoadgenError(f"loadgen sim did not start listening within "
                                       f"{startup_timeout_s:g} s:\n{said}") from None  # fmt: skip
                raise LoadgenError(f"loadgen sim exited with code {why.exit_code} before "
                                   f"listening:\n{said}") from None  # fmt: skip
            yield SimProcess(url=url, pid=child.process.pid, trace_file=trace_file)
        finally:
            child.stop((signal.SIGTERM, STOP_WAIT_S))  # SIGKILL if it does not exit in time
            child.close()


@contextlib.contextmanager
def target_url(
    url: str | None, spec: WorkloadSpec, *, trace_file: Path | None = None,
    spans_url: str | None = None,
) -> Iterator[tuple[str, list[str] | None]]:  # fmt: skip
    """The given URL (else the workload's `target.url`), or the built-in simulator started
    with the workload's `sim:` settings and stopped after. Yields the URL and the
    simulator's arguments (None when it was not started)."""
    url = url or spec.target.url
    if url:
        yield url, None
        return
    args = sim_args_from_mapping(spec.sim, spec.source)
    with running_sim(args, trace_file=trace_file, spans_url=spans_url) as sim:
        yield sim.url, args
