"""shm://name?num_envs=N: POSIX shared memory + futex, zero copy (region and protocol: docs/shm.md).

The server creates ``/dev/shm/transport-<name>`` and hands each env a 0-d record view of its
own slot, so ``step_into`` writes the result where the client reads it. The client writes the
actions into the slots, publishes every slot's request sequence, rings the doorbell once and
waits (spin, then FUTEX_WAIT slices with liveness checks, all in C with the GIL released) for
every response sequence. ``step`` returns NumPy views straight into the mapping.

One client per region at a time: the client takes a lease (``client_pid``, CAS 0 -> pid); the
server reclaims the lease of a dead client, so another client can attach.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import numpy as np

from transport import native
from transport.client import DEFAULT_TIMEOUT, Client, StepView
from transport.codec import Schema, StructCodec
from transport.errors import (
    ConnectError,
    EnvError,
    FingerprintMismatchError,
    PeerGoneError,
    ProtocolError,
    RemoteError,
    TransportError,
    TransportTimeoutError,
    ValueRangeError,
    VersionMismatchError,
)
from transport.protocol import DEFAULT_MAX_BODY, AutoReset, ErrorCode, RequestError
from transport.server import EnvGroup, Spaces
from transport.shm import (
    CB,
    CONTROL_SIZE,
    ERROR_TEXT_MAX,
    FINAL_SEQ_OFFSET,
    FINAL_SIZE,
    INFO_MAX,
    LAYOUT_VERSION,
    MAGIC,
    RESULT_OFFSET,
    SLOT,
    SLOT_SIZE,
    Region,
    RegionState,
    ShmUrl,
    SlotCommand,
    WaitPolicy,
    finals_offset,
    inspect_segment,
    own_start_time,
    parse_url,
    region_size,
    slots_size,
    write_text,
)
from transport.workers import LocalEnvs, describe

log = logging.getLogger("transport.shm")
U64 = (1 << 64) - 1
_CLIENT_PID_WORD = CB["client_pid"].offset // 4


class RegionMismatchError(ProtocolError):
    """A control-block field of the region differs from what this side expects."""

    def __init__(self, url: str, field: str, expected: object, found: object) -> None:
        self.field = field
        self.expected = expected
        self.found = found
        super().__init__(f"{url}: control block field {field}: expected {expected}, found {found}")


# -- the StepResult as a view of the slots ---------------------------------------------------


def result_dtype(schema: Schema) -> np.dtype[Any]:
    """The STEP_RESP struct's fields at their slot offsets (relative to slot byte 16)."""
    body = schema.ir.messages["STEP_RESP"].body
    if body is None:
        raise ProtocolError(f"schema {schema.name} has no STEP_RESP body struct")
    codec = schema[body]
    names, formats, offsets = [], [], []
    slot_dtype = pac_slot_dtype()
    for f in codec.ir.fields:
        slot_field = SLOT.get(f.name)
        if slot_field is None or slot_field.offset < RESULT_OFFSET:
            raise ProtocolError(
                f"shm:// cannot carry {codec.ir.name}.{f.name}: the pac_shm Slot has no such field"
            )
        if (slot_field.elem, slot_field.count) != (f.elem, f.count) and not (
            f.kind == "enum" or f.kind == "bool"
        ):
            raise ProtocolError(
                f"shm:// cannot carry {codec.ir.name}.{f.name}: {f.type} in the schema, "
                f"{slot_field.type} in the pac_shm Slot"
            )
        names.append(f.name)
        formats.append(slot_dtype[f.name])
        offsets.append(slot_field.offset - RESULT_OFFSET)
    itemsize = max(o + np.dtype(fm).itemsize for o, fm in zip(offsets, formats, strict=True))
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": itemsize})


def pac_slot_dtype() -> np.dtype[Any]:
    from transport.generated import pac_shm

    return pac_shm.Slot.dtype


def result_views(region: Region, dtype: np.dtype[Any]) -> tuple[np.ndarray, list[np.ndarray]]:
    """(N,) records with row stride SLOT_SIZE, and one 0-d record per slot, into the mapping."""
    n = region.num_envs
    base = CONTROL_SIZE + RESULT_OFFSET
    batch = np.ndarray((n,), dtype=dtype, buffer=region.map, offset=base, strides=(SLOT_SIZE,))
    singles = [
        np.ndarray((), dtype=dtype, buffer=region.map, offset=base + i * SLOT_SIZE)
        for i in range(n)
    ]
    return batch, singles


