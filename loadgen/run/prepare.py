"""Everything a run checks and builds before it sends or writes anything.

Shared by every runner (`run.execute`) and by `loadgen run --dry-run`, so both refuse alike:
the plans and the shard's share of them, the agreed start, the client (headers and their
${VAR}s), the simulator profile when there is no URL, the cache mode and nonce, and that
the run folder is free and can be made.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from loadgen.adapters.protocol import Adapter
from loadgen.engine.secrets import Redactor
from loadgen.errors import ConfigError, OptionError
from loadgen.results.summary import CacheWarmth
from loadgen.run.options import RunOptions
from loadgen.run.processes.simulator import sim_args_from_mapping
from loadgen.run.setup import client_setup
from loadgen.workload.plans import Work, plan_work
from loadgen.workload.prompts import nonce_words
from loadgen.workload.shards import check_start_at, split_work
from loadgen.workload.spec import WorkloadSpec

NONCE_HEX = 8  # hex digits of a drawn nonce


@dataclass(frozen=True, slots=True)
class Prepared:
    """What a run checks and builds before it makes its folder (`prepare`)."""

    work: Work  # this run's plans (its shard's share, with --shard)
    adapter: Adapter
    headers: dict[str, str]
    redactor: Redactor
    url: str | None  # None: the built-in simulator
    cache: CacheWarmth


def prepare(spec: WorkloadSpec, options: RunOptions) -> Prepared:
    """Everything a run checks before it sends or writes anything (see the module
    docstring)."""
    work = plan_work(spec, options.seed)
    if options.shard is not None:
        work = split_work(work, options.shard)
    if not work.plans:
        raise ConfigError(
            spec.source, "classes", "plans no requests", "raise requests or duration_s"
        )
    if options.start_at_unix_ns is not None:
        check_start_at(options.start_at_unix_ns, time.time_ns())
    adapter, headers, redactor, url = client_setup(spec, options)
    if url is None:
        sim_args_from_mapping(spec.sim, spec.source)
    else:
        options.network.proxy_for(url)  # a proxy variable that names no usable proxy: here
    cache = cache_warmth(spec, options)  # a --nonce outside cold mode is refused here
    check_out_dir(options.out_dir)
    if options.run_id is not None:
        check_run_dir(options.out_dir / options.run_id)
    return Prepared(work=work, adapter=adapter, headers=headers, redactor=redactor, url=url,
                    cache=cache)  # fmt: skip


def check_out_dir(out_dir: Path) -> None:
    """The results store can take a new run folder: it, or the nearest folder above it that
    exists, is a folder this user may write into, on a file system mounted writable. Checked
    without writing anything (`--dry-run` writes nothing), so what only a write can tell (a
    full disk, a quota) is still the run's to find."""
    existing = out_dir
    try:
        while not existing.exists() and existing.parent != existing:
            existing = existing.parent
    except OSError as exc:  # a name longer than the file system takes, a loop of links
        raise OptionError("--out", f"cannot use {str(out_dir)[:120]!r} as a results folder: "
                          f"{exc.strerror or exc}", "give --out a shorter, plain folder path",
                          ) from None  # fmt: skip
    if not existing.is_dir():
        problem = f"{existing} is not a folder"
    elif not os.access(existing, os.W_OK | os.X_OK):
        problem = f"this user may not write into {existing}"
    elif hasattr(os, "statvfs") and os.statvfs(existing).f_flag & os.ST_RDONLY:
        problem = f"{existing} is on a read-only file system"
    else:
        return
    raise OptionError("--out", f"cannot create the run folder under {out_dir}: {problem}",
                      "give --out a folder this user may write into")  # fmt: skip


def check_run_dir(run_dir: Path) -> None:
    """A run folder is never overwritten."""
    if run_dir.exists():
        raise OptionError(
            "--run-id",
            f"{run_dir} already exists",
            "runs are never overwritten: choose another --run-id",
        )


def cache_warmth(spec: WorkloadSpec, options: RunOptions) -> CacheWarmth:
    """The run's cache mode and, when cold, its nonce: `--nonce`, else (shards of one run
    must share it) derived from the agreed start and the seed, else random."""
    if spec.cache != "cold":
        if options.nonce is not None:
            raise OptionError("--nonce", f"applies to cache: cold, not "
                              f"{spec.cache} (which sends the same bytes every run)",
                              "drop --nonce, or add --cache cold")  # fmt: skip
        return CacheWarmth(mode=spec.cache)
    nonce = options.nonce
    if nonce is None and options.start_at_unix_ns is not None:
        seed = spec.seed if options.seed is None else options.seed
        agreed = f"{options.start_at_unix_ns}:{seed}:{spec.name}".encode()
        nonce = hashlib.sha256(agreed).hexdigest()[:NONCE_HEX]
    nonce = nonce or secrets.token_hex(NONCE_HEX // 2)
    return CacheWarmth(mode="cold", nonce=nonce, nonce_words=nonce_words(nonce))
