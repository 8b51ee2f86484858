"""The cffi module: futex wait/wake across processes, liveness, atomics and the C floor."""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

from transport import native


def shared(size: int = 4096) -> mmap.mmap:
    return mmap.mmap(-1, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


def fork(child: object) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child process
        code = 1
        try:
            code = int(child())  # type: ignore[operator]
        finally:
            os._exit(code)
    return pid


def wait_child(pid: int, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("child did not finish")


def test_futex_wait_times_out_and_returns_on_changed_word() -> None:
    region = shared()
    word = native.word(region, 0)
    started = time.monotonic()
    assert native.futex_wait(word, 0, 0.05) == native.TIMEOUT
    assert time.monotonic() - started >= 0.04
    assert native.futex_wait(word, 7, 1.0) == native.OK  # the word is not 7: returns at once


def test_futex_wake_reaches_another_process() -> None:
    region = shared()
    word = native.word(region, 64)

    def child() -> int:
        ctx = native.new_ctx()
        ctx.spin = 0
        ctx.slice_ns = 10_000_000
        return 0 if native.wait_value(ctx, word, 5, 10.0) == native.OK else 3

    pid = fork(child)
    time.sleep(0.1)  # the child is asleep in FUTEX_WAIT by now
    native.publish(word, 5)
    assert wait_child(pid) == 0
    assert native.load_acquire(word) & native.SEQ_MASK == 5


def test_wait_reports_a_dead_peer_in_bounded_time() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    region = shared()
    ctx = native.new_ctx()
    ctx.spin = 1000
    ctx.slice_ns = 20_000_000
    ctx.peer_pid = proc.pid
    ctx.peer_start = native.proc_start_time(proc.pid)
    assert ctx.peer_start > 0
    threading.Timer(0.2, proc.kill).start()
    started = time.monotonic()
    rc = native.wait_value(ctx, native.word(region, 0), 1, 10.0)
    assert rc == native.PEER_DEAD  # a zombie (not yet reaped) counts as dead
    assert time.monotonic() - started < 1.0
    proc.wait()


def test_wait_returns_closed_when_the_state_word_changes() -> None:
    region = shared()
    ctx = native.new_ctx()
    ctx.spin = 0
    ctx.slice_ns = 10_000_000
    ctx.state = native.word(region, 128)
    native.store_release(ctx.state, 1)
    ctx.ready_state = 1

    def close() -> None:
        native.store_release(ctx.state, 2)
        native.futex_wake(native.word(region, 0))

    threading.Timer(0.1, close).start()
    assert native.wait_value(ctx, native.word(region, 0), 1, 5.0) == native.CLOSED


def test_liveness_uses_start_time() -> None:
    me = os.getpid()
    start = native.proc_start_time(me)
    assert start > 0 and native.peer_alive(me, start) and native.peer_alive(me)
    assert not native.peer_alive(me, start + 1)  # same pid, another process (pid reuse)
    assert not native.peer_alive(0)


def test_atomics() -> None:
    region = shared()
    word = native.word(region, 4)
    assert native.compare_exchange(word, 0, 9)
    assert not native.compare_exchange(word, 0, 10)
    native.store_release(word, native.SLEEP_BIT | 3)
    assert native.publish(word, 4) is True  # a sleeper announced itself: woken
    assert native.publish(word, 5) is False
    assert native.load_acquire(word) == 5


def test_shm_segment_create_is_0600_exclusive_and_unlinkable() -> None:
    name = f"/transport-test-native-{uuid.uuid4().hex[:8]}"
    fd = native.shm_create(name, 8192)
    try:
        st = os.fstat(fd)
        assert st.st_size == 8192 and st.st_mode & 0o777 == 0o600
        with pytest.raises(FileExistsError):
            native.shm_create(name, 8192)
    finally:
        os.close(fd)
        native.shm_unlink(name)
    with pytest.raises(FileNotFoundError):
        native.shm_open(name)


@pytest.mark.parametrize("mode", ["spin", "futex", "balanced"])
def test_floor_pingpong_between_two_processes(mode: str) -> None:
    region = shared(native.FLOOR_REGION_SIZE)
    iterations = 2000
    pid = fork(lambda: native.floor_pingpong(region, 1, iterations, mode, timeout=10.0) + 10)
    out = np.zeros(iterations, dtype=np.int64)
    assert native.floor_pingpong(region, 0, iterations, mode, out, timeout=10.0) == native.OK
    assert wait_child(pid) == 10
    assert (out > 0).all()
    assert np.median(out) < 5_000_000  # a round trip, not a timeout


def test_floor_pingpong_times_out_without_a_peer() -> None:
    region = shared(native.FLOOR_REGION_SIZE)
    started = time.monotonic()
    assert native.floor_pingpong(region, 0, 10, "balanced", timeout=0.2) == native.TIMEOUT
    assert time.monotonic() - started < 2.0
