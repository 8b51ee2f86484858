"""Issue 22 item 4: an shm:// server whose region another process changes notices it within a
second, says so in one line, and either repairs what it owns or stops (exit 1, segment gone).

Real ``transport-serve shm://NAME --env echo`` processes (Python and Node); this test process
is the "other process": it writes words into /dev/shm/transport-NAME with pwrite (no mapping
kept) or truncates it. Before the fix: the Node server exited 0 silently on a flipped state
word and left its segment; a truncated idle region, a scribbled control block or a foreign
``client_pid`` left both servers alive but refusing every new client forever.
"""

from __future__ import annotations

import mmap
import os
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import transport.api as api
from transport import native
from transport.backends.shm.region import CB, RegionState, parse_url
from transport.errors import TransportError

from .servers import LANGS, ServerProcess

NOTICE_S = 15.0  # "within a second", with room for a loaded 2-core machine


def _unique_url() -> str:
    return f"shm://test-loss-{os.getpid()}-{uuid.uuid4().hex[:10]}"


def _unlink(url: str) -> None:
    try:
        native.shm_unlink(parse_url(url).segment)
    except FileNotFoundError:
        pass


@pytest.fixture(params=LANGS)
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    url = _unique_url()
    proc = ServerProcess(url, lang=request.param)
    try:
        yield proc
    finally:
        proc.kill()
        _unlink(url)
    assert not os.path.exists(parse_url(url).path)


def _path(server: ServerProcess) -> str:
    return parse_url(server.url).path


def _write_field(path: str, field: str, value: int) -> None:
    """Another process writes one control-block field (pwrite: no mapping kept)."""
    f = CB[field]
    fmt = {4: "<I", 8: "<Q"}[f.size]
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, struct.pack(fmt, value), f.offset)
    finally:
        os.close(fd)


def _read_field(path: str, field: str) -> int:
    f = CB[field]
    fmt = {4: "<I", 8: "<Q"}[f.size]
    fd = os.open(path, os.O_RDONLY)
    try:
        return int(struct.unpack(fmt, os.pread(fd, f.size, f.offset))[0])
    finally:
        os.close(fd)


