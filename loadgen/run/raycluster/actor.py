"""One shard on its node: the Ray actor that launches `shard` there, tells it its start,
stops it, recovers it when it was killed, and sends its run folder back as bytes.

Methods run in the actor's threads (`max_concurrency`), so that `progress` and `interrupt`
answer while `finish` waits for the process. Everything lives in a temp folder of the
actor's node, removed by `close`.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl
import ray

from loadgen.results.runfolder import (
    PART_GLOB,
    PARTS_DIR,
    RECORDS_FILE,
    RUN_FILE,
    pack_run_folder,
)
from loadgen.results.write import recover
from loadgen.run.options import RunOptions
from loadgen.run.told import READY_LINE, REFUSE_WORD
from loadgen.workload.spec import WorkloadSpec

STOP_WAIT_S = 10.0  # after SIGINT's grace, then after SIGTERM: how long before the next


class ShardActor:
    """The actor's class (made remote by `driver`, pinned to its placement-group bundle)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.folder = Path(tempfile.mkdtemp(prefix=f"loadgen-shard-{index}-"))
        self.process: subprocess.Popen[str] | None = None

    @property
    def run_dir(self) -> Path:
        return self.folder / "out" / f"shard-{self.index}"

    def where(self) -> dict[str, Any]:
        """The node this actor was placed on."""
        context = ray.get_runtime_context()
        return {"node_id": context.get_node_id(), "node_ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
                "host": socket.gethostname(), "actor_pid": os.getpid()}  # fmt: skip

    def clock(self) -> int:
        """This node's wall clock (unix ns), for the driver's round trips."""
        return time.time_ns()

    def launch(self, spec: WorkloadSpec, options: RunOptions) -> int:
        """Start the shard's process (it sets up, then says ready); its pid."""
        options_file = self.folder / "shard.pickle"
        here = replace(options, out_dir=self.folder / "out")
        options_file.write_bytes(pickle.dumps((spec, here)))
        stdout = open(self.folder / "stdout", "w")  # noqa: SIM115  # the child's, closed below
        stderr = open(self.folder / "stderr", "w")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "loadgen.run.raycluster.shard", str(options_file)],
            stdin=subprocess.PIPE, stdout=stdout, stderr=stderr, cwd=self.folder, text=True,
        )  # fmt: skip
        stdout.close()
        stderr.close()
        return self.process.pid

    def wait_ready(self, timeout_s: float) -> str | None:
        """None once the process said ready; else why it is not (it ended, or the time ran
        out)."""
        deadline = time.monotonic() + timeout_s
        process = self.process
        assert process is not None  # launched first
        while time.monotonic() < deadline:
            if READY_LINE in (self.folder / "stdout").read_text().split():
                return None
            if process.poll() is not None:
                return f"its process ended with exit {process.returncode}: {self._said()}"
            time.sleep(0.05)
        said = self._said() or "nothing said"
        return f"not ready after {timeout_s:g} s (still setting up: {said})"

    def start(self, line: str) -> None:
        """Tell the process its start (or refuse it: a `refuse` line)."""
        assert self.process is not None
        assert self.process.stdin is not None
        with contextlib.suppress(OSError):  # it ended: `finish` says how
            self.process.stdin.write(line)
            self.process.stdin.flush()
            if line.startswith(REFUSE_WORD):
                self.process.stdin.close()

    def pid(self) -> int | None:
        """The shard process's pid."""
        return self.process.pid if self.process is not None else None

    def progress(self) -> tuple[bool, int]:
        """(still running, records spilled so far)."""
        running = self.process is not None and self.process.poll() is None
        parts = self.run_dir / PARTS_DIR
        count = 0
        if parts.is_dir() and any(parts.glob(PART_GLOB)):
            with contextlib.suppress(Exception):  # a part being renamed: counted next time
                files = sorted(parts.glob(PART_GLOB))  # listed: polars would glob the folder
                count = int(pl.scan_parquet(files, glob=False).select(pl.len()).collect().item())
        return running, count

    def interrupt(self, grace_s: float) -> None:
        """Stop the process as Ctrl-C does (SIGINT: records kept), then SIGTERM, then SIGKILL."""
        process = self.process
        if process is None:
            return
        for sig, wait_s in ((signal.SIGINT, grace_s + STOP_WAIT_S), (signal.SIGTERM, STOP_WAIT_S),
                            (signal.SIGKILL, STOP_WAIT_S)):  # fmt: skip
            if process.poll() is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(wait_s)

    def finish(self) -> dict[str, Any]:
        """Wait for the process; recover its folder if it was killed; the folder as bytes
        (None: it left none), its exit code, whether it was recovered, its last words."""
        process = self.process
        assert process is not None
        code = process.wait()
        recovered = False
        folder = self.run_dir
        if (
            (folder / RUN_FILE).exists()
            and not (folder / RECORDS_FILE).exists()
            and (folder / PARTS_DIR).exists()
        ):
            recover(folder)  # killed outright: one record per plan, exit 5
            recovered = True
        packed = pack_run_folder(folder) if (folder / RECORDS_FILE).exists() else None
        return {"exit_code": code, "recovered": recovered, "folder": packed, "said": self._said()}

    def close(self) -> None:
        """Kill the process if it still runs, and remove the temp folder."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _said(self) -> str:
        """The process's last lines on stderr."""
        path = self.folder / "stderr"
        text = path.read_text(errors="replace") if path.exists() else ""
        return " | ".join(line.strip() for line in text.strip().splitlines()[-3:])
