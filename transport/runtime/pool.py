"""The worker-pool runner: a client's N envs in K worker processes (the second runner of
``transport.runtime.core``; the first is ``LocalEnvs``).

``WorkerPool`` splits the envs evenly over K worker processes (``multiprocessing`` spawn): env i
is created, seeded and stepped in one worker for the pool's lifetime, so each env keeps its own
RNG stream and a pool's results are byte for byte those of the in-process server. A step fans
out and gathers through one shared mapping:

```
 memfd (never named in /dev/shm; workers open /proc/<server pid>/fd/<fd>)
 0       state u32 (READY 1, CLOSED 2)
 64      worker k's block (64 bytes each): cmd u32 (futex: server -> worker sequence),
         done u32 (futex: worker -> server sequence), op u32, arg u32, mode u32, ok u32
 ctl     N x 1024-byte env control records: (4 unused bytes) | flags u8 (1 ended, 2 failed,
         4 skip) | has_seed u8 | fate u8 | async_flags u8 | error_len u16 | async_state u32
         | seed u64 | error_text u8[1000]
 actions N x the STEP_REQ action field (its dtype and shape: an integer, an integer array or an
         f32/f64 array of any shape)
 results N x StepResult (packed, the codec's layout)
 finals  N x StepResult (SAME_STEP final results)
```

The server writes actions (in the action field's own dtype and shape: Discrete, MultiDiscrete
or Box; a worker hands its envs what an env in process gets, through the runtime's one decoding,
``core.action_values``), publishes every worker's ``cmd`` word (FUTEX_WAKE only if that worker
sleeps), then waits on each ``done`` word (spin, then FUTEX_WAIT slices with a liveness check
of the worker's pid: a dead worker is found within one slice, never a hang). A worker waits on
its ``cmd`` word the same way, checking the server's pid: an orphaned worker exits. Each worker runs
its envs with a ``LocalEnvs`` (the auto-reset rule is ``Runner.step_one``, once). A worker
that died is replaced by a new process with fresh envs from the factory; its envs' failures
name them (``env i: worker process k (pid P, envs a..b) died``) and ``restore`` resets the
fresh envs: the next request works.

OBSERVE info maps ride in the control records' error_text area; one that does not fit (a
rendered frame) is marked ``INFO_PIPED`` there and sent, after the worker's done word, through
the worker's pipe (one ``multiprocessing.Pipe`` per worker, in env order).
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import numpy as np

from transport import native
from transport.codec import Schema, StructCodec
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
    row_bytes,
    with_traceback,
)
from transport.runtime.env import Env, Spaces
from transport.runtime.local import LocalEnvs

_FATES = {1: FATE_RESET, 2: FATE_RECREATED, 3: FATE_RECREATED + " in a new worker process"}


# -- worker processes ----------------------------------------------------------------------------

READY, CLOSED = 1, 2
OP_STEP, OP_RESET, OP_RESTORE, OP_CLOSE, OP_OBSERVE, OP_ASYNC = 1, 2, 3, 4, 5, 6
# an env's async_state word (asynchronous batches): the server sets PENDING, its worker DONE
IDLE, PENDING, DONE = 0, 1, 2
ASYNC_SPIN = 4  # polls of the DONE words before ``poll`` sleeps on the doorbell
WAKE_AT = 12  # u32: the doorbell value the server waits for (workers below it do not wake it)
DOORBELL = 8  # u32 at this offset of the first block: bumped by a worker per finished env
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
_W_CMD, _W_DONE, _W_OP, _W_ARG, _W_MODE, _W_OK = range(6)  # u32 words of a worker block


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
        self.cmd = [native.word(buf, BLOCK * (1 + k)) for k in range(workers)]
        self.done = [native.word(buf, BLOCK * (1 + k) + 4) for k in range(workers)]
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
        envs = [factory() for _ in range(lo, hi)]
        local = LocalEnvs(envs, codec, lay.results[lo:hi], lay.finals[lo:hi], factory, base=lo)
        block[_W_OK] = 1
    except Exception as exc:
        _write_error(ctl[lo], describe(exc))
        block[_W_OK] = 0
        native.publish(lay.done[k], 1)
        return
    ctx = _wait_ctx(parent_pid, spin, lay.state)
    native.publish(lay.done[k], 1)  # ready
    last = 0
    mode = AutoReset.DISABLED

    def step_pending() -> None:
        """Step every env of this worker that the server marked PENDING (asynchronous
        batches), each reported as soon as it finishes; again until none is pending."""
        found = True
        while found:
            found = False
            for j in range(hi - lo):
                i = lo + j
                if native.load_acquire(lay.async_state[i]) != PENDING:
                    continue
                found = True
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

    wait = native.lib.tp_wait_change
    while True:
        rc = int(wait(ctx, lay.cmd[k], last, 1_000_000_000))
        if rc == native.TIMEOUT:
            continue
        if rc < 0:  # CLOSED, or the server died
            return
        last = rc
        op = int(block[_W_OP])
        if op == OP_ASYNC:
            mode = AutoReset(int(block[_W_MODE]))
            step_pending()
            continue
        if op == OP_CLOSE:
            local.close_envs()
            native.publish(lay.done[k], rc)
            return
        mine = ctl[lo:hi]
        piped: list[bytes] = []  # OBSERVE info maps too large for a control record
        skip = (mine["flags"] & SKIP) != 0 if op == OP_STEP else None
        mine["flags"] = 0
        failures: Failures = []
        if op == OP_STEP:
            actions, mode = lay.actions[lo:hi], AutoReset(int(block[_W_MODE]))
            if skip is not None and skip.any():
                ended, failures = local.step_except(actions, mode, skip)
            else:
                ended, failures = local.step(actions, mode)
            for i in ended:
                mine[i]["flags"] = ENDED
        elif op == OP_RESET:
            seeds = [
                int(s) if h else None
                for s, h in zip(mine["seed"].tolist(), mine["has_seed"].tolist(), strict=True)
            ]
            failures = local.reset(seeds)
        elif op == OP_RESTORE:
            i = int(block[_W_ARG]) - lo
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
        native.publish(lay.done[k], rc)
        for data in piped:  # in env order, read by the server after the done word
            pipe.send_bytes(data)
        step_pending()  # sent while this worker did something else (a RESTORE)


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

    Results land in the pool's shared mapping and are copied (one assignment of N records) into
    ``dest`` (an (N,) record array with the codec's field names: the rows the runtime reads);
    SAME_STEP final results are copied into ``finals``.
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
        spin: int = 2_000,
        start_timeout: float = 60.0,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        if num_envs < 1:
            raise ValueError("num_envs must be at least 1")
        super().__init__(schema[result_struct], dest, finals, num_envs)
        self.factory = factory
        self.schema = schema
        self.result_struct = result_struct
        self.workers = min(workers, num_envs)
        self.spin = spin
        self.start_timeout = start_timeout
        self._ranges = _split(num_envs, self.workers)
        self._owner = [k for k, (lo, hi) in enumerate(self._ranges) for _ in range(lo, hi)]
        self._spaces: Spaces | None = None
        self._closed = False
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
        self._ctxs: list[Any] = [None] * self.workers
        self._pipes: list[Any] = [None] * self.workers  # worker k -> server: large info maps
        self._seq = [0] * self.workers
        self._recreated: set[int] = set()
        self._dest_bytes: np.ndarray | None = None  # (N, size) byte views: _copy_results
        self._pool_bytes: np.ndarray | None = None
        try:
            for k in range(self.workers):
                self._spawn(k)
            for k in range(self.workers):
                self._await_start(k)
        except BaseException:
            self.close()
            raise

    # -- processes ---------------------------------------------------------------------------

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
            ctl = self.lay.ctl[lo]
            text = bytes(ctl["error_text"][: int(ctl["error_len"])]).decode("utf-8", "replace")
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

    def _run(self, op: int, workers: Sequence[int], arg: int = 0, mode: int = 0) -> list[int]:
        """Send ``op`` to ``workers`` and wait for each; returns the workers that died."""
        if self._closed:
            raise TransportError("the worker pool is closed")
        for k in workers:
            block = self.lay.blocks[k]
            block[_W_OP] = op
            block[_W_ARG] = arg
            block[_W_MODE] = mode
            self._seq[k] = (self._seq[k] + 1) & native.SEQ_MASK
            native.publish(self.lay.cmd[k], self._seq[k])
        dead = []
        for k in workers:
            rc = native.lib.tp_wait_value(self._ctxs[k], self.lay.done[k], self._seq[k], -1)
            if rc != native.OK:
                dead.append(k)
        return dead

    def _died(self, dead: list[int], failures: Failures) -> None:
        """Replace each dead worker; its envs fail with a text naming them."""
        for k in dead:
            proc = self._procs[k]
            proc.join(timeout=1.0)
            code = proc.exitcode
            how = f"exit code {code}" if code is not None else "no exit code"
            envs = self._describe(k)
            for i in self.env_ids(k):
                text = f"env {i}: worker process {k} (pid {proc.pid}, envs {envs}) died ({how})"
                failures.append((i, RequestError(ErrorCode.ENV_ERROR, text)))
                self._recreated.add(i)
            self._spawn(k)
            self._await_start(k)
        failures.sort(key=lambda f: f[0])

    def _collect(self, failures: Failures, skip: set[int]) -> list[int]:
        ctl = self.lay.ctl
        flags = ctl["flags"]
        ended = []
        for i in np.flatnonzero(flags).tolist():
            if self._owner[i] in skip:
                continue
            if flags[i] & FAILED:
                text = bytes(ctl[i]["error_text"][: int(ctl[i]["error_len"])]).decode(
                    "utf-8", "replace"
                )
                failures.append((i, RequestError(ErrorCode.ENV_ERROR, f"env {i}: {text}")))
            if flags[i] & ENDED:
                ended.append(i)
        return ended

    def _copy_results(self) -> None:
        """The pool's N results into the runtime's rows: one byte copy per row when both have
        the codec's layout (NumPy copies structured records field by field, several times
        slower)."""
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
            self._spaces = self.factory().spaces()
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
        if skip is not None:
            self.lay.ctl["flags"] = np.where(skip, SKIP, 0)
        dead = self._run(OP_STEP, range(self.workers), mode=int(mode))
        failures: Failures = []
        ended = self._collect(failures, set(dead))
        self._copy_results()
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
        for i in ids:
            native.store_release(states[i], PENDING)
            pending.add(i)
            workers.add(self._owner[i])
        for k in workers:
            block = self.lay.blocks[k]
            block[_W_OP] = OP_ASYNC
            block[_W_MODE] = int(mode)
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
            text = bytes(record["error_text"][: int(record["error_len"])]).decode(
                "utf-8", "replace"
            )
            return i, False, RequestError(ErrorCode.ENV_ERROR, f"env {i}: {text}")
        self.records[i][...] = self.lay.result_records[i]
        ended = bool(flags & ENDED)
        if ended:
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
        self.records[index][...] = self.lay.result_records[index]
        return (_FATES[code], True) if code else (FATE_FAILED, False)

    def close(self) -> None:
        """Stop every worker (CLOSED wakes them; stragglers are killed) and unmap."""
        if self._closed:
            return
        self._closed = True
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

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
