"""The worker-pool runner: a client's N envs in K worker processes (the second runner of
``transport.runtime.core``; the first is ``LocalEnvs``).

``WorkerPool`` splits the envs evenly over K worker processes (``multiprocessing`` spawn): env i
is created, seeded and stepped in one worker for the pool's lifetime, so each env keeps its own
RNG stream and a pool's results are byte for byte those of the in-process server. A step fans
out and gathers through one shared mapping:

```
 memfd (never named in /dev/shm; workers open /proc/<server pid>/fd/<fd>)
 0       state u32 (READY 1, CLOSED 2) | doorbell u32 @8, wake_at u32 @12 (asynchronous
         batches) | finished u32 @16 (futex: bumped by each worker that finished an op),
         finish_at u32 @20 (finished's value once every worker of the op finished)
         | async_mode u32 @24 (the auto-reset mode of submitted envs, set before they are
         PENDING: a worker steps each under its submit's mode, whatever op it did last)
 64      worker k's block (64 bytes each): cmd u32 (futex: server -> worker sequence),
         done u32 (worker -> server sequence), op u32, arg u32 (STEP: 1 when some of its
         envs are marked SKIP), mode u32, ok u32, flagged u32 (envs it flagged in its last op),
         submits u32 (bumped by the server after it marked some of its envs PENDING)
 ctl     N x 1024-byte env control records: (4 unused bytes) | flags u8 (1 ended, 2 failed,
         4 skip) | has_seed u8 | fate u8 | async_flags u8 | error_len u16 | async_state u32
         | seed u64 | error_text u8[1000]
 actions N x the STEP_REQ action field (its dtype and shape: an integer, an integer array or an
         f32/f64 array of any shape)
 results N x StepResult (packed, the codec's layout)
 finals  N x StepResult (SAME_STEP final results)
```

When the server's own result rows (and final rows) lie in a shared file mapping (an shm
region's slots: ``find_shared``), every worker maps that file too and its envs write the
server's rows in place: results and finals are never copied (a stream session's private rows
are: one byte copy per step from the pool's results area).

The server writes actions (in the action field's own dtype and shape: Discrete, MultiDiscrete
or Box; a worker hands its envs what an env in process gets, through the runtime's one decoding,
``core.action_values``), publishes every worker's ``cmd`` word (FUTEX_WAKE only if that worker
sleeps), then waits once for all: each worker publishes its ``done`` word and bumps
``finished``; only the last one wakes the server (one sleep and one wake per op whatever K),
in 50 ms FUTEX_WAIT slices after each of which a worker not done whose process is gone counts as
dead: found within one slice, never a hang. A worker waits on its ``cmd`` word, checking the
server's pid: an orphaned worker exits. Every wait spins first only when the machine has a
core for each party (``default_spin``): otherwise a spinning waiter takes a worker's core.
Each worker runs its envs with a ``LocalEnvs`` (the auto-reset rule is ``Runner.step_one``,
once): a lock-step op is its batched loop, and between ops a worker looks for envs submitted
asynchronously with one vectorised read of its envs' async words (no native call per env).
``ping`` is a fan-out that does nothing: the pool's synchronisation alone (the floor of a step).
``shared_buffer`` allocates rows in a memfd mapping: a server that keeps its result rows there
has them written in place by the workers, like an shm region's slots.
A worker that died is replaced by a new process with fresh envs from the factory; its
envs' failures name them (``env i: worker process k (pid P, envs a..b) died``) and
``restore`` resets the fresh envs: the next request works.

OBSERVE info maps ride in the control records' error_text area; one that does not fit (a
rendered frame) is marked ``INFO_PIPED`` there and sent, after the worker's done word, through
the worker's pipe (one ``multiprocessing.Pipe`` per worker, in env order).
"""

from __future__ import annotations

import math
import mmap
import multiprocessing
import os
import stat
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import numpy as np

from transport import native
from transport.codec import Schema, StructCodec, row_bytes
from transport.errors import TransportError, WorkerDiedError
from transport.protocol import AutoReset, ErrorCode, RequestError
from transport.runtime.core import (
    FATE_FAILED,
    FATE_RECREATED,
    FATE_RESET,
    Failures,
    Runner,
    action_dtype,
    action_values,
    describe,
    remote_traceback,
    with_traceback,
)
from transport.runtime.env import SERVE_THE_OBJECT, Env, Spaces, close_env, repeated_env_error
from transport.runtime.local import LocalEnvs

_FATES = {1: FATE_RESET, 2: FATE_RECREATED, 3: FATE_RECREATED + " in a new worker process"}

_POOLS: weakref.WeakSet[WorkerPool] = weakref.WeakSet()
"""The pools of this process (``_forget_parent_workers``)."""


def _forget_parent_workers() -> None:
    """In a child made by ``os.fork``: multiprocessing's set of this process's children came
    with the fork, and at the child's exit multiprocessing would SIGTERM every daemonic one: the
    parent's pool workers, serving its clients. They are not the child's."""
    children = getattr(multiprocessing.process, "_children", None)
    if children is None:
        return
    for pool in list(_POOLS):
        for proc in pool._procs:
            children.discard(proc)


os.register_at_fork(after_in_child=_forget_parent_workers)


# -- worker processes ----------------------------------------------------------------------------

