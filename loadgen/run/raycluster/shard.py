"""One shard's process on its node: `python -m loadgen.run.raycluster.shard OPTIONS_FILE`.

Launched by the shard's actor (`actor`), it runs `execute` on the workload and options the
driver pickled (the spec as resolved on the driver, overrides included, so a capacity
step's rate reaches it as it is), told its start on stdin (`run.told`). It imports no Ray.
Its parent is the actor: if the actor goes (its node lost, the driver gone), the shard
ends too, within a second, so that no process is left on any node.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
from pathlib import Path

from loadgen.errors import EXIT_INTERRUPTED, EXIT_USAGE, LoadgenError
from loadgen.run.execute import execute

PARENT_POLL_S = 0.5


def follow_parent() -> None:
    """Kill this process when its parent is gone (re-parented: its pid changed)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="follow-parent", daemon=True).start()


def main(argv: list[str]) -> int:
    """Run the pickled (spec, options); the run's exit code, 1 for a usage error."""
    follow_parent()
    spec, options = pickle.loads(Path(argv[1]).read_bytes())  # written by our own actor
    try:
        return execute(spec, options).exit_code
    except LoadgenError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except KeyboardInterrupt:  # before t0: nothing was sent
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main(sys.argv))
