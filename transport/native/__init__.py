"""Typed wrapper of the cffi module ``transport.native._native`` (futex, atomics, liveness, floor).

The module is compiled by ``pip install`` (setup.py's ``cffi_modules``). In a source checkout
without it, the first import compiles it in place (gcc and the Python headers needed) so that
``python -m pytest`` works right after ``git clone``.

Every call releases the GIL while it runs (cffi API mode), so a thread that waits here never
blocks the other Python threads, and no wait spins in Python bytecode.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
import numpy.typing as npt

from transport.errors import TransportError


def _load() -> tuple[Any, Any]:
    try:
        from transport.native._native import ffi, lib  # type: ignore[import-not-found]
    except ImportError:
        try:
            from transport.native.build import build_in_place

            build_in_place()
            from transport.native._native import ffi, lib
        except Exception as exc:  # pragma: no cover - depends on the machine
            raise ImportError(
                "transport.native._native is not built and cannot be compiled here "
                f"({exc}); run `pip install -e .` on a machine with gcc and Python headers"
            ) from exc
    if not hasattr(lib, "tp_strided_any"):  # the newest function: a build older than the C source
        raise ImportError(
            "transport.native._native was built from an older tp_native.c (it lacks "
            "tp_strided_any): rebuild it with `pip install -e .` (or ./dev setup)"
        )
    return ffi, lib


ffi, lib = _load()

OK: int = lib.TP_OK
TIMEOUT: int = lib.TP_TIMEOUT
PEER_DEAD: int = lib.TP_PEER_DEAD
CLOSED: int = lib.TP_CLOSED
ERRNO: int = lib.TP_ERRNO
SLEEP_BIT = 0x80000000
SEQ_MASK = 0x7FFFFFFF

MODES = {"spin": lib.TP_MODE_SPIN, "futex": lib.TP_MODE_FUTEX, "balanced": lib.TP_MODE_BALANCED}


class NativeError(TransportError):
    """A system call of the native module failed."""


def address(buffer: Any, offset: int = 0) -> Any:
    """A ``char *`` to ``buffer[offset]`` (a writable buffer: mmap, bytearray, ndarray)."""
    return ffi.cast("char *", ffi.from_buffer(buffer, require_writable=True)) + offset


def word(buffer: Any, offset: int) -> Any:
    """A ``uint32_t *`` to the 4-byte-aligned word at ``buffer[offset]``."""
    if offset % 4:
        raise ValueError(f"offset {offset} is not 4-byte aligned")
    return ffi.cast("uint32_t *", address(buffer, offset))


def load_acquire(ptr: Any) -> int:
    return int(lib.tp_load_acquire(ptr))


def store_release(ptr: Any, value: int) -> None:
    lib.tp_store_release(ptr, value)


def compare_exchange(ptr: Any, expected: int, desired: int) -> bool:
    return bool(lib.tp_cas(ptr, expected, desired))


def futex_wait(ptr: Any, expected: int, timeout: float | None) -> int:
    """FUTEX_WAIT (shared): OK when woken or the word differs from ``expected``, else TIMEOUT."""
    ns = -1 if timeout is None else max(0, int(timeout * 1e9))
    rc = int(lib.tp_futex_wait(ptr, expected, ns))
    if rc == ERRNO:
        raise NativeError(f"futex wait failed: {os.strerror(ffi.errno)}")
    return rc


def futex_wake(ptr: Any, count: int = 0x7FFFFFFF) -> int:
    """FUTEX_WAKE (shared): the number of waiters woken."""
    rc = int(lib.tp_futex_wake(ptr, count))
    if rc == ERRNO:
        raise NativeError(f"futex wake failed: {os.strerror(ffi.errno)}")
    return rc


def publish(ptr: Any, value: int) -> bool:
    """Store ``value`` (release) and wake the word's sleepers; True if a sleeper was woken."""
    return bool(lib.tp_publish_word(ptr, value))


def proc_start_time(pid: int) -> int:
    """/proc/<pid>/stat starttime (clock ticks since boot); 0 if gone or a zombie."""
    return int(lib.tp_proc_start_time(pid))