def final_views(region: Region, dtype: np.dtype[Any]) -> tuple[np.ndarray, list[np.ndarray]]:
    """(N,) final_seq words and one 0-d final-result record per env (the final areas)."""
    n = region.num_envs
    base = finals_offset(n)
    seqs = np.ndarray(
        (n,), dtype="<u4", buffer=region.map, offset=base + FINAL_SEQ_OFFSET, strides=(FINAL_SIZE,)
    )
    records = [
        np.ndarray((), dtype=dtype, buffer=region.map, offset=base + i * FINAL_SIZE + RESULT_OFFSET)
        for i in range(n)
    ]
    return seqs, records


def _ctx(region: Region, policy: WaitPolicy, seqs: np.ndarray) -> Any:
    ctx = native.new_ctx()
    ctx.slots = region.base + CONTROL_SIZE
    ctx.stride = SLOT_SIZE
    ctx.n = region.num_envs
    ctx.req_off = SLOT["sem_action_ready"].offset
    ctx.resp_off = SLOT["sem_result_ready"].offset
    ctx.status_off = SLOT["status"].offset
    ctx.seqs = native.ffi.cast("uint32_t *", native.ffi.from_buffer(seqs, require_writable=True))
    ctx.doorbell = region.doorbell
    ctx.state = region.state_word
    ctx.ready_state = RegionState.READY
    policy.apply(ctx)
    return ctx


def _remote_error(code: int, text: str) -> TransportError:
    if code == ErrorCode.FINGERPRINT_MISMATCH:
        return FingerprintMismatchError(f"server refused the request: {text}")
    try:
        name = ErrorCode(code).name
    except ValueError:
        name = "UNKNOWN"
    if code == ErrorCode.ENV_ERROR:
        env, sep, _ = text.partition(":")
        index = env.removeprefix("env ")
        env_id = int(index) if sep and env.startswith("env ") and index.isdigit() else None
        return EnvError(code, name, text, env_id)
    return RemoteError(code, name, text)


# -- client ----------------------------------------------------------------------------------


def connect(
    url: str,
    *,
    schema: Schema,
    timeout: float | None = DEFAULT_TIMEOUT,
    autoreset: AutoReset = AutoReset.DISABLED,
) -> ShmClient:
    return ShmClient(url, schema, timeout=timeout, autoreset=autoreset)