READY, CLOSED = 1, 2
OP_STEP, OP_RESET, OP_RESTORE, OP_CLOSE, OP_OBSERVE, OP_ASYNC, OP_NOP = 1, 2, 3, 4, 5, 6, 7
_MODES = {int(m): m for m in AutoReset}  # a block's mode word as the AutoReset member
# an env's async_state word (asynchronous batches): the server sets PENDING, its worker DONE
IDLE, PENDING, DONE = 0, 1, 2
DEFAULT_STEP_TIMEOUT = 60.0
"""Seconds a worker may take over one lock-step op before it counts as stuck (killed, replaced,
its envs ENV_ERROR): generous, so a worker's share of a batch of slow envs is not cut off; it
bounds a hang, not a slow step (Node: ``DEFAULT_STEP_TIMEOUT_MS``)."""
ASYNC_SPIN = 4  # polls of the DONE words before ``poll`` sleeps on the doorbell
WAKE_AT = 12  # u32: the doorbell value the server waits for (workers below it do not wake it)
DOORBELL = 8  # u32 at this offset of the first block: bumped by a worker per finished env
FINISHED = 16  # u32: bumped by each worker that finished a fan-out op (the server waits on it)
FINISH_AT = 20  # u32: FINISHED's value when every worker of the op finished (the one wake)
ASYNC_MODE = 24  # u32: the auto-reset mode of submitted envs (written before they are PENDING)
SLEEP_BIT = 0x80000000  # a sleeper's mark in a word (native's TP_SLEEP)
ENDED, FAILED, SKIP = 1, 2, 4  # SKIP: server -> worker, do not step this env (a noop action)
BLOCK = 64
CTL_DTYPE = np.dtype(
    {
        "names": [
            "flags",
            "has_seed",
            "fate",
            "async_flags",
            "error_len",
            "async_state",
            "seed",
            "error_text",
        ],
        "formats": ["u1", "u1", "u1", "u1", "<u2", "<u4", "<u8", ("u1", 1000)],
        "offsets": [4, 5, 6, 7, 8, 12, 16, 24],
        "itemsize": 1024,
    }
)
# u32 words of a worker block; FLAGGED: the envs whose control record the worker flagged
# (ended, failed) in its last op: the server reads no control record of a worker with none
# SUBMITS: bumped by the server after it marked some of the worker's envs PENDING: a worker
# looks for PENDING envs only when it moved (not after every op)
_W_CMD, _W_DONE, _W_OP, _W_ARG, _W_MODE, _W_OK, _W_FLAGGED, _W_SUBMITS = range(8)


