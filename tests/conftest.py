"""Suite-wide checks: no shared-memory segment of the project may outlive the test run."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

SHM_DIR = "/dev/shm"
PREFIX = "transport-"


def _segments() -> set[str]:
    try:
        return {name for name in os.listdir(SHM_DIR) if name.startswith(PREFIX)}
    except FileNotFoundError:
        return set()


@pytest.fixture(scope="session", autouse=True)
def no_leaked_shm_segments() -> Iterator[None]:
    """Fail the run if /dev/shm/transport-* segments created during it remain at the end."""
    before = _segments()
    yield
    leaked = sorted(_segments() - before)
    deadline = time.monotonic() + 3.0  # another run on the machine may be mid-test: its
    while leaked and time.monotonic() < deadline:  # segments go away; a leak of ours stays
        time.sleep(0.1)
        leaked = sorted(_segments() - before)
    if leaked:
        pytest.fail(
            "shared-memory segments left in /dev/shm after the test run: " + ", ".join(leaked),
            pytrace=False,
        )