class ShmClient(Client):
    """``transport.connect("shm://name")``: the Client API over a shared-memory region.

    Results are views into the region: ``observation`` of an N-env step is an (N, 612) float32
    view whose row stride is the slot size. They stay valid until the next call; ``copy=True``
    returns owned arrays. ``torch.from_numpy(result.observation)`` shares the memory too.

    ``autoreset``: the session's auto-reset mode, sent with the HELLO slot command at connect
    (docs/shm.md "Auto-reset"). With SAME_STEP, ``finals`` lists (env index, StepView) of the
    episodes that ended in the last step: views of the region's final-result areas (no copy),
    valid until that env's next episode ends; the step's own result holds the reset.
    """

    def __init__(
        self,
        url: str,
        schema: Schema,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        wait: WaitPolicy | str | None = None,
        autoreset: AutoReset = AutoReset.DISABLED,
    ) -> None:
        self.url = url
        self.schema = schema
        self.shm: ShmUrl = parse_url(url)
        self.policy = WaitPolicy.resolve(wait) if wait is not None else self.shm.wait
        self.timeout = timeout
        self._timeout_ns = -1 if timeout is None else int(timeout * 1e9)
        self._closed = True
        self._leased = False
        self.autoreset = AutoReset.DISABLED
        self.finals: list[tuple[int, StepView]] = []
        self.region = self._open(10.0 if timeout is None else timeout)
        try:
            self._validate()
            self._take_lease(10.0 if timeout is None else timeout)
            self._setup()
            self._closed = False
            if autoreset != AutoReset.DISABLED:
                self._hello(autoreset)
        except BaseException:
            self._closed = True
            self._release()
            raise

    def _hello(self, mode: AutoReset) -> None:
        """Ask for an auto-reset mode: HELLO in every slot, the mode in ``action``."""
        url = f"shm://{self.shm.name}"
        if mode == AutoReset.SAME_STEP and not self.region.has_finals:
            raise ConnectError(
                f"{url}: the region has no final-result areas (a server without auto-reset "
                "support): same_step needs them"
            )
        self._actions[:] = int(mode)
        try:
            self._exchange(SlotCommand.HELLO)
        except RemoteError as exc:
            raise ConnectError(
                f"{url}: the server refused auto-reset mode {mode.name.lower()}: {exc}"
            ) from exc
        self.autoreset = mode
        self.server_info["autoreset"] = mode.name.lower()
        self._same_step = mode == AutoReset.SAME_STEP

    # -- attach ------------------------------------------------------------------------------

    def _open(self, timeout: float) -> Region:
        deadline = time.monotonic() + timeout
        delay = 0.002
        why = ""
        while True:
            try:
                fd = native.shm_open(self.shm.segment)
            except FileNotFoundError:
                why = f"no region {self.shm.path}: is a server running on shm://{self.shm.name}?"
            except PermissionError as exc:
                raise ConnectError(f"cannot open {self.shm.path}: {exc.strerror}") from exc
            else:
                try:
                    size = os.fstat(fd).st_size
                    if size >= CONTROL_SIZE:
                        region = Region(self.shm.segment, fd, size, owner=False)
                        state = region.state
                        if state == RegionState.READY:
                            return region
                        region.close()
                        why = f"{self.shm.path} is not ready (state {state})"
                    else:
                        why = f"{self.shm.path} has no control block yet ({size} bytes)"
                finally:
                    os.close(fd)
            if time.monotonic() + delay > deadline:
                raise ConnectError(why)
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _validate(self) -> None:
        region, url = self.region, f"shm://{self.shm.name}"
        cb = region.get

        def expect(field: str, expected: int, found: int, hexa: bool = False) -> None:
            if expected != found:
                fmt = (lambda v: f"0x{v:08X}") if hexa else str
                raise RegionMismatchError(url, field, fmt(expected), fmt(found))

        expect("magic", MAGIC, cb("magic"), hexa=True)
        if cb("version") != LAYOUT_VERSION:
            raise VersionMismatchError(
                f"{url}: control block field version: expected layout version {LAYOUT_VERSION}, "
                f"found {cb('version')} (server and client were built from different pac_shm "
                "layouts)"
            )
        expect("slot_size", SLOT_SIZE, cb("slot_size"))
        fingerprint = cb("fingerprint")
        if fingerprint != self.schema.fingerprint:
            raise FingerprintMismatchError(
                f"{url}: control block field fingerprint: expected {self.schema.fingerprint:016x} "
                f"(schema {self.schema.name}), found {fingerprint:016x}",
                local=self.schema.fingerprint,
                remote=fingerprint,
            )
        num_envs = cb("num_envs")
        if self.shm.num_envs is not None:
            expect("num_envs", self.shm.num_envs, num_envs)
        if region.size != slots_size(num_envs):  # no final areas: an older server's region
            expect("region size", region_size(num_envs), region.size)
        dtype = result_dtype(self.schema)
        obs = SLOT["observation"].count
        mask = SLOT["action_mask"].count
        if "observation" in (dtype.names or ()):
            expect("obs_size", obs, cb("obs_size"))
        if "action_mask" in (dtype.names or ()):
            expect("act_size", mask, cb("act_size"))
        owner, start = cb("owner_pid"), cb("owner_start_time")
        if not native.peer_alive(owner, start):
            raise ConnectError(
                f"{url} is stale: its server (pid {owner}) is gone; start a new server or run "
                "`transport-serve --cleanup-shm`"
            )
        self.owner_pid = owner
        self.owner_start = start
        self.num_envs = num_envs
        self._dtype = dtype

    def _take_lease(self, timeout: float) -> None:
        region = self.region
        me = os.getpid()
        deadline = time.monotonic() + timeout
        while True:
            if native.compare_exchange(region.client_pid_word, 0, me):
                region.set("client_start_time", own_start_time())
                self._leased = True
                return
            holder = region.get("client_pid")
            holder_start = region.get("client_start_time")
            if holder and native.peer_alive(holder, holder_start):
                who = "this process" if holder == me else f"client pid {holder}"
                raise ConnectError(
                    f"shm://{self.shm.name} is in use by {who}: a region serves one client at a "
                    "time (start another server for another client)"
                )
            if time.monotonic() >= deadline:
                raise ConnectError(
                    f"shm://{self.shm.name}: the lease of dead client pid {holder} was not "
                    "reclaimed by the server in time"
                )
            time.sleep(0.01)

    def _setup(self) -> None:
        region, n = self.region, self.num_envs
        self._seqs = np.ascontiguousarray(region.strided("sem_action_ready"), dtype=np.uint32)
        self._seqs &= native.SEQ_MASK
        self._ctx = _ctx(region, self.policy, self._seqs)
        self._ctx.doorbell_seq = native.load_acquire(region.doorbell) & native.SEQ_MASK
        self._ctx.peer_pid = self.owner_pid
        self._ctx.peer_start = self.owner_start
        self._commands = region.strided("command")
        self._actions = region.strided("action")
        self._has_seed = region.strided("has_seed")
        self._seeds = region.strided("seed")
        self._status = region.strided("status")
        self._error_len = region.strided("error_len")
        self._error_text = region.strided("error_text")
        self._last_cmd = -1
        batch, singles = result_views(region, self._dtype)
        self._batch_view = StepView(batch)
        self._single_view = StepView(singles[0])
        self._same_step = False
        if region.has_finals:
            self._final_seqs, finals = final_views(region, self._dtype)
            self._final_views = [StepView(record) for record in finals]
        self._roundtrip = native.lib.tp_client_roundtrip
        info_len = int(region.slots[0]["info_len"])
        info: dict[str, Any] = {}
        if 0 < info_len <= INFO_MAX:
            try:
                info = dict(msgpack.unpackb(region.slots[0]["info"][:info_len].tobytes()))
            except Exception:
                info = {}
        info["num_envs"] = n
        info["autoreset"] = AutoReset.DISABLED.name.lower()  # until a HELLO command asks
        self.server_info = info

    # -- requests ----------------------------------------------------------------------------

    def _exchange(self, command: int, timeout_ns: int | None = None) -> None:  # type: ignore[override]
        if self._closed:
            raise TransportError("the client is closed")
        if command != self._last_cmd:
            self._commands[:] = command
            self._last_cmd = command
        rc = self._roundtrip(self._ctx, self._timeout_ns if timeout_ns is None else timeout_ns)
        if rc:
            self._raise(rc)

    def _raise(self, rc: int) -> None:
        url = f"shm://{self.shm.name}"
        if rc > 0:
            i = rc - 1
            length = min(int(self._error_len[i]), ERROR_TEXT_MAX)
            text = self._error_text[i, :length].tobytes().decode("utf-8", "replace")
            raise _remote_error(int(self._status[i]), text)
        if rc == native.TIMEOUT:
            raise TransportTimeoutError(f"{url}: no response within {self.timeout} s")
        if rc == native.PEER_DEAD:
            raise PeerGoneError(f"{url}: the server (pid {self.owner_pid}) died")
        if rc == native.CLOSED:
            raise PeerGoneError(f"{url}: the server closed the region")
        raise TransportError(f"{url}: futex wait failed ({os.strerror(native.ffi.errno)})")

    def reset(self, seed: int | None = None, *, copy: bool = False) -> StepView:
        """Reset every env (env i gets ``seed + i``); fields have a leading env axis if N > 1."""
        if seed is None:
            self._has_seed[:] = 0
        else:
            if not 0 <= seed <= U64:
                raise ValueRangeError(f"seed {seed} does not fit u64", field="seed")
            self._seeds[:] = [(seed + i) & U64 for i in range(self.num_envs)]
            self._has_seed[:] = 1
        if self.finals:
            self.finals = []
        self._exchange(SlotCommand.RESET)
        view = self._single_view if self.num_envs == 1 else self._batch_view
        return view.copy() if copy else view

    def step(self, actions: int | Sequence[int] | np.ndarray, *, copy: bool = False) -> StepView:
        """Step with one action (1-env server) or one per env (fields get a leading env axis)."""
        if isinstance(actions, int | np.integer):
            if self.num_envs != 1:
                raise ValueError(f"this server has {self.num_envs} envs: pass one action per env")
            self._actions[0] = actions
            self._step()
            return self._single_view.copy() if copy else self._single_view
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")
        self._actions[:] = actions
        self._step()
        return self._batch_view.copy() if copy else self._batch_view

    def _step(self) -> None:
        if self.finals:
            self.finals = []
        self._exchange(SlotCommand.STEP)
        if self._same_step:  # the server stamped final_seq = this request's sequence
            ended = np.flatnonzero(self._final_seqs == self._seqs)
            if ended.size:
                views = self._final_views
                self.finals = [(i, views[i]) for i in ended.tolist()]

    def spaces(self) -> Spaces:
        return Spaces(self.region.get("obs_size"), self.region.get("act_size"))

    def health(self) -> bool:
        """The region is READY and its server alive (no round trip needed)."""
        if self._closed:
            raise TransportError("the client is closed")
        return self.region.state == RegionState.READY and native.peer_alive(
            self.owner_pid, self.owner_start
        )

    @property
    def wait_stats(self) -> tuple[int, int]:
        """(FUTEX_WAKE calls, FUTEX_WAIT calls) this client made: how often it slept."""
        return int(self._ctx.wakes), int(self._ctx.sleeps)

    def close(self) -> None:
        """Say SHUTDOWN (the server drops this session's envs), release the lease, unmap."""
        if self._closed:
            return
        if self.region.state == RegionState.READY and native.peer_alive(
            self.owner_pid, self.owner_start
        ):
            try:
                self._exchange(SlotCommand.SHUTDOWN, timeout_ns=int(1e9))
            except TransportError:
                pass
        self._closed = True
        self._release()

    def _release(self) -> None:
        region = getattr(self, "region", None)
        if region is None:
            return
        if self._leased:
            region.set("client_start_time", 0)
            native.compare_exchange(region.client_pid_word, os.getpid(), 0)
            self._leased = False
        self.finals = []
        for name in (
            "_batch_view",
            "_single_view",
            "_commands",
            "_actions",
            "_status",
            "_final_seqs",
            "_final_views",
        ):
            if hasattr(self, name):
                delattr(self, name)
        region.close()

    def __enter__(self) -> ShmClient:
        return self

    def __del__(self) -> None:
        try:
            if not self._closed:
                self.close()
        except Exception:
            pass


