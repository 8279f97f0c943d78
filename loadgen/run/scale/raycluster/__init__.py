"""`run --ray`: the shards of one run placed, started, collected and merged by Ray.

The only package that imports Ray (a contract in pyproject.toml); Ray is the optional extra
`loadgen[ray]`, imported when a run asks for it (`driver.RayRunner.for_run`), never at
import of this package. `driver` runs on the machine the user typed the command on; `actor`
is one shard's Ray actor on its node; `shard` is the process the actor launches there. What
they decide is in `run.scale.cluster`, without Ray.
"""

from __future__ import annotations

INSTALL_HINT = "pip install 'loadgen[ray]' (Ray 2.50 or later) on the driver and every node"
