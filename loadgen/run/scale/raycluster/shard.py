"""One shard's process on its node: `python -m loadgen.run.scale.raycluster.shard OPTIONS_FILE`.

Launched by the shard's actor (`actor`, as a `processes.child.Child` command), it runs
`execute` on the workload and options the driver pickled (the spec as resolved on the
driver, overrides included, so a capacity step's rate reaches it as it is), told its start
on stdin (`processes.told`). It imports no Ray. Its parent is the actor: if the actor goes
(its node lost, the driver gone), the shard ends too, within a second, so that no process
is left on any node.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from pathlib import Path

from loadgen.errors import EXIT_INTERRUPTED, EXIT_USAGE, LoadgenError
from loadgen.run.execute import execute
from loadgen.run.processes.lifeline import die_with_parent


def main(argv: list[str]) -> int:
    """Run the pickled (spec, options); the run's exit code, 1 for a usage error."""
    # A watcher, not the kernel's death signal: that one fires when the *thread* that
    # started this process exits, and the actor starts it from one of its threads.
    die_with_parent(os.getppid(), signal.SIGKILL, kernel=False)
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