# -- server ----------------------------------------------------------------------------------


class _Session:
    """One lease's envs (made by the SessionFactory) stepping in place in the slots.

    The envs run in a runner (``transport.workers``): ``LocalEnvs`` writes each result straight
    into its slot (zero copy) and SAME_STEP final results into the env's final area; a
    ``WorkerPool`` (``--workers K``) steps them in K processes and its results are copied into
    the slots in one assignment.
    """

    def __init__(self, listener: Listener, client_pid: int) -> None:
        session = listener.sessions()
        self.session = session  # keeps a worker pool alive (closed when the session is dropped)
        self.client_pid = client_pid
        self.autoreset = AutoReset.DISABLED
        self.lock = session.group.lock
        self.first_seed = session.first_seed
        self.pool = session.pool
        self.runner: Any
        if session.pool is not None:
            session.pool.dest = listener.results  # gathered results go straight to the slots
            self.runner = session.pool
        else:
            self.runner = LocalEnvs(
                session.group.envs,
                listener.result_codec,
                listener.records,
                listener.final_records,
                session.factory,
            )
        self.group = EnvGroup(
            session.group.envs, listener.result_codec, listener.results, self.lock
        )
        self.final_records = listener.final_records

    def recover(
        self, failures: list[tuple[int, Exception]], seeds: list[int | None]
    ) -> RequestError:
        """Reset (or recreate) each env that raised; the error to answer (as Session._recover)."""
        texts = []
        group = self.group
        for index, exc in failures:
            if isinstance(exc, RequestError):
                detail = exc.text.removeprefix(f"env {index}: ")
            else:
                detail = describe(exc)
            fate, ok = self.runner.restore(index, seeds[index])
            if ok:
                group.mark_reset(index)
            else:  # every step is NOT_RESET until a reset succeeds
                group.was_reset[index] = False
                group.all_reset = False
            texts.append(f"env {index}: {detail} ({fate})")
        return RequestError(ErrorCode.ENV_ERROR, "; ".join(texts))