def _truncate(path: str, size: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def _stopped(server: ServerProcess) -> tuple[int, str]:
    """The exit status and stderr of a server that must stop by itself within NOTICE_S."""
    try:
        rc = server.proc.wait(NOTICE_S)
    except subprocess.TimeoutExpired:
        pytest.fail("the server lost its region but its process stays alive")
    assert server.proc.stderr is not None
    return rc, server.proc.stderr.read()


def _stderr_after_stop(server: ServerProcess) -> str:
    """SIGTERM the server (it still serves: exit 0) and return what it wrote on stderr."""
    assert server.terminate() == 0
    assert server.proc.stderr is not None
    return server.proc.stderr.read()


def _first_obs(result: Any) -> float:
    """observation[0] of the echo env's one result: the action it was given."""
    return float(np.asarray(result.observation).reshape(-1)[0])


def _connects(url: str) -> None:
    """A new client attaches, takes the lease and steps (retried: the server repairs within a
    second of noticing); fails if it still cannot after NOTICE_S."""
    deadline = time.monotonic() + NOTICE_S
    while True:
        try:
            with api.connect(url, timeout=2) as client:
                client.reset(seed=1)
                assert _first_obs(client.step(3)) == 3.0
                return
        except TransportError as exc:
            if time.monotonic() > deadline:
                pytest.fail(f"no new client could attach after the repair: {exc}")
            time.sleep(0.05)


# -- the state word: both servers stop (exit 1, one line, segment gone) ----------------------


def test_a_flipped_state_word_stops_the_server_with_exit_1(server: ServerProcess) -> None:
    path = _path(server)
    _write_field(path, "state", RegionState.CLOSED)
    rc, err = _stopped(server)
    assert rc == 1, err
    assert "state word was set to 2 (CLOSED) by another process" in err, err
    assert "transport-serve: error:" in err, err
    assert not os.path.exists(path), "the server removes the region it stopped serving"


# -- size: a truncated (or grown) idle region stops the server before anything faults --------


@pytest.mark.parametrize("size", [4096, 65536])
def test_a_truncated_idle_region_stops_the_server(server: ServerProcess, size: int) -> None:
    path = _path(server)
    expected = os.stat(path).st_size
    _truncate(path, size)
    rc, err = _stopped(server)
    assert rc == 1, err
    word = "truncated" if size < expected else "resized"
    assert f"another process {word} {path} (now {size} bytes, was {expected})" in err, err
    assert "the server stops" in err, err
    assert not os.path.exists(path)


def test_a_removed_region_stops_the_server(server: ServerProcess) -> None:
    path = _path(server)
    native.shm_unlink(parse_url(server.url).segment)
    rc, err = _stopped(server)
    assert rc == 1, err
    assert f"another process removed {path}" in err, err


# -- the control block: the server rewrites the fields it owns --------------------------------


def test_a_scribbled_control_block_is_rewritten(server: ServerProcess) -> None:
    path = _path(server)
    with api.connect(server.url, timeout=5) as client:
        client.reset(seed=1)
        _write_field(path, "magic", 0xDEADBEEF)
        assert _first_obs(client.step(2)) == 2.0  # the session goes on
    _connects(server.url)
    for field, value in (
        ("version", 999),
        ("fingerprint", 0x0123456789ABCDEF),
        ("slot_size", 64),
        ("num_envs", 7),
        ("owner_pid", 0x7FFFFFF0),
    ):
        wrote = _read_field(path, field)
        _write_field(path, field, value)
        _connects(server.url)
        assert _read_field(path, field) == wrote, field
    err = _stderr_after_stop(server)
    for field in ("magic", "version", "fingerprint", "slot_size", "num_envs", "owner_pid"):
        assert f"control block field {field} was changed" in err, (field, err)
    assert "0xDEADBEEF" in err, err


def test_a_scribbled_schema_area_is_rewritten(server: ServerProcess) -> None:
    path = _path(server)
    size = os.stat(path).st_size
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, b"\xff" * 16, size - 16)  # the trailer: no schema any more
    finally:
        os.close(fd)
    _connects(server.url)  # discovers the schema again
    assert "the schema area was changed" in _stderr_after_stop(server)


# -- the lease: a client_pid that is not a client is reclaimed ---------------------------------


@pytest.mark.parametrize("start", ["zero", "its own"])
def test_a_foreign_live_client_pid_is_reclaimed(server: ServerProcess, start: str) -> None:
    """A live process that does not map the region is not a client: its "lease" goes."""
    path = _path(server)
    foreign = subprocess.Popen(["sleep", "120"])
    try:
        start_time = native.proc_start_time(foreign.pid) if start == "its own" else 0
        _write_field(path, "client_start_time", start_time)
        _write_field(path, "client_pid", foreign.pid)
        _connects(server.url)
    finally:
        foreign.kill()
        foreign.wait()
    err = _stderr_after_stop(server)
    assert f"client pid {foreign.pid}" in err and "reclaiming the lease" in err, err


def test_a_lease_never_completed_is_reclaimed(server: ServerProcess) -> None:
    """This process maps the region and writes its own pid with client_start_time 0 (a lease
    taken but never completed): the server reclaims it after a second."""
    path = _path(server)
    with open(path, "r+b") as fh, mmap.mmap(fh.fileno(), 0) as mapped:
        struct.pack_into("<Q", mapped, CB["client_start_time"].offset, 0)
        struct.pack_into("<I", mapped, CB["client_pid"].offset, os.getpid())
        _connects(server.url)  # the same process: the lease is free again once reclaimed
    err = _stderr_after_stop(server)
    assert f"client pid {os.getpid()}" in err and "never completed" in err, err