def peer_alive(pid: int, start_time: int = 0) -> bool:
    """pid runs (not a zombie) and, if ``start_time`` is not 0, is the process that started then."""
    return bool(lib.tp_peer_alive(pid, start_time))


def new_ctx() -> Any:
    """A zeroed ``tp_ctx *`` (owned by the returned cdata)."""
    return ffi.new("tp_ctx *")


def wait_value(ctx: Any, ptr: Any, target: int, timeout: float | None) -> int:
    """Wait (ctx's policy and peer) until the word's sequence equals ``target``."""
    ns = -1 if timeout is None else int(timeout * 1e9)
    return int(lib.tp_wait_value(ctx, ptr, target, ns))


def guard(mapping: Any) -> int:
    """Guard a shared mapping against truncation by another process: a SIGBUS inside it puts
    private zero pages in its place (the region then reads closed) instead of killing the
    process. The handle, or -1 when no guard entry is free (the mapping stays unguarded)."""
    view = memoryview(mapping)
    return int(lib.tp_guard_add(address(mapping), view.nbytes))


def unguard(handle: int) -> None:
    """Stop guarding (the mapping is unmapped or about to be)."""
    lib.tp_guard_remove(handle)


def guard_lost(handle: int) -> bool:
    """True once a truncation replaced the guarded mapping with private zero pages."""
    return bool(lib.tp_guard_lost(handle))