def default_spin(workers: int) -> int:
    """The pool's spin before a wait sleeps: 2000 polls when every party (the server and each
    worker) has a core of its own, else 0: on a machine with fewer cores a spinning waiter takes
    the core a worker or the server needs (measured: issue 24 item 2, docs decision)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return 2_000 if cores > workers + 1 else 0


class _Layout:
    """The pool mapping's views (the same in the server and in every worker)."""

    def __init__(
        self, buf: Any, num_envs: int, workers: int, codec: StructCodec, action: np.dtype[Any]
    ) -> None:
        size = codec.size
        self.ctl_off = BLOCK * (1 + workers)
        self.actions_off = _align(self.ctl_off + num_envs * CTL_DTYPE.itemsize)
        self.results_off = _align(self.actions_off + num_envs * action.itemsize)
        self.finals_off = _align(self.results_off + num_envs * size)
        self.size = _align(self.finals_off + num_envs * size)
        self.buf = buf
        self.state = native.word(buf, 0)
        self.blocks = [
            np.ndarray((BLOCK // 4,), dtype="<u4", buffer=buf, offset=BLOCK * (1 + k))
            for k in range(workers)
        ]
        # the same blocks as memoryviews of u32: an item read or write is a Python int, about
        # 4x cheaper than NumPy's scalar (the per-op words of the fan-out's hot path)
        whole = memoryview(buf)
        self.words = [whole[BLOCK * (1 + k) : BLOCK * (2 + k)].cast("I") for k in range(workers)]
        self.cmd = [native.word(buf, BLOCK * (1 + k)) for k in range(workers)]
        self.done = [native.word(buf, BLOCK * (1 + k) + 4) for k in range(workers)]
        self.submits = [native.word(buf, BLOCK * (1 + k) + 4 * _W_SUBMITS) for k in range(workers)]
        self.ctl = np.ndarray((num_envs,), dtype=CTL_DTYPE, buffer=buf, offset=self.ctl_off)
        # (N, *action_shape) of the action's element type: env i's action in row i
        self.actions: np.ndarray = np.ndarray(
            (num_envs, *action.shape), dtype=action.base, buffer=buf, offset=self.actions_off
        )
        self.async_state = [
            native.word(buf, self.ctl_off + i * CTL_DTYPE.itemsize + 12) for i in range(num_envs)
        ]
        self.doorbell = native.word(buf, DOORBELL)
        self.wake_at = native.word(buf, WAKE_AT)
        self.finished = native.word(buf, FINISHED)
        self.finish_at = native.word(buf, FINISH_AT)
        self.async_mode = native.word(buf, ASYNC_MODE)
        self.results = codec.view(buf, self.results_off, count=num_envs)
        self.finals = codec.view(buf, self.finals_off, count=num_envs)
        self.result_records = [
            codec.view(buf, self.results_off + i * size) for i in range(num_envs)
        ]
        self.final_records = [codec.view(buf, self.finals_off + i * size) for i in range(num_envs)]

    @staticmethod
    def total(num_envs: int, workers: int, codec: StructCodec, action: np.dtype[Any]) -> int:
        ctl = BLOCK * (1 + workers)
        actions = _align(ctl + num_envs * CTL_DTYPE.itemsize)
        results = _align(actions + num_envs * action.itemsize)
        finals = _align(results + num_envs * codec.size)
        return _align(finals + num_envs * codec.size)


def _align(n: int, to: int = 64) -> int:
    return (n + to - 1) // to * to


def _split(num_envs: int, workers: int) -> list[tuple[int, int]]:
    """Env ranges [lo, hi) per worker, as even as possible (the first ones get one more)."""
    per, extra = divmod(num_envs, workers)
    ranges, lo = [], 0
    for k in range(workers):
        hi = lo + per + (1 if k < extra else 0)
        ranges.append((lo, hi))
        lo = hi
    return ranges


SharedRows = tuple[str, int, Any, tuple[int, ...]]
"""Rows a worker writes in place: (a path it opens, the file offset of row 0, the rows' dtype,
their strides): the server's own rows when they lie in a shared file mapping (an shm region)."""


def find_shared(rows: np.ndarray) -> tuple[int, int] | None:
    """(an open fd on the file, the file offset of ``rows[0]``) when the (N,) record array
    ``rows`` lies whole in one MAP_SHARED mapping of a file (an shm region's slots, or a memfd
    this process holds an fd on), else None (private memory: a stream session's buffer).
    Found through /proc/self/maps; a linked file is opened by path, an unlinked one (a memfd)
    through an fd of this process on it; either way its inode is the mapping's."""
    if not isinstance(rows, np.ndarray) or rows.ndim != 1 or rows.shape[0] == 0:
        return None
    if rows.strides[0] < rows.dtype.itemsize:
        return None
    start = int(rows.__array_interface__["data"][0])
    end = start + (rows.shape[0] - 1) * rows.strides[0] + rows.dtype.itemsize
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                parts = line.split(maxsplit=5)
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if not lo <= start < hi:
                    continue
                path = parts[5].strip() if len(parts) > 5 else ""
                if end > hi or parts[1][3] != "s" or not path.startswith("/"):
                    return None
                inode, (major, minor) = int(parts[4]), parts[3].split(":")
                device = (int(major, 16), int(minor, 16))
                offset = int(parts[2], 16) + start - lo
                if path.endswith(" (deleted)"):  # a memfd (or an unlinked file): an fd on it
                    held = _fd_on(inode, device)
                    return None if held is None else (held, offset)
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
                if not _same_file(os.fstat(fd), inode, device):  # replaced since mapped
                    os.close(fd)
                    return None
                return fd, offset
    except (OSError, ValueError, IndexError):
        return None
    return None


def _same_file(st: os.stat_result, inode: int, device: tuple[int, int]) -> bool:
    return st.st_ino == inode and (os.major(st.st_dev), os.minor(st.st_dev)) == device


def _fd_on(inode: int, device: tuple[int, int]) -> int | None:
    """A new fd (a dup) on the open file ``inode`` of ``device`` that this process holds an
    fd on (an mmap object keeps one), or None."""
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = int(name)
            st = os.fstat(fd)
        except (OSError, ValueError):  # listdir's own fd, closed since
            continue
        if stat.S_ISREG(st.st_mode) and _same_file(st, inode, device):
            try:
                if os.readlink(f"/proc/self/fd/{fd}").startswith("/"):
                    return os.dup(fd)
            except OSError:
                continue
    return None


def shared_buffer(size: int) -> mmap.mmap:
    """``size`` zeroed bytes in a shared mapping of an unnamed memfd: a server's result rows
    allocated here (in place of a ``bytearray``) are found by ``find_shared``, so a worker pool's
    workers write them in place and the pool copies nothing (~30 us of server CPU per 256
    pac_env rows; issue 24 item 2). Nothing is named in /dev/shm; the mapping holds the memfd."""
    fd = os.memfd_create("transport-rows", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, max(size, 1))
        return mmap.mmap(fd, max(size, 1), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def _map_rows(shared: SharedRows, count: int) -> np.ndarray:
    """A worker's view of the server's rows (``SharedRows``): the same bytes, mapped here."""
    path, offset, dtype, strides = shared
    page = mmap.ALLOCATIONGRANULARITY
    base = offset // page * page
    length = offset - base + (count - 1) * strides[0] + dtype.itemsize
    fd = os.open(path, os.O_RDWR)
    try:
        buf = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=base)
    finally:
        os.close(fd)
    return np.ndarray((count,), dtype=dtype, buffer=buf, offset=offset - base, strides=strides)


def _wait_ctx(peer_pid: int, spin: int, state: Any = None) -> Any:
    ctx = native.new_ctx()
    ctx.peer_pid = peer_pid
    ctx.peer_start = native.proc_start_time(peer_pid)
    ctx.spin = spin
    ctx.slice_ns = 50_000_000
    if state is not None:
        ctx.state = state
        ctx.ready_state = READY
    return ctx


_TEXT_MAX = 1000
"""Bytes of a control record's error_text (the layout above)."""


def _write_error(ctl: np.ndarray, text: str) -> None:
    data = text.encode("utf-8")[: ctl["error_text"].shape[-1]]
    data = data.decode("utf-8", "ignore").encode("utf-8")
    ctl["error_text"][: len(data)] = np.frombuffer(data, dtype=np.uint8)
    ctl["error_len"] = len(data)


def _read_error(ctl: np.ndarray) -> str:
    """The text ``_write_error`` left in a control record."""
    return bytes(ctl["error_text"][: int(ctl["error_len"])]).decode("utf-8", "replace")


INFO_PIPED = 0xFFFF
"""error_len of an OBSERVE info map too large for the error_text area (a rendered frame): the
worker sends it through its pipe after answering (``_write_info``, ``WorkerPool.observe``)."""


def _write_info(ctl: np.ndarray, info: dict[str, Any]) -> bytes | None:
    """An env's OBSERVE info map, msgpack in the error_text area; a map that does not fit is
    marked ``INFO_PIPED`` and returned, for the worker to send through its pipe."""
    data = msgpack.packb(info)
    if len(data) > ctl["error_text"].shape[-1]:
        ctl["error_len"] = INFO_PIPED
        return bytes(data)
    ctl["error_text"][: len(data)] = np.frombuffer(data, dtype=np.uint8)
    ctl["error_len"] = len(data)
    return None


def _worker_main(
    fd_path: str,
    size: int,
    num_envs: int,
    workers: int,
    k: int,
    factory: Callable[[], Env],
    schema_ir: Any,
    result_struct: str,
    parent_pid: int,
    spin: int,
    pipe: Any = None,
    rows: SharedRows | None = None,
    final_rows: SharedRows | None = None,
) -> None:  # pragma: no cover - runs in the worker process (covered by tests/test_workers.py)
    fd = os.open(fd_path, os.O_RDWR)
    try:
        buf = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    schema = Schema(schema_ir)
    codec = schema[result_struct]
    lay = _Layout(buf, num_envs, workers, codec, action_dtype(schema))
    lo, hi = _split(num_envs, workers)[k]
    block, ctl = lay.blocks[k], lay.ctl
    try:
        # results (and SAME_STEP finals) go straight into the server's rows when they are
        # shared (an shm region's slots), else into the pool's mapping (the server copies)
        results = _map_rows(rows, num_envs) if rows is not None else lay.results
        finals = _map_rows(final_rows, num_envs) if final_rows is not None else lay.finals
        envs = [factory() for _ in range(lo, hi)]
        if len({id(env) for env in envs}) < len(envs):  # one object for several envs
            name = getattr(factory, "__qualname__", None) or type(factory).__qualname__
            raise repeated_env_error(name, type(envs[0]).__qualname__, SERVE_THE_OBJECT)
        local = LocalEnvs(envs, codec, results[lo:hi], finals[lo:hi], factory, base=lo)
        block[_W_OK] = 1
    except Exception as exc:
        _write_error(ctl[lo], describe(exc))
        block[_W_OK] = 0
        native.publish(lay.done[k], 1)
        return
    ctx = _wait_ctx(parent_pid, spin, lay.state)
    native.publish(lay.done[k], 1)  # ready
    last = 0

    # this worker's envs' async_state words as one (hi - lo,) u32 view: whether any is PENDING
    # is one vectorised look, not a native call per env after every op (issue 24 item 2: that
    # loop cost ~0.3 us per env per op and took a core from the other parties)
    states = ctl["async_state"][lo:hi]
    submits, seen = lay.submits[k], 0

    def step_pending() -> None:
        """Step every env of this worker that the server marked PENDING (asynchronous
        batches), each reported as soon as it finishes; again until none is pending. Nothing
        to do (one word read) unless the server submitted envs since the last look."""
        nonlocal seen
        while True:
            now = native.load_acquire(submits)
            if now == seen:
                return
            seen = now  # submits from here on are looked for again
            step_marked()

    def step_marked() -> None:
        while True:
            marked = np.flatnonzero(states == PENDING)
            if not marked.size:
                return
            stepped = False
            for j in marked.tolist():
                i = lo + j
                if native.load_acquire(lay.async_state[i]) != PENDING:  # the ordered look
                    continue
                stepped = True
                # the mode of this env's submit (read after its PENDING word: ordered), never
                # the one this worker saw last: envs submitted while it finished a lock-step
                # op were stepped under that op's mode (DISABLED before any step)
                mode = _MODES[native.load_acquire(lay.async_mode)]
                record = ctl[i]
                record["async_flags"] = 0
                try:
                    action = action_values(lay.actions[i : i + 1])[0]
                    if local.step_one(j, action, mode):
                        record["async_flags"] = ENDED
                except Exception as exc:
                    record["async_flags"] = FAILED
                    text = with_traceback(describe(exc), remote_traceback(exc), _TEXT_MAX)
                    _write_error(record, text)
                native.store_release(lay.async_state[i], DONE)
                _bump(lay.doorbell, lay.wake_at)
            if not stepped:
                return

    wait = native.lib.tp_wait_change
    mine = ctl[lo:hi]
    flags = mine["flags"]  # (hi - lo,) u1 view: this worker's env flags
    words = lay.words[k]  # this worker's block as Python ints (a read: ~4x cheaper than NumPy's)
    cmd, my_actions, modes = lay.cmd[k], lay.actions[lo:hi], _MODES
    while True:
        rc = int(wait(ctx, cmd, last, 1_000_000_000))
        if rc == native.TIMEOUT:
            continue
        if rc < 0:  # CLOSED, or the server died
            return
        last = rc
        op = words[_W_OP]
        if op == OP_ASYNC:
            step_pending()
            continue
        if op == OP_NOP:  # a fan-out that does nothing (``WorkerPool.ping``: the sync alone)
            native.publish(lay.done[k], rc)
            _finish(lay.finished, lay.finish_at)
            continue
        if op == OP_CLOSE:
            local.close_envs()
            native.publish(lay.done[k], rc)
            return
        piped: list[bytes] = []  # OBSERVE info maps too large for a control record
        # a STEP's arg is 1 when the server marked some of these envs SKIP; the flags are
        # cleared only when something set them (the server's marks, or this worker's last op)
        skip = (flags & SKIP) != 0 if op == OP_STEP and words[_W_ARG] else None
        if skip is not None or words[_W_FLAGGED] or op != OP_STEP:
            flags[...] = 0
        failures: Failures = []
        ended: list[int] = []
        if op == OP_STEP:
            mode = modes[words[_W_MODE]]
            if skip is not None:
                ended, failures = local.step_except(my_actions, mode, skip)
            else:
                ended, failures = local.step(my_actions, mode)
            if ended:
                flags[ended] = ENDED
        elif op == OP_RESET:
            seeds = [
                int(s) if h else None
                for s, h in zip(mine["seed"].tolist(), mine["has_seed"].tolist(), strict=True)
            ]
            failures = local.reset(seeds)
        elif op == OP_RESTORE:
            i = words[_W_ARG] - lo
            seed = int(mine[i]["seed"]) if mine[i]["has_seed"] else None
            fate, ok = local.restore(i, seed)
            mine[i]["fate"] = {FATE_RESET: 1, FATE_RECREATED: 2}.get(fate, 0) if ok else 0
        elif op == OP_OBSERVE:
            infos, failures = local.observe()
            for i, info in enumerate(infos):
                data = _write_info(mine[i], info)
                if data is not None:
                    piped.append(data)
        for i, err in failures:
            mine[i]["flags"] |= FAILED
            if isinstance(err, RequestError):
                text = err.text.removeprefix(f"env {lo + i}: ")
            else:  # the last frames ride along (core._recover puts them after the message)
                text = with_traceback(describe(err), remote_traceback(err), _TEXT_MAX)
            _write_error(mine[i], text)
        words[_W_FLAGGED] = len(ended) + len(failures)
        native.publish(lay.done[k], rc)
        _finish(lay.finished, lay.finish_at)
        for data in piped:  # in env order, read by the server after the done word
            pipe.send_bytes(data)
        step_pending()  # sent while this worker did something else (a RESTORE)


def _finish(word: Any, finish_at: Any) -> None:
    """Add one to FINISHED (a worker finished its part of a fan-out op). Only the worker that
    brings it to FINISH_AT (the last of the op) wakes the server; the others keep the server's
    sleep mark, so the server sleeps once per op whatever the number of workers."""
    while True:
        value = native.load_acquire(word)
        bumped = ((value & native.SEQ_MASK) + 1) & native.SEQ_MASK
        last = (bumped - native.load_acquire(finish_at)) & native.SEQ_MASK < 0x40000000
        new = bumped if last else bumped | (value & SLEEP_BIT)
        if native.compare_exchange(word, value, new):
            break
    if last and value & SLEEP_BIT:
        native.futex_wake(word)


def _bump(word: Any, wake_at: Any) -> None:
    """Add one to a u32 word shared by every worker; wake the server once it reaches the
    value the server waits for (fewer wake-ups: each would take a core from a worker)."""
    while True:
        value = native.load_acquire(word)
        bumped = (value + 1) & 0xFFFFFFFF
        if native.compare_exchange(word, value, bumped):
            break
    if (bumped - native.load_acquire(wake_at)) & 0x80000000 == 0:  # bumped >= wake_at
        native.futex_wake(word)


class WorkerPool(Runner):
    """``num_envs`` envs in ``workers`` processes (env i in worker ``i * K // N``, evenly split).

    Results go to ``dest`` (an (N,) record array with the codec's field names: the rows the
    runtime reads) and SAME_STEP final results to ``finals``: written there by the workers
    when those rows lie in a shared file (``writes_in_place``), else landed in the pool's
    mapping and copied (one byte copy of N rows).
    """

    def __init__(
        self,
        factory: Callable[[], Env],
        schema: Schema,
        result_struct: str,
        num_envs: int,
        workers: int,
        dest: np.ndarray,
        finals: np.ndarray | None = None,
        *,
        spin: int | None = None,
        start_timeout: float = 60.0,
        step_timeout: float | None = None,
        spaces: Spaces | None = None,
    ) -> None:
        """``spaces``: the envs' spaces when the caller asked them already (else one env is
        made in this process, asked and closed, the first time they are needed).
        ``step_timeout``: seconds a worker may take over one op (``DEFAULT_STEP_TIMEOUT``)
        before it counts as stuck: it is killed and replaced, its envs fail (ENV_ERROR)."""
        if workers < 1:
            raise ValueError("workers must be at least 1")
        if num_envs < 1:
            raise ValueError("num_envs must be at least 1")
        super().__init__(schema[result_struct], dest, finals, num_envs)
        self.factory = factory
        self.schema = schema
        self.result_struct = result_struct
        self.workers = min(workers, num_envs)
        self.spin = default_spin(self.workers) if spin is None else spin
        self.start_timeout = start_timeout
        self.step_timeout = DEFAULT_STEP_TIMEOUT if step_timeout is None else step_timeout
        if not self.step_timeout > 0:
            raise ValueError(f"step_timeout must be positive seconds, not {step_timeout!r}")
        self._stuck: set[int] = set()  # workers killed for the step timeout (``_died`` says so)
        self._ranges = _split(num_envs, self.workers)
        self._owner = [k for k, (lo, hi) in enumerate(self._ranges) for _ in range(lo, hi)]
        self._spaces = spaces
        self._closed = False
        self._pid = os.getpid()  # a forked child's copy of this pool is not its to stop
        self._action = action_dtype(schema)
        size = _Layout.total(num_envs, self.workers, self.codec, self._action)
        self._fd = os.memfd_create("transport-workers", os.MFD_CLOEXEC)
        os.ftruncate(self._fd, size)
        self._size = size
        self._map = mmap.mmap(self._fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.lay = _Layout(self._map, num_envs, self.workers, self.codec, self._action)
        native.store_release(self.lay.state, READY)
        self._mp = multiprocessing.get_context("spawn")
        self._procs: list[Any] = [None] * self.workers
        _POOLS.add(self)
        self._ctxs: list[Any] = [None] * self.workers
        self._pipes: list[Any] = [None] * self.workers  # worker k -> server: large info maps
        self._seq = [0] * self.workers
        self._recreated: set[int] = set()
        self._dest_bytes: np.ndarray | None = None  # (N, size) byte views: _copy_results
        self._pool_bytes: np.ndarray | None = None
        # the server's rows in a shared file (an shm region): workers write them in place
        self._shared_fds: list[int] = []
        self._rows = self._share(dest[:num_envs])
        self._final_rows = self._share(finals[:num_envs]) if finals is not None else None
        self._finish_ctx = _wait_ctx(0, self.spin)
        try:
            for k in range(self.workers):
                self._spawn(k)
            for k in range(self.workers):
                self._await_start(k)
        except BaseException:
            self.close()
            raise

    # -- processes ---------------------------------------------------------------------------

    def _share(self, rows: np.ndarray) -> SharedRows | None:
        """``rows`` as workers map them (``SharedRows``), or None: they copy into the pool's
        mapping and the server copies from it. The fd stays open for workers started later."""
        found = find_shared(rows)
        if found is None:
            return None
        fd, offset = found
        self._shared_fds.append(fd)
        return (f"/proc/{os.getpid()}/fd/{fd}", offset, rows.dtype, rows.strides)

    @property
    def writes_in_place(self) -> bool:
        """True when workers write the server's result rows themselves (no copy)."""
        return self._rows is not None

    def _spawn(self, k: int) -> None:
        block = self.lay.blocks[k]
        block[:] = 0  # cmd and done sequences restart at 0
        self._seq[k] = 0
        if self._pipes[k] is not None:
            self._pipes[k].close()
        self._pipes[k], sender = self._mp.Pipe(duplex=False)  # large OBSERVE info maps
        proc = self._mp.Process(
            target=_worker_main,
            args=(
                f"/proc/{os.getpid()}/fd/{self._fd}",
                self._size,
                self.num_envs,
                self.workers,
                k,
                self.factory,
                self.schema.ir,
                self.result_struct,
                os.getpid(),
                self.spin,
                sender,
                self._rows,
                self._final_rows,
            ),
            name=f"transport-worker-{k}",
            daemon=True,
        )
        proc.start()
        sender.close()  # the worker's end
        self._procs[k] = proc
        self._ctxs[k] = None

    def _await_start(self, k: int) -> None:
        proc = self._procs[k]
        ctx = _wait_ctx(proc.pid, 0)
        rc = native.wait_value(ctx, self.lay.done[k], 1, self.start_timeout)
        if rc != native.OK:
            raise WorkerDiedError(
                f"worker process {k} (pid {proc.pid}, envs {self._describe(k)}) did not start"
            )
        if not self.lay.blocks[k][_W_OK]:
            lo = self._ranges[k][0]
            text = _read_error(self.lay.ctl[lo])
            raise WorkerDiedError(f"worker process {k}: creating its envs failed: {text}")
        self._seq[k] = 1
        self._ctxs[k] = _wait_ctx(proc.pid, self.spin)

    def _describe(self, k: int) -> str:
        lo, hi = self._ranges[k]
        return f"{lo}..{hi - 1}" if hi - lo > 1 else str(lo)

    def pids(self) -> list[int]:
        """The worker processes' pids (index k: worker k)."""
        return [int(p.pid) for p in self._procs]

    def env_ids(self, k: int) -> range:
        lo, hi = self._ranges[k]
        return range(lo, hi)

    # -- fan-out / gather ----------------------------------------------------------------------

    def _run(
        self, op: int, workers: Sequence[int], arg: int | Sequence[int] = 0, mode: int = 0
    ) -> list[int]:
        """Send ``op`` to ``workers`` (``arg``: one for all, or one per worker) and wait until
        each finished or died; returns the workers that died.

        One wait for all: each worker bumps FINISHED after its done word and only the last one
        wakes the server (one sleep and one wake per op, not one per worker). The wait sleeps
        in 50 ms slices and ends only when FINISHED reached the op's count or a worker's
        process is gone (a worker not done then counts as dead): a death is found within a
        slice, never a hang."""
        if self._closed:
            raise TransportError("the worker pool is closed")
        lay = self.lay
        target = (native.load_acquire(lay.finished) + len(workers)) & native.SEQ_MASK
        native.store_release(lay.finish_at, target)
        seqs = self._seq
        for n, k in enumerate(workers):
            words = lay.words[k]
            words[_W_OP] = op
            words[_W_ARG] = arg if isinstance(arg, int) else arg[n]
            words[_W_MODE] = mode
            seqs[k] = (seqs[k] + 1) & native.SEQ_MASK
            native.publish(lay.cmd[k], seqs[k])
        wait, ctx, finished = native.lib.tp_wait_value, self._finish_ctx, lay.finished
        deadline = time.monotonic() + self.step_timeout
        while wait(ctx, finished, target, 50_000_000) != native.OK:
            # Done words alone do not end the wait: a live worker bumps FINISHED right after
            # its done word, and a bump left for later would count toward the next op (which
            # then ended before its workers did). Only a death ends it: a worker not done, or
            # one done that can no longer bump.
            if not all(self._procs[k].is_alive() for k in workers):
                self._settle_after_death(workers, target)
                break
            if time.monotonic() >= deadline:  # a worker stuck in an env: killed, found dead
                for k in workers:
                    if not self._finished_op(k):
                        self._stuck.add(k)
                        self._procs[k].kill()
                deadline = math.inf
        return [k for k in workers if not self._finished_op(k)]

    def _settle_after_death(self, workers: Sequence[int], target: int) -> None:
        """A worker of the op died: wait for the live ones to finish it (a live worker still
        stepping is not dead: taken for dead it was replaced while its process ran on) and to
        bump FINISHED (a late bump would count toward the next op). A live worker's wait has
        no bound but its own death, as a step without deaths; the bumps get 1 s: a worker that
        died between its done word and its bump never bumps."""
        lay, start = self.lay, (target - len(workers)) & native.SEQ_MASK
        while True:
            live = [k for k in workers if self._procs[k].is_alive()]
            if all(self._finished_op(k) for k in live):
                break
            time.sleep(0.001)
        dead_done = sum(1 for k in workers if k not in live and self._finished_op(k))
        expected = len(live) + dead_done
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            if (native.load_acquire(lay.finished) - start) & native.SEQ_MASK >= expected:
                return
            time.sleep(0.001)

    def ping(self) -> list[int]:
        """A fan-out that does nothing: every worker wakes, answers and counts itself
        finished. Its time is the pool's synchronisation alone (the floor of a step; issue 24
        item 2); returns the workers that died (not replaced: the next op replaces them)."""
        return self._run(OP_NOP, range(self.workers))

    def _finished_op(self, k: int) -> bool:
        """Worker k's done word says it finished the op last sent to it."""
        return native.load_acquire(self.lay.done[k]) & native.SEQ_MASK == self._seq[k]

    def _died(self, dead: list[int], failures: Failures) -> None:
        """Replace each dead worker; its envs fail with a text naming them."""
        for k in dead:
            proc = self._procs[k]
            proc.join(timeout=1.0)
            code = proc.exitcode
            how = f"exit code {code}" if code is not None else "no exit code"
            if k in self._stuck:
                self._stuck.discard(k)
                how = (
                    f"it did not answer within the step timeout ({self.step_timeout:g} s: an "
                    "env's step, reset or info() never returned) and was killed"
                )
            envs = self._describe(k)
            for i in self.env_ids(k):
                text = f"env {i}: worker process {k} (pid {proc.pid}, envs {envs}) died ({how})"
                failures.append((i, RequestError(ErrorCode.ENV_ERROR, text)))
                self._recreated.add(i)
            self._spawn(k)
            self._await_start(k)
        failures.sort(key=lambda f: f[0])

    def _collect(self, failures: Failures, skip: set[int]) -> list[int]:
        """The envs the workers flagged (ended, failed: each failure added to ``failures``);
        only the control records of workers that flagged some are read."""
        ctl = self.lay.ctl
        flags = ctl["flags"]
        ended: list[int] = []
        for k, words in enumerate(self.lay.words):
            if not words[_W_FLAGGED] or k in skip:
                continue
            lo, hi = self._ranges[k]
            for j in np.flatnonzero(flags[lo:hi] & (ENDED | FAILED)).tolist():
                self._flagged(lo + j, failures, ended)
        return ended

    def _flagged(self, i: int, failures: Failures, ended: list[int]) -> None:
        record = self.lay.ctl[i]
        flags = int(record["flags"])
        if flags & FAILED:
            text = _read_error(record)
            failures.append((i, RequestError(ErrorCode.ENV_ERROR, f"env {i}: {text}")))
        if flags & ENDED:
            ended.append(i)

    def _copy_results(self) -> None:
        """The pool's N results into the runtime's rows: one byte copy per row when both have
        the codec's layout (NumPy copies structured records field by field, several times
        slower); nothing when the workers wrote the rows themselves."""
        if self._rows is not None:
            return
        dest = self.results[: self.num_envs]
        if dest.dtype != self.lay.results.dtype:  # other field offsets (an shm slot profile)
            dest[...] = self.lay.results
            return
        if self._dest_bytes is None:
            self._dest_bytes = row_bytes(dest)
            self._pool_bytes = row_bytes(self.lay.results)
        self._dest_bytes[...] = self._pool_bytes

    def spaces(self) -> Spaces:
        if self._spaces is None:
            env = self.factory()
            try:
                self._spaces = env.spaces()
            finally:
                close_env(env)
        return self._spaces

    def reset(self, seeds: Sequence[int | None]) -> Failures:
        ctl = self.lay.ctl
        ctl["has_seed"] = [s is not None for s in seeds]
        ctl["seed"] = [0 if s is None else s for s in seeds]
        dead = self._run(OP_RESET, range(self.workers))
        failures: Failures = []
        self._collect(failures, set(dead))
        self._copy_results()
        if dead:
            self._died(dead, failures)
        return failures

    def step(
        self, actions: Sequence[int] | np.ndarray, mode: AutoReset
    ) -> tuple[list[int], Failures]:
        return self.step_except(actions, mode, None)

    def step_except(
        self, actions: Sequence[int] | np.ndarray, mode: AutoReset, skip: np.ndarray | None
    ) -> tuple[list[int], Failures]:
        """Step every env but those ``skip`` marks (their workers leave them and their results
        as they are: masked ``noop`` actions)."""
        self.lay.actions[...] = actions[: self.num_envs]
        marks: int | list[int] = 0
        if skip is not None:
            self.lay.ctl["flags"] = np.where(skip[: self.num_envs], SKIP, 0)
            marks = [int(skip[lo:hi].any()) for lo, hi in self._ranges]
        dead = self._run(OP_STEP, range(self.workers), arg=marks, mode=int(mode))
        failures: Failures = []
        ended = self._collect(failures, set(dead))
        self._copy_results()
        if self._final_rows is None:
            for i in ended:
                self.final_records[i][...] = self.lay.final_records[i]
        if dead:
            self._died(dead, failures)
        return ended, failures

    # -- asynchronous batches ----------------------------------------------------------------

    def submit(self, ids: Sequence[int], actions: Sequence[Any], mode: AutoReset) -> None:
        """Mark each env PENDING with its action and wake its worker; workers step them
        concurrently and mark each DONE as it finishes (``poll``)."""
        if self._closed:
            raise TransportError("the worker pool is closed")
        pending = self.__dict__.setdefault("_pending", set())
        states = self.lay.async_state
        workers = set()
        if len(ids):
            self.lay.actions[list(ids)] = actions
        native.store_release(self.lay.async_mode, int(mode))  # before any env is PENDING
        for i in ids:
            native.store_release(states[i], PENDING)
            pending.add(i)
            workers.add(self._owner[i])
        for k in workers:
            words = self.lay.words[k]
            words[_W_OP] = OP_ASYNC
            # after the PENDING marks: the worker looks for them once it sees this move
            native.store_release(self.lay.submits[k], (words[_W_SUBMITS] + 1) & 0xFFFFFFFF)
            self._seq[k] = (self._seq[k] + 1) & native.SEQ_MASK
            native.publish(self.lay.cmd[k], self._seq[k])

    concurrent = True

    def completion_word(self) -> tuple[Any, int]:
        """The doorbell the workers bump per finished env, armed: the next one wakes a waiter."""
        ring = native.load_acquire(self.lay.doorbell)
        native.store_release(self.lay.wake_at, (ring + 1) & 0xFFFFFFFF)
        return self.lay.doorbell, ring

    def poll_ready(self, check_workers: bool = False) -> list[tuple[int, bool, Exception | None]]:
        """Every submitted env that is DONE now (no wait); ``check_workers``: the envs of a
        worker that died fail (the shm server asks when its wait times out)."""
        pending: set[int] = self.__dict__.setdefault("_pending", set())
        done: list[tuple[int, bool, Exception | None]] = self.__dict__.setdefault("_completed", [])
        states = self.lay.async_state
        for i in list(pending):
            if native.load_acquire(states[i]) == DONE:
                done.append(self._finished(i))
                pending.discard(i)
        if check_workers and pending:
            self._fail_dead(pending, done)
        taken = done[:]
        del done[:]
        return taken

    def _fail_dead(self, pending: set[int], done: list[tuple[int, bool, Exception | None]]) -> None:
        """The envs in flight in a worker that died fail (it is replaced; ``_died``)."""
        states = self.lay.async_state
        dead = [k for k in {self._owner[i] for i in pending} if not self._procs[k].is_alive()]
        if not dead:
            return
        failures: Failures = []
        self._died(dead, failures)
        for i, exc in failures:
            if i in pending:
                pending.discard(i)
                native.store_release(states[i], IDLE)
                done.append((i, False, exc))
            else:  # not in flight: nobody would reset the fresh env, so reset it now
                self.restore(i, None)

    def poll(self, want: int) -> list[tuple[int, bool, Exception | None]]:
        """Wait until ``want`` submitted envs are DONE (spin, then futex slices on the
        doorbell with a liveness check of the workers that own them: a dead worker fails its
        envs, never a hang); returns every finished env (at least ``want``)."""
        pending: set[int] = self.__dict__.setdefault("_pending", set())
        done: list[tuple[int, bool, Exception | None]] = self.__dict__.setdefault("_completed", [])
        states, doorbell = self.lay.async_state, self.lay.doorbell
        spins = 0
        while len(done) < want and pending:
            ring = native.load_acquire(doorbell)
            for i in list(pending):
                if native.load_acquire(states[i]) == DONE:
                    done.append(self._finished(i))
                    pending.discard(i)
            if len(done) >= want or not pending:
                break
            if spins < ASYNC_SPIN:  # a Python spin steals a core from the workers: short
                spins += 1
                continue
            # wake me after the completions still needed (an early wake-up only rescans)
            native.store_release(self.lay.wake_at, (ring + want - len(done)) & 0xFFFFFFFF)
            native.futex_wait(doorbell, ring, 0.05)
            self._fail_dead(pending, done)
        taken = done[:want]
        del done[:want]
        return taken

    def _finished(self, i: int) -> tuple[int, bool, Exception | None]:
        """Env i's result (and SAME_STEP final result) into the runtime's rows."""
        record = self.lay.ctl[i]
        flags = int(record["async_flags"])
        native.store_release(self.lay.async_state[i], IDLE)
        if flags & FAILED:
            return i, False, RequestError(ErrorCode.ENV_ERROR, f"env {i}: {_read_error(record)}")
        if self._rows is None:
            self.records[i][...] = self.lay.result_records[i]
        ended = bool(flags & ENDED)
        if ended and self._final_rows is None:
            self.final_records[i][...] = self.lay.final_records[i]
        return i, ended, None

    def observe(self) -> tuple[list[dict[str, Any]], Failures]:
        dead = self._run(OP_OBSERVE, range(self.workers))
        failures: Failures = []
        self._collect(failures, set(dead))
        self._copy_results()
        ctl = self.lay.ctl
        infos: list[dict[str, Any]] = []
        failed = {i for i, _ in failures}
        for i in range(self.num_envs):
            info: dict[str, Any] = {}
            if i not in failed and self._owner[i] not in dead:
                length = int(ctl[i]["error_len"])
                if length == INFO_PIPED:
                    data = self._piped(self._owner[i])
                else:
                    data = bytes(ctl[i]["error_text"][:length])
                info = dict(msgpack.unpackb(data)) if data else {}
            infos.append(info)
        if dead:
            self._died(dead, failures)
        return infos, failures

    def _piped(self, k: int) -> bytes:
        """The next large info map worker k sends through its pipe (b"" if it died first)."""
        pipe = self._pipes[k]
        try:
            while not pipe.poll(0.05):
                if not self._procs[k].is_alive():
                    return b""
            data: bytes = pipe.recv_bytes()
        except (EOFError, OSError):
            return b""
        return data

    def reset_one(self, index: int, seed: int | None) -> None:
        raise RequestError(
            ErrorCode.BAD_BATCH, f"env {index}: a worker pool steps and resets every env together"
        )

    def step_env(self, index: int, action: Any) -> None:
        self.reset_one(index, None)

    def step_one(self, index: int, action: Any, mode: AutoReset) -> bool:
        """A 1-env pool steps its env as a batch of one (one fan-out)."""
        if self.num_envs != 1:
            self.reset_one(index, None)
        ended, failures = self.step([action], mode)
        if failures:
            raise failures[0][1]
        return bool(ended)

    def restore(self, index: int, seed: int | None) -> tuple[str, bool]:
        ctl = self.lay.ctl[index]
        ctl["has_seed"] = seed is not None
        ctl["seed"] = 0 if seed is None else seed
        k = self._owner[index]
        if self._run(OP_RESTORE, [k], arg=index):
            self._died([k], [])
            return FATE_FAILED, False
        code = int(self.lay.ctl[index]["fate"])
        if code and index in self._recreated:
            code = 3
            self._recreated.discard(index)
        if self._rows is None:
            self.records[index][...] = self.lay.result_records[index]
        return (_FATES[code], True) if code else (FATE_FAILED, False)

    def close(self) -> None:
        """Stop every worker (CLOSED wakes them; stragglers are killed) and unmap. In a forked
        child (its copy of the pool, closed at its exit) nothing: the workers and the shared
        memory are the parent's."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._pid:
            return
        native.store_release(self.lay.state, CLOSED)
        for k in range(self.workers):
            native.futex_wake(self.lay.cmd[k])
        for proc in self._procs:
            if proc is None:
                continue
            proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2.0)
        self.results = np.zeros(0)
        self.records, self.final_records = [], []
        self._dest_bytes = self._pool_bytes = None
        for pipe in self._pipes:
            if pipe is not None:
                pipe.close()
        self.lay = None  # type: ignore[assignment]
        try:
            self._map.close()
        except BufferError:
            pass
        os.close(self._fd)
        for fd in self._shared_fds:
            os.close(fd)
        self._shared_fds = []

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
