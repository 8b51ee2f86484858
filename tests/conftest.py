"""Suite-wide checks: no shared-memory segment of the project, and no Stable-Baselines3 log
folder, may outlive the test run.

The checks run once, in the process that owns the whole run: the only process without
pytest-xdist, the controller with it (its workers' segments are all gone by then).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator

import pytest

SHM_DIR = "/dev/shm"
PREFIX = "transport-"
_BEFORE = pytest.StashKey[set[str]]()
_SB3_BEFORE = pytest.StashKey[set[str]]()
_SB3_OWN = pytest.StashKey[str]()
SB3_PREFIX = "SB3-"
"""Stable-Baselines3's default log folder, ``<tempdir>/SB3-<date and time>``: every ``learn()``
without a logger of its own makes one (empty) and leaves it, unless $SB3_LOGDIR names another."""
CPU_REPORT = os.environ.get("TRANSPORT_TEST_CPU_REPORT", "")
"""A file to append per-test-file CPU seconds to (this process and its reaped children: the
servers a test started), and to print the costliest files from: where the suite's time goes
on a 2-core CI machine. Unset: nothing is measured."""
_cpu_by_file: defaultdict[str, float] = defaultdict(float)


def _segments() -> set[str]:
    try:
        return {name for name in os.listdir(SHM_DIR) if name.startswith(PREFIX)}
    except FileNotFoundError:
        return set()


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if not CPU_REPORT:
        return (yield)
    before = _cpu_seconds()
    try:
        return (yield)
    finally:  # module-scoped servers stop in their file's last test: counted with the file
        _cpu_by_file[item.location[0]] += _cpu_seconds() - before


def _report_cpu(config: pytest.Config) -> None:
    if not CPU_REPORT:
        return
    with open(CPU_REPORT, "a") as out:
        for name, seconds in _cpu_by_file.items():
            out.write(json.dumps({"file": name, "cpu_s": round(seconds, 2)}) + "\n")
    if _is_xdist_worker(config):
        return
    totals: defaultdict[str, float] = defaultdict(float)
    with open(CPU_REPORT) as lines:
        for line in lines:
            row = json.loads(line)
            totals[row["file"]] += row["cpu_s"]
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("-", f"CPU seconds per test file ({CPU_REPORT}), costliest first")
        for name, seconds in sorted(totals.items(), key=lambda kv: -kv[1])[:25]:
            reporter.write_line(f"  {seconds:8.1f}  {name}")


def _sb3_folders() -> set[str]:
    directory = tempfile.gettempdir()
    return {name for name in os.listdir(directory) if name.startswith(SB3_PREFIX)}


def pytest_configure(config: pytest.Config) -> None:
    """Point $SB3_LOGDIR at a folder of this run (inherited by xdist workers and by every
    process a test starts: examples, docs blocks), removed when the run ends."""
    if os.environ.get("SB3_LOGDIR"):
        return
    folder = tempfile.mkdtemp(prefix="transport-tests-sb3-")
    os.environ["SB3_LOGDIR"] = folder
    config.stash[_SB3_OWN] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_SB3_OWN, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        if os.environ.get("SB3_LOGDIR") == folder:
            del os.environ["SB3_LOGDIR"]


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _is_xdist_worker(session.config):
        session.config.stash[_BEFORE] = _segments()
        session.config.stash[_SB3_BEFORE] = _sb3_folders()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if /dev/shm/transport-* segments created during it remain at the end."""
    config = session.config
    _report_cpu(config)
    if _is_xdist_worker(config) or _BEFORE not in config.stash:
        return
    _check_sb3_folders(session)
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


def _check_sb3_folders(session: pytest.Session) -> None:
    """Fail the run if a test (or a process it started) left a <tempdir>/SB3-* log folder: a
    trainer that ran without $SB3_LOGDIR (an environment built from scratch for a subprocess)."""
    config = session.config
    before: set[str] = config.stash[_SB3_BEFORE]
    left = sorted(_sb3_folders() - before)
    if not left:
        return
    text = f"Stable-Baselines3 log folders left in {tempfile.gettempdir()}: " + ", ".join(left)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(text, red=True)
    else:
        print(text)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