class Listener:
    """Creates the region and serves it: one thread, one client lease at a time."""

    def __init__(self, url: str, sessions: Any, *, max_body: int = DEFAULT_MAX_BODY) -> None:
        self.url = url
        self.shm = parse_url(url)
        self.sessions = sessions
        self.schema: Schema = sessions.schema
        n = self.shm.num_envs
        if n is not None and n != sessions.num_envs:
            if sessions.num_envs != 1 or getattr(sessions, "_factory", None) is None:
                raise ConnectError(
                    f"{url} asks for {n} envs but the server was given num_envs={sessions.num_envs}"
                )
            sessions.num_envs = n  # the URL's num_envs wins over the default of 1
        self.num_envs: int = sessions.num_envs
        self.region: Region | None = None
        self._closed = threading.Event()
        self._stopped = threading.Event()
        self._serving = False
        self.session: _Session | None = None
        self._spare: _Session | None = None

    # -- creation ----------------------------------------------------------------------------

    def start(self) -> None:
        """Create the region (replacing a stale one, never a live one) and mark it READY."""
        dtype = result_dtype(self.schema)
        body = self.schema.ir.messages["STEP_RESP"].body
        assert body is not None
        self.result_codec: StructCodec = self.schema[body]
        size = region_size(self.num_envs)
        fd = self._create(size)
        try:
            region = Region(self.shm.segment, fd, size, owner=True, num_envs=self.num_envs)
        finally:
            os.close(fd)
        self.region = region
        region.set("owner_pid", os.getpid())
        region.set("owner_start_time", own_start_time())
        try:
            self.results, self.records = result_views(region, dtype)
            self._final_seqs, self.final_records = final_views(region, dtype)
            self._spare = _Session(self, 0)  # the first client's envs, made before READY
            spaces = self._spare.group.spaces
            obs_n, act_n = SLOT["observation"].count, SLOT["action_mask"].count
            if (spaces.obs_n, spaces.act_n) != (obs_n, act_n):
                raise ConnectError(
                    f"shm:// needs envs with {obs_n} observations and {act_n} actions (the "
                    f"pac_shm slot); this env has {spaces.obs_n} and {spaces.act_n}"
                )
            for field, value in (
                ("magic", MAGIC),
                ("version", LAYOUT_VERSION),
                ("num_envs", self.num_envs),
                ("obs_size", obs_n),
                ("act_size", act_n),
                ("slot_size", SLOT_SIZE),
                ("fingerprint", self.schema.fingerprint),
            ):
                region.set(field, value)
            info = msgpack.packb(
                {"env": self.sessions.env_name, "server": self.sessions.server_lang}
            )[:INFO_MAX]
            region.slots[0]["info"][: len(info)] = np.frombuffer(info, dtype=np.uint8)
            region.slots[0]["info_len"] = len(info)
        except BaseException:
            self._remove()
            raise
        self._seqs = np.zeros(self.num_envs, dtype=np.uint32)
        self._pending = np.zeros(self.num_envs, dtype=np.uint8)
        self._same_cmd = native.ffi.new("int32_t *")
        self._pending_ptr = native.ffi.cast(
            "uint8_t *", native.ffi.from_buffer(self._pending, require_writable=True)
        )
        self._ctx = _ctx(region, self.shm.wait, self._seqs)
        self._actions = region.strided("action")
        self._has_seed = region.strided("has_seed")
        self._slot_seeds = region.strided("seed")
        self._commands = region.strided("command")
        self._status = region.strided("status")
        self._error_len = region.strided("error_len")
        self._error_text = region.strided("error_text")
        self._doorbell_at_start = native.load_acquire(region.doorbell) & native.SEQ_MASK
        native.store_release(region.state_word, RegionState.READY)  # last: the region is ready

    def _create(self, size: int) -> int:
        url = f"shm://{self.shm.name}"
        free = _free_shm_bytes()
        if 0 <= free < size:  # refuse before posix_fallocate eats what is left of /dev/shm
            raise ConnectError(_no_room(self.shm.path, size, self.num_envs, free, "no space"))
        for _ in range(3):
            try:
                return native.shm_create(self.shm.segment, size)
            except FileExistsError:
                try:
                    info = inspect_segment(self.shm.path)
                except FileNotFoundError:
                    continue
                if not info.stale:
                    who = f"pid {info.owner_pid}" if info.owner_pid else "a server starting up"
                    raise ConnectError(
                        f"{url} is in use by a live server ({who}); {self.shm.path} is not replaced"
                    ) from None
                log.warning("replacing stale region %s (owner pid %s)", info.path, info.owner_pid)
                try:
                    native.shm_unlink(self.shm.segment)
                except FileNotFoundError:
                    pass
            except OSError as exc:
                raise ConnectError(
                    _no_room(self.shm.path, size, self.num_envs, _free_shm_bytes(), exc.strerror)
                ) from exc
        raise ConnectError(f"{url}: could not replace the stale region {self.shm.path}")

    # -- serving -----------------------------------------------------------------------------

    def serve_forever(self) -> None:
        region = self.region
        assert region is not None, "call start() first"
        self._serving = True
        wait = native.lib.tp_wait_change
        ctx, doorbell = self._ctx, region.doorbell
        idle_ns = int(max(self.shm.wait.futex_slice_ms, 1.0) * 1e6)
        spin, idle = ctx.spin, False  # spin before each request; not once idle for a slice
        last = self._doorbell_at_start  # read before READY: a ring right after it is seen
        try:
            while not self._closed.is_set():
                rc = wait(ctx, doorbell, last, idle_ns)
                if rc >= 0:
                    last = rc
                    if idle:
                        ctx.spin, idle = spin, False
                    self._serve_batch()
                elif rc == native.TIMEOUT:
                    ctx.spin, idle = 0, True  # idle: sleep in FUTEX_WAIT, never burn a core
                    self._housekeeping()
                elif rc == native.CLOSED:
                    return
                else:
                    log.error(
                        "futex wait failed on %s: %s", self.url, os.strerror(native.ffi.errno)
                    )
                    time.sleep(0.01)
        finally:
            self._stopped.set()

    def _serve_batch(self) -> None:
        region = self.region
        assert region is not None
        count = native.lib.tp_server_pending(
            self._ctx, self._pending_ptr, SLOT["command"].offset, self._same_cmd
        )
        if count == 0:
            return
        pid = int(region.words[_CLIENT_PID_WORD])
        session = self.session
        if session is None or session.client_pid != pid:
            session = self._new_session(pid) if pid else None
        cmd = int(self._same_cmd[0])
        status = 0
        try:
            if session is None:
                raise RequestError(ErrorCode.HELLO_REQUIRED, "take the region's lease first")
            if count == self.num_envs and cmd == SlotCommand.STEP:
                self._step_all(session)
            elif count == self.num_envs and cmd == SlotCommand.RESET:
                self._reset_all(session)
            elif count == self.num_envs and cmd == SlotCommand.HELLO:
                session.autoreset = self._mode(0)
            elif cmd == SlotCommand.SHUTDOWN:
                self.session = None
            else:
                self._mixed(session)
                status = -1  # statuses written per slot
        except RequestError as exc:
            status = int(exc.code)
            self._error(exc.text)
        except Exception as exc:  # a bug must not take the server down (env errors: recover)
            status = int(ErrorCode.INTERNAL)
            self._error(describe(exc))
        native.lib.tp_server_publish(self._ctx, self._pending_ptr, status)

    def _error(self, text: str) -> None:
        for i in np.flatnonzero(self._pending):
            self._error_len[i] = write_text(self._error_text[i], text)

    def _new_session(self, pid: int) -> _Session:
        session = self._spare if self._spare is not None else _Session(self, pid)
        self._spare = None
        session.client_pid = pid
        self.session = session
        return session

    def _mode(self, index: int) -> AutoReset:
        try:
            return AutoReset(int(self._actions[index]))
        except ValueError:
            raise RequestError(
                ErrorCode.BAD_FRAME, f"unknown auto-reset mode {int(self._actions[index])}"
            ) from None

    def _step_all(self, session: _Session) -> None:
        group, mode = session.group, session.autoreset
        next_step = mode == AutoReset.NEXT_STEP
        if self.num_envs == 1:
            action = int(self._actions[0])
            if not (next_step and group.is_done(0)):
                group.check_action(0, action)
            actions: list[int] = [action]
        else:
            group.check_actions(self._actions, skip_done=next_step)
            actions = self._actions.tolist()
        if session.lock is not None:
            with session.lock:
                ended, failures = session.runner.step(actions, mode)
        else:
            ended, failures = session.runner.step(actions, mode)
        for i in ended:  # stamped before the response words are published (release)
            if session.pool is not None:
                self.final_records[i][...] = session.pool.final_record(i)
            self._final_seqs[i] = self._seqs[i]
        if failures:
            raise session.recover(failures, [None] * self.num_envs)

    def _reset_all(self, session: _Session) -> None:
        first = session.first_seed if not session.group.was_reset.any() else None
        has_seed = self._has_seed.tolist()
        slot_seeds = self._slot_seeds.tolist()
        seeds: list[int | None] = [
            slot_seeds[i] if has_seed[i] else (None if first is None else first + i)
            for i in range(self.num_envs)
        ]
        if session.lock is not None:
            with session.lock:
                failures = session.runner.reset(seeds)
        else:
            failures = session.runner.reset(seeds)
        failed = {i for i, _ in failures}
        for i in range(self.num_envs):
            if i not in failed:
                session.group.mark_reset(i)
        if failures:
            raise session.recover(failures, seeds)

    def _mixed(self, session: _Session) -> None:
        """Slots with different commands, or a subset: each answered on its own."""
        for i in np.flatnonzero(self._pending).tolist():
            code = 0
            try:
                cmd = int(self._commands[i])
                if cmd == SlotCommand.SHUTDOWN:
                    self.session = None
                elif cmd == SlotCommand.HELLO:
                    session.autoreset = self._mode(i)
                elif cmd not in (SlotCommand.STEP, SlotCommand.RESET):
                    raise RequestError(ErrorCode.UNKNOWN_MESSAGE, f"slot {i}: command {cmd}")
                elif not isinstance(session.runner, LocalEnvs):
                    raise RequestError(
                        ErrorCode.BAD_BATCH,
                        f"env {i}: a worker pool steps and resets every env together",
                    )
                else:
                    self._one(session, i, cmd)
            except RequestError as exc:
                code = int(exc.code)
                self._error_len[i] = write_text(self._error_text[i], exc.text)
            except Exception as exc:
                code = int(ErrorCode.INTERNAL)
                self._error_len[i] = write_text(self._error_text[i], describe(exc))
            self._status[i] = code

    def _one(self, session: _Session, i: int, cmd: int) -> None:
        """One slot's STEP or RESET (a subset request), with the same checks and recovery."""
        runner = session.runner
        seed = int(self._slot_seeds[i]) if self._has_seed[i] else None
        try:
            if cmd == SlotCommand.RESET:
                runner.reset_one(i, seed)
                session.group.mark_reset(i)
                return
            action, mode = int(self._actions[i]), session.autoreset
            if not (mode == AutoReset.NEXT_STEP and session.group.is_done(i)):
                session.group.check_action(i, action)
            if runner.step_one(i, action, mode):
                self._final_seqs[i] = self._seqs[i]
        except RequestError as exc:
            if exc.code != ErrorCode.ENV_ERROR:
                raise
            seeds: list[int | None] = [None] * self.num_envs
            seeds[i] = seed if cmd == SlotCommand.RESET else None
            raise session.recover([(i, exc)], seeds) from None
        except Exception as exc:
            seeds = [None] * self.num_envs
            seeds[i] = seed if cmd == SlotCommand.RESET else None
            raise session.recover([(i, exc)], seeds) from None

    def _housekeeping(self) -> None:
        """Idle: reclaim the lease of a dead client (its envs are dropped)."""
        region = self.region
        if region is None:
            return
        pid = int(region.words[_CLIENT_PID_WORD])
        if pid and not native.peer_alive(pid, region.get("client_start_time")):
            log.warning("%s: client pid %d is gone; reclaiming its lease", self.url, pid)
            region.set("client_start_time", 0)
            native.compare_exchange(region.client_pid_word, pid, 0)
            if self.session is not None and self.session.client_pid == pid:
                self.session = None
        if self._spare is None and self.session is None:
            self._spare = _Session(self, 0)  # ready for the next client

    # -- shutdown ----------------------------------------------------------------------------

    def close(self) -> None:
        """Mark the region CLOSED, wake every waiter, stop serving, unlink the segment."""
        if self._closed.is_set():
            return
        self._closed.set()
        region = self.region
        if region is None:
            return
        native.store_release(region.state_word, RegionState.CLOSED)
        native.lib.tp_wake_all(self._ctx)
        if self._serving:
            self._stopped.wait(5.0)
        self._remove()

    def _remove(self) -> None:
        region = self.region
        if region is None:
            return
        try:
            if os.stat(self.shm.path).st_ino == region.inode:
                native.shm_unlink(self.shm.segment)
        except FileNotFoundError:
            pass
        for session in (self.session, self._spare):
            if session is not None:
                session.session.close()
        self.session = self._spare = None
        self.results = np.zeros(0)
        self.records = []
        self.final_records = []
        self._final_seqs = np.zeros(0, dtype=np.uint32)
        for name in ("_actions", "_has_seed", "_slot_seeds", "_commands", "_status"):
            if hasattr(self, name):
                delattr(self, name)
        self._error_len = self._error_text = np.zeros(0)
        region.close()
        self.region = None


def _no_room(path: str, size: int, num_envs: int, free: int, why: str | None) -> str:
    return (
        f"cannot create {path} ({size} bytes for {num_envs} envs): {why}; /dev/shm has {free} "
        "bytes free. Enlarge /dev/shm (docker run --shm-size=1g, or mount -o remount,size=2G "
        "/dev/shm), remove stale regions (transport-serve --cleanup-shm) or serve fewer envs"
    )


def _free_shm_bytes() -> int:
    try:
        st = os.statvfs("/dev/shm")
        return st.f_bavail * st.f_frsize
    except OSError:
        return -1


Sessions = Callable[[], Any]
