"""One shard on its node: the Ray actor that launches `shard` there (a `processes.child.Child`
command, told its start on stdin), stops it, recovers it when it was killed, and sends its
run folder back as bytes.

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
from loadgen.run.processes.child import Child, NotReady
from loadgen.run.processes.told import READY_LINE, REFUSE_WORD
from loadgen.workload.spec import WorkloadSpec

SHARD_MODULE = "loadgen.run.scale.raycluster.shard"  # the shard process: `python -m` it
STOP_WAIT_S = 10.0  # after SIGINT's grace, then after SIGTERM: how long before the next


class ShardActor:
    """The actor's class (made remote by `driver`, pinned to its placement-group bundle)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.folder = Path(tempfile.mkdtemp(prefix=f"loadgen-shard-{index}-"))
        self.child: Child | None = None

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
        """Start the shard's process (it sets up, then says ready); its pid. It follows this
        actor itself (`shard.main`), so no lifeline wraps it."""
        options_file = self.folder / "shard.pickle"
        here = replace(options, out_dir=self.folder / "out")
        options_file.write_bytes(pickle.dumps((spec, here)))
        with open(self.folder / "stderr", "w") as stderr:  # the child's; `_said` reads it
            self.child = Child.command(
                [sys.executable, "-m", SHARD_MODULE, str(options_file)], ready_line=_ready,
                stderr=stderr, lifeline=None, stdin=True, cwd=self.folder,
            )  # fmt: skip
        return int(self.child.process.pid)

    def wait_ready(self, timeout_s: float) -> str | None:
        """None once the process said ready; else why it is not (it ended, or the time ran
        out)."""
        assert self.child is not None  # launched first
        try:
            self.child.wait_ready(timeout_s)
        except NotReady as why:
            if why.exit_code is not None:
                return f"its process ended with exit {why.exit_code}: {self._said()}"
            said = self._said() or "nothing said"
            return f"not ready after {timeout_s:g} s (still setting up: {said})"
        return None

    def start(self, start_at_unix_ns: int, clock_offset_ns: int) -> None:
        """Tell the process its start: the driver's agreed start and this node's clock
        offset from the driver's (an ended process: `finish` says how it ended)."""
        assert self.child is not None
        self.child.start_at(start_at_unix_ns, clock_offset_ns)

    def refuse(self, reason: str) -> None:
        """Tell the process the run was refused: it ends without sending, saying why."""
        assert self.child is not None
        self.child.tell_line(f"{REFUSE_WORD} {reason}\n", last=True)

    def pid(self) -> int | None:
        """The shard process's pid."""
        return self.child.pid if self.child is not None else None

    def progress(self) -> tuple[bool, int]:
        """(still running, records spilled so far)."""
        running = self.child is not None and self.child.exit_code is None
        parts = self.run_dir / PARTS_DIR
        count = 0
        if parts.is_dir() and any(parts.glob(PART_GLOB)):
            with contextlib.suppress(Exception):  # a part being renamed: counted next time
                files = sorted(parts.glob(PART_GLOB))  # listed: polars would glob the folder
                count = int(pl.scan_parquet(files, glob=False).select(pl.len()).collect().item())
        return running, count

    def interrupt(self, grace_s: float) -> None:
        """Stop the process as Ctrl-C does (SIGINT: records kept), then SIGTERM, then SIGKILL."""
        if self.child is not None:
            self.child.stop((signal.SIGINT, grace_s + STOP_WAIT_S), (signal.SIGTERM, STOP_WAIT_S),
                            (signal.SIGKILL, STOP_WAIT_S))  # fmt: skip

    def finish(self) -> dict[str, Any]:
        """Wait for the process; recover its folder if it was killed; the folder as bytes
        (None: it left none), its exit code, whether it was recovered, its last words."""
        child = self.child
        assert child is not None
        child.wait(None)
        code = child.exit_code
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
        if self.child is not None:
            self.child.stop()  # no nudge: killed if it still runs
            self.child.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _said(self) -> str:
        """The process's last lines on stderr."""
        path = self.folder / "stderr"
        text = path.read_text(errors="replace") if path.exists() else ""
        return " | ".join(line.strip() for line in text.strip().splitlines()[-3:])


def _ready(line: str) -> str | None:
    """The shard's ready line (`processes.told`), or None for another."""
    return line if READY_LINE in line.split() else None
