"""Suite-wide checks: no shared-memory segment of the project may outlive the test run.

The check runs once, in the process that owns the whole run: the only process without
pytest-xdist, the controller with it (its workers' segments are all gone by then).
"""

from __future__ import annotations

import os
import time

import pytest

SHM_DIR = "/dev/shm"
PREFIX = "transport-"
_BEFORE = pytest.StashKey[set[str]]()


def _segments() -> set[str]:
    try:
        return {name for name in os.listdir(SHM_DIR) if name.startswith(PREFIX)}
    except FileNotFoundError:
        return set()


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _is_xdist_worker(session.config):
        session.config.stash[_BEFORE] = _segments()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if /dev/shm/transport-* segments created during it remain at the end."""
    config = session.config
    if _is_xdist_worker(config) or _BEFORE not in config.stash:
        return
    before = config.stash[_BEFORE]
    leaked = sorted(_segments() - before)
    deadline = time.monotonic() + 3.0  # another run on the machine may be mid-test: its
    while leaked and time.monotonic() < deadline:  # segments go away; a leak of ours stays
        time.sleep(0.1)
        leaked = sorted(_segments() - before)
    if leaked:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        text = "shared-memory segments left in /dev/shm after the test run: " + ", ".join(leaked)
        if reporter is not None:
            reporter.write_line(text, red=True)
        else:
            print(text)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
