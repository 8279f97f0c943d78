"""loadgen leaves nothing in the user's home folder: matplotlib's font cache goes to a
folder of the user's under the temp folder (Ray's token: tests/run/test_ray.py)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from loadgen.cli import MPLCONFIGDIR, matplotlib_home
from loadgen.testing import builders
from loadgen.workload.spec import SloTargets


def test_matplotlib_gets_an_owner_only_folder_under_the_temp_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without MPLCONFIGDIR: `loadgen-matplotlib-UID` under the temp folder, owner-only, named
    in MPLCONFIGDIR for matplotlib (and every process loadgen starts) to find."""
    monkeypatch.delenv(MPLCONFIGDIR, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = matplotlib_home()
    assert folder == tmp_path / f"loadgen-matplotlib-{os.getuid()}"
    assert os.environ[MPLCONFIGDIR] == str(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert matplotlib_home() is None  # MPLCONFIGDIR set (as a user may): left as it is


def test_a_folder_others_may_write_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `loadgen-matplotlib-UID` open to others (made by someone else, or loosened) is
    passed over for a fresh folder of this process's."""
    monkeypatch.delenv(MPLCONFIGDIR, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    shared = tmp_path / f"loadgen-matplotlib-{os.getuid()}"
    shared.mkdir()
    shared.chmod(0o777)
    folder = matplotlib_home()
    assert folder is not None
    assert folder != shared
    assert folder.parent == tmp_path
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


@pytest.mark.slow  # ~4 s on 2 cores (a report in a subprocess): left to .ci/run's second part
def test_a_report_leaves_the_home_folder_empty(tmp_path: Path) -> None:
    """`loadgen report RUN` draws its plots with HOME an empty folder and no MPLCONFIGDIR:
    the home folder stays empty (matplotlib wrote ~/.cache/matplotlib/fontlist-*.json)."""
    records = [builders.streamed_record(i, intended_ms=i * 100.0) for i in range(20)]
    run = builders.write_run(tmp_path / "store", datetime(2026, 3, 1, 2, tzinfo=UTC), records,
                             slos=SloTargets(ttft_ms=500, percentile=90))  # fmt: skip
    home, temp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in (MPLCONFIGDIR, "XDG_CACHE_HOME")}
    done = subprocess.run(
        [sys.executable, "-m", "loadgen", "report", str(run)], capture_output=True, text=True,
        env={**env, "HOME": str(home), "TMPDIR": str(temp)}, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (run / "report" / "report.html").exists()
    assert list(home.rglob("*")) == []
    assert list(temp.glob("loadgen-matplotlib-*/fontlist-*.json"))
