"""The C floor: a ping-pong between two processes over shared memory, with no transport at all.

It uses ``transport.native.floor_pingpong`` (the cffi module of ``transport/native/``): two
32-bit words on separate cache lines of an anonymous shared mapping (``mmap(-1, ...)``, so no
/dev/shm name exists and nothing can be left behind), one process per role, created with
``fork`` before any server or thread exists. Role 0 publishes a sequence number in the ping
word and waits for the pong word to match; role 1 answers. Both loops run in C with the GIL
released; role 0 writes each round trip's duration (``clock_gettime(CLOCK_MONOTONIC)``) into an
int64 array that is then recorded into a ``LogHistogram``.

Modes: ``spin`` (busy-wait with a ``sched_yield`` every few thousand spins: the best case when
both processes own a core) and ``futex`` (FUTEX_WAIT / FUTEX_WAKE on every round trip: the cost
of sleeping, which is what a blocking transport pays). ``ratio_to_floor`` of a backend row is
its p50 over the futex floor's p50 (``REFERENCE``).
"""

from __future__ import annotations

import mmap
import os
import time
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from transport.probe.histogram import LogHistogram

MODES = ("spin", "futex")
REFERENCE = "c-floor-futex"


@dataclass
class FloorResult:
    mode: str
    hist: LogHistogram
    elapsed_ns: int

    @property
    def backend(self) -> str:
        return f"c-floor-{self.mode}"


class FloorUnavailable(Exception):
    """The native module (or its floor function) cannot be loaded here: the rows are skipped."""


def native_floor_source() -> str:
    """Where the floor code comes from (recorded in the JSON)."""
    return "transport.native.floor_pingpong (transport/native/tp_native.c: tp_floor_pingpong)"


def _load() -> ModuleType:
    try:
        from transport import native
    except Exception as exc:  # ImportError, or a compile error of an in-place build
        raise FloorUnavailable(f"transport.native does not load: {exc}") from exc
    if not hasattr(native, "floor_pingpong"):
        raise FloorUnavailable("transport.native has no floor_pingpong")
    return native


def measure_floor(mode: str, count: int, warmup: int, *, timeout: float = 10.0) -> FloorResult:
    """``warmup + count`` round trips between this process and a forked child; the last
    ``count`` are recorded. Raises ``FloorUnavailable`` or ``RuntimeError``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}")
    nat = _load()
    total = warmup + count
    region = mmap.mmap(-1, max(nat.FLOOR_REGION_SIZE, mmap.PAGESIZE))  # MAP_SHARED | ANONYMOUS
    out = np.zeros(total, dtype=np.int64)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child process
        code = 1
        try:
            rc = nat.floor_pingpong(region, 1, total, mode, timeout=timeout)
            code = 0 if rc == nat.OK else 1
        finally:
            os._exit(code)
    try:
        started = _now()
        rc = nat.floor_pingpong(region, 0, total, mode, out, timeout=timeout)
        elapsed = _now() - started
    finally:
        _, status = os.waitpid(pid, 0)
        region.close()
    if rc != nat.OK:
        raise RuntimeError(f"the {mode} floor ping-pong failed (rc {rc}: the peer stopped)")
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"the {mode} floor's child exited with status {status}")
    hist = LogHistogram()
    hist.record_many(out[warmup:])
    measured = int(out[warmup:].sum())
    return FloorResult(mode, hist, measured if measured > 0 else elapsed)


def _now() -> int:
    return time.perf_counter_ns()
