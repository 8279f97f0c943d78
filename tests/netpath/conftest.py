"""Fixtures for the network-path tests: the simulator as an upstream, a test CA, and the
real parts (nginx, tinyproxy) from `loadgen.testing.netpath`.

A part that is not installed skips its test with the reason locally and fails it under CI
(`CI` set, as `.ci/run` sets it), where skipping would hide a broken setup
(`scripts/realserver/setup.sh netpath` installs them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from loadgen.testing import netpath

SETUP = "scripts/realserver/setup.sh netpath"


def _need(binary: str) -> str:
    path = netpath.find(binary)
    if path is not None:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{binary} is not installed; CI is set, so it must be ({SETUP})", pytrace=False)
    pytest.skip(f"{binary} is not installed (run {SETUP}, or deselect with -m 'not realserver')")


@pytest.fixture
def need_nginx() -> str:
    """nginx's path; the test skips (fails under CI) without it."""
    return _need("nginx")


@pytest.fixture
def need_tinyproxy() -> str:
    """tinyproxy's path; the test skips (fails under CI) without it."""
    return _need("tinyproxy")


@pytest.fixture(scope="module")
def sim_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One simulator (ten times real time) for the module's tests: its base URL."""
    with netpath.simulator(tmp_path_factory.mktemp("sim")) as sim:
        yield sim.url


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> netpath.TestCA:
    """A certificate authority of the module's own (trustme)."""
    return netpath.TestCA(tmp_path_factory.mktemp("ca"))