class _Unmap:
    """The destructor of a ``SharedMapping``'s owner (the last view of it is gone): unguard,
    then munmap. It holds nothing but the size and the guard handle (no cycle, no view)."""

    __slots__ = ("_munmap", "_unguard", "guard", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.guard = -1
        self._unguard = lib.tp_guard_remove  # held: this may run late in interpreter shutdown
        self._munmap = lib.tp_unmap

    def __call__(self, base: Any) -> None:
        if self.guard >= 0:
            self._unguard(self.guard)
            self.guard = -1
        self._munmap(base, self.size)


class SharedMapping:
    """``size`` bytes of ``fd`` mapped shared (read-write) and guarded against truncation.

    ``buffer`` is the writable buffer every view is made of (``np.ndarray(buffer=...)``,
    ``memoryview``): each view holds it, it holds the mapping's owner, and the owner unmaps when
    it dies, so the memory lives exactly as long as the last view of it (docs/shm.md,
    "Lifetimes"). ``close()`` ends this process's use of the segment at once: without views
    left it unmaps; with views left it replaces the shared pages by a private copy of their
    contents (``tp_privatize``), which the views keep until they die.
    """

    def __init__(self, fd: int, size: int) -> None:
        base = lib.tp_map_shared(fd, size)
        if base == ffi.NULL:
            err = ffi.errno
            raise OSError(err, f"mmap of {size} bytes: {os.strerror(err)}")
        self.size = size
        self._unmap = _Unmap(size)
        self._owner: Any = ffi.gc(base, self._unmap, size=size)
        self.buffer: Any = ffi.buffer(self._owner, size)
        self.guard = guard(self.buffer)
        self._unmap.guard = self.guard
        # the count that means "no view": measured now, when only this object holds the buffer,
        # with the expression close() uses (so how the interpreter counts cancels out)
        self._alone = sys.getrefcount(self.buffer)

    @property
    def closed(self) -> bool:
        return self.buffer is None

    def close(self) -> bool:
        """Unmap now (True) when no view of the mapping is left, else privatize it for the
        views (False). Either way this process no longer reads or writes the segment."""
        if self.buffer is None:
            return True
        # any reference beyond this object's is a view (NumPy arrays, memoryviews and
        # ffi.from_buffer objects all hold the buffer they view)
        alone = sys.getrefcount(self.buffer) <= self._alone
        self.buffer = None
        owner, self._owner = self._owner, None  # from now on only the views hold the owner
        if alone:
            ffi.release(owner)  # the destructor runs now: unguard, munmap
            return True
        rc = int(lib.tp_privatize(owner, self.size))
        if rc == 0:  # private pages now: nothing of the segment is left to guard
            lib.tp_guard_remove(self._unmap.guard)
            self._unmap.guard = -1
        # rc < 0 (no memory for the copy): the shared mapping stays, guarded, for the views
        return False


def shm_create(name: str, size: int) -> int:
    """shm_open(O_CREAT | O_EXCL, 0600) + posix_fallocate; the fd, or raises OSError."""
    fd = int(lib.tp_shm_create(name.encode(), size))
    if fd < 0:
        raise OSError(-fd, os.strerror(-fd), name)
    return fd


def shm_open(name: str, *, writable: bool = True) -> int:
    fd = int(lib.tp_shm_open(name.encode(), 1 if writable else 0))
    if fd < 0:
        raise OSError(-fd, os.strerror(-fd), name)
    return fd


def shm_unlink(name: str) -> None:
    rc = int(lib.tp_shm_unlink(name.encode()))
    if rc < 0:
        raise OSError(-rc, os.strerror(-rc), name)


FLOOR_REGION_SIZE = 128  # two words, each on its own cache line


def _round_trip_times(out_ns: npt.NDArray[np.int64] | None, iterations: int) -> Any:
    """A floor's ``out_ns`` as the C pointer it fills (NULL for none), checked first."""
    if out_ns is None:
        return ffi.NULL
    if out_ns.dtype != np.int64 or not out_ns.flags.c_contiguous or out_ns.size < iterations:
        raise ValueError("out_ns must be a contiguous int64 array of `iterations` entries")
    return ffi.cast("int64_t *", ffi.from_buffer(out_ns, require_writable=True))


def floor_socket(
    fd: int,
    role: int,
    iterations: int,
    request_bytes: int,
    response_bytes: int,
    out_ns: npt.NDArray[np.int64] | None = None,
    *,
    timeout: float = 10.0,
) -> int:
    """The socket floor: ``iterations`` round trips with a peer over a connected stream socket.

    Role 0 sends ``request_bytes`` and reads ``response_bytes`` (recording each round trip in
    ``out_ns``); role 1 reads and answers. Returns OK, TIMEOUT or PEER_DEAD.
    """
    if role not in (0, 1):
        raise ValueError("role must be 0 (ping) or 1 (pong)")
    out = _round_trip_times(out_ns, iterations)
    return int(
        lib.tp_floor_socket(
            fd, role, iterations, request_bytes, response_bytes, out, int(timeout * 1e9)
        )
    )


FLOOR_SHM_DATA = 128
"""Where ``floor_shm``'s request bytes start in its region (after the two words)."""


def floor_shm_size(request_bytes: int, response_bytes: int) -> int:
    """The region ``floor_shm`` needs for a request and a response of these sizes."""
    return FLOOR_SHM_DATA + -(-request_bytes // 64) * 64 + response_bytes


def floor_shm(
    region: Any,
    role: int,
    iterations: int,
    request_bytes: int,
    response_bytes: int,
    out_ns: npt.NDArray[np.int64] | None = None,
    *,
    mode: str = "spin",
    spin: int = 10_000,
    timeout: float = 10.0,
) -> int:
    """The shared-memory floor of a batch: ``iterations`` round trips with a peer process over
    ``region`` (``floor_shm_size`` zeroed shared bytes) that move the row's bytes: role 0 copies
    ``request_bytes`` in and pings (recording each round trip in ``out_ns``), role 1 copies
    ``response_bytes`` in and pongs; nothing else. Returns OK, TIMEOUT or ERRNO (no memory)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}")
    if role not in (0, 1):
        raise ValueError("role must be 0 (ping) or 1 (pong)")
    if len(region) < floor_shm_size(request_bytes, response_bytes):
        raise ValueError("region is smaller than floor_shm_size(request_bytes, response_bytes)")
    out = _round_trip_times(out_ns, iterations)
    timeout_ns = int(timeout * 1e9)
    rc = lib.tp_floor_shm(
        address(region), role, iterations, MODES[mode], request_bytes, response_bytes, out, spin,
        timeout_ns,
    )  # fmt: skip
    return int(rc)


def floor_pingpong(
    region: Any,
    role: int,
    iterations: int,
    mode: str = "spin",
    out_ns: npt.NDArray[np.int64] | None = None,
    *,
    spin: int = 10_000,
    timeout: float = 10.0,
) -> int:
    """The C floor: ``iterations`` round trips with a peer process over ``region``.

    ``region``: a writable shared mapping of at least ``FLOOR_REGION_SIZE`` zeroed bytes, shared
    with the peer, which calls this with the other ``role`` (0 pings and records, 1 answers).
    ``mode``: "spin", "futex" or "balanced" (``spin`` iterations, then FUTEX_WAIT).
    ``out_ns``: role 0 only: an int64 array of ``iterations`` round-trip times in nanoseconds.
    Returns OK, or TIMEOUT when the peer stopped answering for ``timeout`` seconds.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}")
    if role not in (0, 1):
        raise ValueError("role must be 0 (ping) or 1 (pong)")
    out = _round_trip_times(out_ns, iterations)
    return int(
        lib.tp_floor_pingpong(
            address(region), role, iterations, MODES[mode], out, spin, int(timeout * 1e9)
        )
    )


# -- channels (transport/channels, docs/channels.md) ---------------------------------------------


def word64(buffer: Any, offset: int) -> Any:
    """A ``uint64_t *`` to the 8-byte-aligned word at ``buffer[offset]``."""
    if offset % 8:
        raise ValueError(f"offset {offset} is not 8-byte aligned")
    return ffi.cast("uint64_t *", address(buffer, offset))


def load64_acquire(ptr: Any) -> int:
    return int(lib.tp_load64_acquire(ptr))


def store64_release(ptr: Any, value: int) -> None:
    lib.tp_store64_release(ptr, value)


def compare_exchange64(ptr: Any, expected: int, desired: int) -> bool:
    return bool(lib.tp_cas64(ptr, expected, desired))


def fetch_add64(ptr: Any, delta: int) -> int:
    """Atomically add ``delta``; returns the previous value."""
    return int(lib.tp_fetch_add64(ptr, delta))


def fence_acquire() -> None:
    lib.tp_fence_acquire()


def fence_release() -> None:
    lib.tp_fence_release()


def monotonic_ns() -> int:
    """CLOCK_MONOTONIC in nanoseconds (the clock of heartbeats and record send times)."""
    return int(lib.tp_monotonic_ns())


def wake_if_sleeping(ptr: Any) -> bool:
    """After a change a waiter waits for: bump the word and FUTEX_WAKE if bit 31 says one sleeps."""
    return bool(lib.tp_wake_if_sleeping(ptr))


def wait_change(ctx: Any, ptr: Any, last: int, timeout: float | None) -> int:
    """Wait (ctx's policy) until the word's sequence differs from ``last``: the new sequence, or
    a negative TIMEOUT / CLOSED / PEER_DEAD."""
    ns = -1 if timeout is None else max(0, int(timeout * 1e9))
    return int(lib.tp_wait_change(ctx, ptr, last, ns))


def new_ring() -> Any:
    """A zeroed ``tp_ring *`` (owned by the returned cdata)."""
    return ffi.new("tp_ring *")


def ring_reserve(ring: Any, want: int, got: Any, timeout: float | None) -> int:
    """Reserve up to ``want`` contiguous records: the first index (``got[0]`` of them) or < 0."""
    ns = -1 if timeout is None else max(0, int(timeout * 1e9))
    return int(lib.tp_ring_reserve(ring, want, got, ns))


def ring_take(ring: Any, max_records: int, got: Any, timeout: float | None) -> int:
    """Claim up to ``max_records`` committed records: the first index (``got[0]``) or < 0."""
    ns = -1 if timeout is None else max(0, int(timeout * 1e9))
    return int(lib.tp_ring_take(ring, max_records, got, ns))
