"""The shm:// client: attach to a server's region, take its lease, and exchange requests
through the slots (docs/shm.md). Results are NumPy views straight into the slots."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from transport import native
from transport.backends.shm.region import (
    CB,
    CONTROL_SIZE,
    ERROR_TEXT_MAX,
    INFO_MAX,
    LAYOUT_VERSION,
    MAGIC,
    SLOT,
    SLOT_SIZE,
    Region,
    RegionMismatchError,
    RegionState,
    ShmUrl,
    SlotCommand,
    WaitPolicy,
    final_views,
    own_start_time,
    parse_url,
    region_size,
    result_dtype,
    result_views,
    slots_size,
    wait_ctx,
)
from transport.client import DEFAULT_TIMEOUT, Client, StepView
from transport.codec import Schema
from transport.errors import (
    ConnectError,
    EnvError,
    FingerprintMismatchError,
    PeerGoneError,
    RemoteError,
    TransportError,
    TransportTimeoutError,
    ValueRangeError,
    VersionMismatchError,
)
from transport.protocol import AutoReset, ErrorCode
from transport.runtime.env import Spaces

log = logging.getLogger("transport.shm")
U64 = (1 << 64) - 1
_CLIENT_PID_WORD = CB["client_pid"].offset // 4


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
        self._ctx = wait_ctx(region, self.policy, self._seqs)
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
        batch = result_views(region, self._dtype)
        self._batch_view = StepView(batch)
        self._single_view = StepView(batch[0, ...])
        self._same_step = False
        if region.has_finals:
            self._final_seqs, finals = final_views(region, self._dtype)
            self._final_views = [StepView(finals[i, ...]) for i in range(n)]
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
