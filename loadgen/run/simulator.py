"""Run the simulator as a subprocess: the embedded default target of the client CLI.

`target_url` is the one place that decides between the URL a user gave and the built-in
simulator (`loadgen run` and `loadgen capacity` both ask it).

A separate process, so the simulator never competes with the client's event loop and
the client's timing is measured against a server it does not share a GIL with. It dies
with the process that started it, whatever kills that one (`loadgen.run.lifeline`: SIGTERM,
so it still flushes its trace), so a killed `loadgen run` never leaves a simulator behind.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from loadgen.errors import ConfigError, LoadgenError
from loadgen.run import lifeline
from loadgen.sim.config import format_decode_table, validate
from loadgen.workload.spec import WorkloadSpec

_LISTENING = "loadgen sim listening on "
_NOT_IN_SIM_SECTION = {"host", "port"}
_FLAG_KEYS = {"no_done", "usage_in_finish", "close_after_stream"}


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


def _wait_for_url(proc: subprocess.Popen[bytes], stderr: IO[bytes], timeout_s: float) -> str:
    """Read the child's stdout until its `listening on` line; LoadgenError otherwise."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while (remaining := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([proc.stdout], [], [], min(remaining, 0.2))
        if ready:
            line = proc.stdout.readline().decode("utf-8", "replace")
            if line.startswith(_LISTENING):
                return line[len(_LISTENING) :].strip()
            if line:
                continue
        if proc.poll() is not None:
            raise LoadgenError(
                f"loadgen sim exited with code {proc.returncode} before listening:\n"
                f"{_stderr_tail(stderr)}"
            )
    raise LoadgenError(
        f"loadgen sim did not start listening within {timeout_s:g} s:\n{_stderr_tail(stderr)}"
    )


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM (the child flushes its trace), then SIGKILL if it does not exit in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


@contextlib.contextmanager
def running_sim(
    args: Sequence[str] = (),
    *,
    trace_file: Path | None = None,
    startup_timeout_s: float = 15.0,
) -> Iterator[SimProcess]:
    """Start `python -m loadgen.sim --host 127.0.0.1 --port 0 *args`; stop it on exit.

    Start it from the main thread: it dies when the thread that started it does (see
    `loadgen.run.lifeline`), which for the main thread means when this process does.
    """
    command = [sys.executable, "-m", "loadgen.sim", "--host", "127.0.0.1", "--port", "0", *args]
    if trace_file is not None:
        command += ["--trace-file", str(trace_file)]
    command = lifeline.wrap(command, signal.SIGTERM)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL, env=env
        )
        try:
            url = _wait_for_url(proc, stderr, startup_timeout_s)
            yield SimProcess(url=url, pid=proc.pid, trace_file=trace_file)
        finally:
            _stop(proc)


@contextlib.contextmanager
def target_url(
    url: str | None, spec: WorkloadSpec, *, trace_file: Path | None = None
) -> Iterator[tuple[str, list[str] | None]]:
    """The given URL (else the workload's `target.url`), or the built-in simulator started
    with the workload's `sim:` settings and stopped after. Yields the URL and the
    simulator's arguments (None when it was not started)."""
    url = url or spec.target.url
    if url:
        yield url, None
        return
    args = sim_args_from_mapping(spec.sim, spec.source)
    with running_sim(args, trace_file=trace_file) as sim:
        yield sim.url, args
