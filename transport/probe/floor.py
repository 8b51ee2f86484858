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
of sleeping, which is what a blocking transport pays).

The socket floors (``c-floor-unix``, ``c-floor-tcp``) send the same bytes as a row (request and
response, frame headers included) over a connected Unix or loopback TCP stream socket between
the two processes, in C (``transport.native.floor_socket``), with no protocol at all. The
shared-memory floor of a batch (``c-floor-shm``) moves a row's bytes through a shared mapping
(``transport.native.floor_shm``): the client side copies the request in, the server side
copies the response in (as an env writes its slot), each hand-off a spin-waited word.

``ratio_to_floor`` of a row is its p50 over the p50 of the floor that applies to it
(``FLOOR_OF_SCHEME``): for shm the shared-memory floor of its bytes (a region waited on by
spinning first; ``c-floor-spin``, 4 bytes, where that floor is missing), the Unix socket floor
of the same bytes for unix and zmq+ipc, the TCP floor of the same bytes for http and zmq+tcp;
the futex floor (``REFERENCE``) for anything else. No transport can beat its floor, so no ratio
is below 1 but for noise.
"""

from __future__ import annotations

import mmap
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from transport.probe.histogram import LogHistogram

MODES = ("spin", "futex")
SOCKET_KINDS = ("unix", "tcp")
BYTE_FLOOR_KINDS = (*SOCKET_KINDS, "shm")
"""The floors measured per point with the row's bytes: the socket floors and the shm floor."""
REFERENCE = "c-floor-futex"
FLOOR_OF_SCHEME = {
    "shm": "c-floor-shm",
    "unix": "c-floor-unix",
    "zmq+ipc": "c-floor-unix",
    "http": "c-floor-tcp",
    "zmq+tcp": "c-floor-tcp",
}
"""The floor each backend's rows are compared with (others: ``REFERENCE``)."""


@dataclass
class FloorResult:
    mode: str  # "spin" | "futex" | "unix" | "tcp"
    hist: LogHistogram
    elapsed_ns: int
    request_bytes: int = 4
    response_bytes: int = 4

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

    def round_trips(region: mmap.mmap, role: int, total: int, out: Any) -> int:
        return int(nat.floor_pingpong(region, role, total, mode, out, timeout=timeout))

    hist, elapsed = _over_shared_memory(
        nat, nat.FLOOR_REGION_SIZE, round_trips, count, warmup, f"the {mode} floor"
    )
    return FloorResult(mode, hist, elapsed)


def _over_shared_memory(
    nat: ModuleType,
    size: int,
    round_trips: Callable[[mmap.mmap, int, int, Any], int],
    count: int,
    warmup: int,
    what: str,
) -> tuple[LogHistogram, int]:
    """Run ``round_trips(region, role, total, out_ns)`` in this process (role 0, recording) and
    in a forked child (role 1) over an anonymous shared mapping of ``size`` bytes (nothing named
    in /dev/shm); the last ``count`` of ``warmup + count`` round trips as a histogram, and the
    nanoseconds they took. Raises ``RuntimeError`` when either side failed."""
    total = warmup + count
    region = mmap.mmap(-1, max(size, mmap.PAGESIZE))  # MAP_SHARED | ANONYMOUS
    out = np.zeros(total, dtype=np.int64)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child process
        code = 1
        try:
            code = 0 if round_trips(region, 1, total, None) == nat.OK else 1
        finally:
            os._exit(code)
    try:
        started = _now()
        rc = round_trips(region, 0, total, out)
        elapsed = _now() - started
    finally:
        _, status = os.waitpid(pid, 0)
        region.close()
    if rc != nat.OK:
        raise RuntimeError(f"{what} failed (rc {rc}: the peer stopped)")
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{what}'s child exited with status {status}")
    hist = LogHistogram()
    hist.record_many(out[warmup:])
    measured = int(out[warmup:].sum())
    return hist, measured if measured > 0 else elapsed


def _connected_pair(kind: str) -> tuple[socket.socket, socket.socket]:
    """Two ends of a stream connection: a Unix socket pair, or loopback TCP (TCP_NODELAY)."""
    if kind == "unix":
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    for end in (client, server):
        end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client, server


def measure_socket_floor(
    kind: str,
    request_bytes: int,
    response_bytes: int,
    count: int,
    warmup: int,
    *,
    timeout: float = 10.0,
) -> FloorResult:
    """``warmup + count`` round trips of ``request_bytes`` out, ``response_bytes`` back over a
    ``kind`` ("unix" or "tcp") stream socket to a forked child; the last ``count`` recorded."""
    if kind not in SOCKET_KINDS:
        raise ValueError(f"kind must be one of {', '.join(SOCKET_KINDS)}")
    nat = _load()
    if not hasattr(nat, "floor_socket"):
        raise FloorUnavailable("transport.native has no floor_socket (rebuild: ./dev setup)")
    total = warmup + count
    out = np.zeros(total, dtype=np.int64)
    mine, theirs = _connected_pair(kind)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child process
        code = 1
        try:
            mine.close()
            rc = nat.floor_socket(
                theirs.fileno(), 1, total, request_bytes, response_bytes, timeout=timeout
            )
            code = 0 if rc == nat.OK else 1
        finally:
            os._exit(code)
    theirs.close()
    try:
        started = _now()
        rc = nat.floor_socket(
            mine.fileno(), 0, total, request_bytes, response_bytes, out, timeout=timeout
        )
        elapsed = _now() - started
    finally:
        mine.close()
        _, status = os.waitpid(pid, 0)
    if rc != nat.OK:
        raise RuntimeError(f"the {kind} socket floor failed (rc {rc}: the peer stopped)")
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"the {kind} socket floor's child exited with status {status}")
    hist = LogHistogram()
    hist.record_many(out[warmup:])
    measured = int(out[warmup:].sum())
    return FloorResult(
        kind, hist, measured if measured > 0 else elapsed, request_bytes, response_bytes
    )


def measure_shm_floor(
    request_bytes: int,
    response_bytes: int,
    count: int,
    warmup: int,
    *,
    timeout: float = 10.0,
) -> FloorResult:
    """``warmup + count`` round trips moving ``request_bytes`` in and ``response_bytes`` back
    through an anonymous shared mapping with a forked child (``transport.native.floor_shm``,
    spin waits); the last ``count`` recorded. Nothing is named in /dev/shm."""
    nat = _load()
    if not hasattr(nat, "floor_shm"):
        raise FloorUnavailable("transport.native has no floor_shm (rebuild: ./dev setup)")

    def round_trips(region: mmap.mmap, role: int, total: int, out: Any) -> int:
        rc = nat.floor_shm(region, role, total, request_bytes, response_bytes, out, timeout=timeout)
        return int(rc)

    size = nat.floor_shm_size(request_bytes, response_bytes)
    hist, elapsed = _over_shared_memory(nat, size, round_trips, count, warmup, "the shm floor")
    return FloorResult("shm", hist, elapsed, request_bytes, response_bytes)


def _now() -> int:
    return time.perf_counter_ns()
