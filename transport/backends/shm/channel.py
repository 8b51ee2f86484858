"""The shm:// client: attach to a server's region, take its lease, and exchange requests
through the slots (docs/shm.md). Results are NumPy views straight into the slots."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

from transport import native
from transport.backends.base import MAX_NUM_ENVS
from transport.backends.shm.region import (
    CB,
    CONTROL,
    CONTROL_SIZE,
    INFO_SIDE,
    LAYOUT_VERSION,
    MAGIC,
    PRESETS,
    SIDE_REF,
    Region,
    RegionState,
    ShmLayout,
    ShmUrl,
    SideReader,
    SlotChecksums,
    SlotCommand,
    WaitPolicy,
    names_wait_policy,
    own_start_time,
    parse_url,
    schema_area_of,
    wait_ctx,
)
from transport.client import DEFAULT_TIMEOUT
from transport.codec import Schema, StructCodec
from transport.errors import (
    ConnectError,
    FingerprintMismatchError,
    PeerGoneError,
    ProtocolError,
    RegionInUseError,
    RegionMismatchError,
    TransportError,
    TransportTimeoutError,
    VersionMismatchError,
)
from transport.protocol import (
    DEFAULT_MAX_BODY,
    AutoReset,
    ErrorCode,
    MessageIds,
    RequestError,
    accept_hello,
    body_codec,
    carries_finals,
    encode_error,
    encode_hello_response,
    mismatch_text,
)
from transport.runtime.async_batches import (
    check_idle,
    check_recv,
    check_reset_sent,
    check_send,
)
from transport.runtime.async_session import send_env_ids
from transport.shm_segment import check_segment_fd, check_segment_path

log = logging.getLogger("transport.shm")
U64 = (1 << 64) - 1
_CLIENT_PID_WORD = CB["client_pid"].offset // 4
_LEASES: dict[int, object] = {}
"""The lease token of the channel of this process that holds each region's lease (by the
segment's inode): a channel whose lease the server took back must not release it once another
channel of this process took it again (the same pid in ``client_pid``). A token, not the
channel (nor a weak reference to it): a channel dropped without ``close()`` in a reference
cycle is finalized after the garbage collector cleared the weak references to it, and its
``__del__`` must still find the lease its own, say SHUTDOWN and release it, as ``close()`` does.
The entry goes when the channel releases its lease (``_release``)."""

_SHUTDOWN_WAIT_S = 1.0
"""How long ``close()`` waits for its SHUTDOWN to be answered (the lease goes either way)."""

_UNANSWERED: set[int] = set()
"""Regions (by the segment's inode) whose SHUTDOWN from a channel of this process went
unanswered (its close gave up: a stalled server): the next channel of this process there waits
until the server answered it, else the server (same pid) would take it for the old session."""


_STEP = int(SlotCommand.STEP)
_INTERRUPTED = int(native.lib.TP_INTERRUPTED)
"""A client wait came back to run Python's signal handlers (Ctrl-C): resume it (``_resumed``)."""
_REGION_VIEWS = (
    "_single",
    "_commands",
    "_actions",
    "_has_seed",
    "_seeds",
    "_status",
    "_error_len",
    "_error_text",
    "_info_len",
    "_info",
    "_final_seqs",
    "_final_records",
    "_finals",
    "_body_requests",
    "_request_rows",
    "_requests",
    "_request_fields",
    "_result_columns",
    "_rows",
    "_result_bytes",
    "_final_bytes",
)
"""The channel's attributes that view the region (dropped at close, see ``_release``)."""


def _ir_name(ir: bytes | None) -> str:
    """The schema name in a region's schema area ("" when it has none or it does not parse)."""
    if ir is None:
        return ""
    try:
        name = json.loads(ir).get("name", "")
    except (ValueError, AttributeError):
        return ""
    return name if isinstance(name, str) else ""


def _byte_runs(wire: np.dtype[Any], placed: np.dtype[Any]) -> list[tuple[int, int, int]]:
    """(wire offset, slot offset, length) runs that carry every field of ``wire`` from a record
    placed as ``placed`` (the slot's layout, the same field names): fields adjacent in both merge
    into one run, so a record is moved with a few byte copies, not field by field."""
    runs: list[tuple[int, int, int]] = []
    for name in sorted(wire.names or (), key=lambda name: wire.fields[name][1]):  # type: ignore[index]
        to, size = wire.fields[name][1], wire[name].itemsize  # type: ignore[index]
        at = placed.fields[name][1]  # type: ignore[index]
        if runs and runs[-1][0] + runs[-1][2] == to and runs[-1][1] + runs[-1][2] == at:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + size)
        else:
            runs.append((to, at, size))
    return runs


def _gather(
    out: np.ndarray,
    rows: np.ndarray,
    ids: np.ndarray,
    runs: list[tuple[int, int, int]],
    scratch: np.ndarray,
) -> None:
    """Records ``ids`` of ``rows`` (bytes per slot) into ``out`` (bytes per wire record): one
    gather of the rows into ``scratch`` (owned, reused: no fresh pages each call), then each run
    into place."""
    picked = scratch[: len(ids)]
    np.take(rows, ids, axis=0, out=picked, mode="clip")  # ids are slots: no bounds to raise
    for to, at, size in runs:
        out[:, to : to + size] = picked[:, at : at + size]


class _Refused(Exception):
    """A slot answered with an error status: becomes the ERROR body the client decodes."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


def open_channel(
    url: str,
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    max_body: int = DEFAULT_MAX_BODY,
    schema: Schema | None = None,
) -> ShmChannel:
    """Attach to the region of ``url``, validate it against ``schema`` and take its lease;
    ``schema`` None: the schema the region carries (its schema area; discovery)."""
    if schema is None:
        schema = read_region_schema(url, 10.0 if timeout is None else timeout)
    return ShmChannel(url, schema, timeout=timeout)


def _read_ready(shm: ShmUrl) -> tuple[bytes, int, tuple[int, bytes | None]] | str:
    """(control block, size, schema area) of a READY region, or why it cannot be read yet."""
    try:
        fd = native.shm_open(shm.segment)
    except FileNotFoundError:
        return f"no region {shm.path}: is a server running on shm://{shm.name}?"
    except PermissionError as exc:
        raise ConnectError(f"cannot open {shm.path}: {exc.strerror}") from exc
    except OSError as exc:  # EINVAL: a directory; ELOOP: a symbolic link
        check_segment_path(shm.path, exc)
        raise ConnectError(f"cannot open {shm.path}: {exc.strerror}") from exc
    try:
        size = check_segment_fd(fd, shm.path).st_size
        if size < CONTROL_SIZE:
            return f"{shm.path} has no control block yet ({size} bytes)"
        control = os.pread(fd, CONTROL_SIZE, 0)
        state = int(CONTROL.view(control)["state"])
        if state != RegionState.READY:
            return f"{shm.path} is not ready (state {state})"
        return control, size, schema_area_of(_FileBytes(fd), size)
    finally:
        os.close(fd)


def _check_owner(url: str, owner: int, start: int) -> None:
    """A region whose server is gone is stale, whatever else is wrong with it (a cut segment)."""
    if not native.peer_alive(owner, start):
        raise ConnectError(
            f"{url} is stale: its server (pid {owner}) is gone; start a new server or run "
            "`transport-serve --cleanup-shm`"
        )


class _FileBytes:
    """Slices of an open segment read with pread (no mapping, nothing but the slice read)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __getitem__(self, span: slice) -> bytes:
        return os.pread(self.fd, span.stop - span.start, span.start)


def read_region_schema(url: str, timeout: float) -> Schema:
    """The schema a region carries in its schema area, checked against the fingerprint of its
    control block (waits up to ``timeout`` for the region to be READY)."""
    from transport.protocol import schema_from_ir_text

    shm = parse_url(url)
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        found = _read_ready(shm)
        if not isinstance(found, str):
            break
        if time.monotonic() + delay > deadline:
            raise ConnectError(found)
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
    control, size, (_, ir) = found
    cb = CONTROL.view(control)
    if int(cb["magic"]) != MAGIC:
        raise RegionMismatchError(
            f"shm://{shm.name}", "magic", f"0x{MAGIC:08X}", f"0x{int(cb['magic']):08X}"
        )
    if int(cb["version"]) != LAYOUT_VERSION:
        raise VersionMismatchError(
            f"shm://{shm.name}: control block field version: expected layout version "
            f"{LAYOUT_VERSION}, found {int(cb['version'])} (server and client were built from "
            "different pac_shm layouts)"
        )
    _check_owner(f"shm://{shm.name}", int(cb["owner_pid"]), int(cb["owner_start_time"]))
    least = CONTROL_SIZE + int(cb["num_envs"]) * int(cb["slot_size"])
    if size < least:  # cut short: its trailer is gone, but it is no server without discovery
        raise RegionMismatchError(
            f"shm://{shm.name}",
            "region size",
            f"at least {least} (the region is shorter than its header says: 64 + num_envs x "
            "slot_size)",
            str(size),
        )
    if ir is None:
        raise ConnectError(
            f"shm://{shm.name}: the region carries no schema (a server without discovery): "
            "pass schema="
        )
    return schema_from_ir_text(
        ir.decode("utf-8", "replace"), int(cb["fingerprint"]), peer=f"the server at {url}"
    )


class ShmChannel:
    """The ``Channel`` of ``shm://name``: requests become slot commands, results stay in the
    slots. ``result_records`` are views into the region (``observation`` of an N-env step is an
    (N, obs) view whose row stride is the slot size); SAME_STEP final results are views of the
    final areas, valid until that env's next episode ends. One lease per region: attaching takes
    it, ``close()`` says SHUTDOWN and gives it back. Results kept past ``close()`` stay readable
    (a private copy of the region, freed with the last of them: docs/shm.md, "Lifetimes").
    """

    def __init__(
        self,
        url: str,
        schema: Schema,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        wait: WaitPolicy | str | None = None,
    ) -> None:
        self.url = url
        self.schema = schema
        self.info: dict[str, Any] = {}
        self.shm: ShmUrl = parse_url(url)
        self.layout = ShmLayout.of(schema)
        self.policy = WaitPolicy.resolve(wait) if wait is not None else self.shm.wait
        # a policy the caller chose (argument or URL) is kept; else the server's hint may apply
        self._policy_chosen = wait is not None or names_wait_policy(url)
        self.timeout = timeout
        self._timeout_ns = -1 if timeout is None else int(timeout * 1e9)
        self._closed = True
        self._leased = False
        self._lease_token = object()  # this channel's entry in _LEASES while it holds the lease
        ids = MessageIds.from_schema(schema.ir)
        self.ids = ids
        self._step_request = body_codec(schema, "STEP_REQ")
        action = self._step_request.ir.role("action")
        if action is None:
            raise ProtocolError("the STEP_REQ body struct has no field with role 'action'")
        self._action_name = action.name
        self._seed_codec = body_codec(schema, "RESET_SEED_REQ")
        self._seeds_codec = body_codec(schema, "RESET_SEEDS_REQ")
        self._async_seed = body_codec(schema, "ASYNC_RESET_REQ")
        self._body_requests: tuple[Any, list[tuple[np.ndarray, np.ndarray]]] | None = None
        self._handlers: dict[int, Callable[[Any], tuple[int, memoryview]]] = {
            ids.STEP_REQ: self._step,
            ids.STEP_BATCH_REQ: self._step,
            ids.RESET_REQ: self._reset,
            ids.RESET_SEED_REQ: self._reset,
            ids.RESET_SEEDS_REQ: self._reset_seeds,
            ids.HELLO_REQ: self._hello,
            ids.HEALTH_REQ: self._health,
            ids.SPACES_REQ: self._spaces,
            ids.STEP_MULTI_REQ: self._step_multi,
            ids.SEND_REQ: self._send,
            ids.RECV_REQ: self._recv,
            ids.ASYNC_RESET_REQ: self._async_reset,
        }
        observe = schema.ir.messages.get("OBSERVE_REQ")
        if observe is not None:
            self._observe_resp = schema.ir.messages["OBSERVE_RESP"].id
            self._handlers[observe.id] = self._observe
        # refused while envs are in flight (the runtime's rule: their results would mix)
        self._lock_step = {
            ids.STEP_REQ,
            ids.STEP_BATCH_REQ,
            ids.RESET_REQ,
            ids.RESET_SEED_REQ,
            ids.RESET_SEEDS_REQ,
            ids.STEP_MULTI_REQ,
        } | ({observe.id} if observe is not None else set())
        self._multi = body_codec(schema, "STEP_MULTI_REQ")
        self._recv_codec = body_codec(schema, "RECV_REQ")
        self._result_codec = body_codec(schema, "STEP_RESP")
        self._empty = memoryview(b"")
        self.region = self._open(10.0 if timeout is None else timeout)
        try:
            self._validate()
            self._take_lease(10.0 if timeout is None else timeout)
            self._setup()
            self._await_last_holder(10.0 if timeout is None else timeout)
            self._closed = False
        except BaseException:
            self._closed = True
            self._release()
            raise

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
            except OSError as exc:  # EINVAL: a directory; ELOOP: a symbolic link
                check_segment_path(self.shm.path, exc)
                raise ConnectError(f"cannot open {self.shm.path}: {exc.strerror}") from exc
            else:
                try:
                    size = check_segment_fd(fd, self.shm.path).st_size
                    if size >= CONTROL_SIZE:
                        region = Region(self.shm.segment, fd, size, self.layout, owner=False)
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
        owner, start = cb("owner_pid"), cb("owner_start_time")
        _check_owner(url, owner, start)  # a dead server's region: stale, before its sizes
        fingerprint = cb("fingerprint")
        if fingerprint != self.schema.fingerprint:
            raise FingerprintMismatchError(
                f"the server at {self.url}: "
                + mismatch_text(
                    _ir_name(region.schema_ir),
                    fingerprint,
                    self.schema.name,
                    self.schema.fingerprint,
                )
                + " (control block field fingerprint)",
                local=self.schema.fingerprint,
                remote=fingerprint,
            )
        layout = self.layout
        expect("slot_size", layout.slot_size, cb("slot_size"))
        num_envs = cb("num_envs")
        if not 1 <= num_envs <= MAX_NUM_ENVS:  # what every server serves
            raise RegionMismatchError(url, "num_envs", f"1..{MAX_NUM_ENVS}", str(num_envs))
        if self.shm.num_envs is not None:
            expect("num_envs", self.shm.num_envs, num_envs)
        if region.num_slots < max(num_envs, 1):  # the size fits no k >= num_envs
            expect("region size", layout.region_size(num_envs), region.size)
        expect("obs_size", layout.obs_size, cb("obs_size"))
        expect("act_size", layout.act_size, cb("act_size"))
        self.owner_pid = owner
        self.owner_start = start
        self.num_envs = num_envs

    def _requests_outstanding(self) -> bool:
        """A slot's request is not answered yet: the server is in a step (or gone)."""
        region = self.region
        asked = region.strided("sem_action_ready") & native.SEQ_MASK
        answered = region.strided("sem_result_ready") & native.SEQ_MASK
        return bool((asked != answered).any())

    def _take_lease(self, timeout: float) -> None:
        region = self.region
        me = os.getpid()
        deadline = time.monotonic() + timeout
        while True:
            if native.compare_exchange(region.client_pid_word, 0, me):
                start = own_start_time()
                region.set("client_start_time", start)
                holder = region.get("client_pid")
                if holder == me:
                    self._leased = True
                    _LEASES[region.inode] = self._lease_token
                    return
                # the server reclaimed the lease between the two stores (this process stalled
                # for over a second: "never completed"): not ours; give a new holder its own
                # start time back and take the lease again
                if holder and region.get("client_start_time") == start:
                    region.set("client_start_time", native.proc_start_time(holder))
                continue
            holder = region.get("client_pid")
            holder_start = region.get("client_start_time")
            if holder and native.peer_alive(holder, holder_start):
                who = "this process" if holder == me else f"client pid {holder}"
                raise RegionInUseError(
                    f"shm://{self.shm.name} is in use by {who}: a region serves one client at a "
                    "time",
                    holder,
                )
            if time.monotonic() >= deadline:
                busy = (
                    " (the server is busy with a request of that client: it reclaims leases "
                    "between requests)"
                    if self._requests_outstanding()
                    else ""
                )
                raise ConnectError(
                    f"shm://{self.shm.name}: the lease of dead client pid {holder} was not "
                    f"reclaimed by the server in time{busy}"
                )
            time.sleep(0.01)

    def _await_last_holder(self, timeout: float) -> None:
        """The previous lease holder's last request, if the server has not answered it yet
        (its close gave up on SHUTDOWN after 1 s: a stalled server), is answered before this
        client writes a slot. Else this client's first request overwrote that command and, the
        same process having the same pid, the server took it for the old holder's: this client
        went on in the old session (its envs, its auto-reset mode). Only after such a close in
        this process (``_UNANSWERED``): slots another process left unanswered (a client killed
        with an env in flight) belong to a session the server ends by the new pid."""
        region = self.region
        if region.inode not in _UNANSWERED:
            return
        answered = np.asarray(region.strided("sem_result_ready"), dtype=np.uint32)
        if np.array_equal(answered & native.SEQ_MASK, self._seqs):
            _UNANSWERED.discard(region.inode)
            return
        ctx = self._ctx
        ctx.n = region.num_slots  # every slot: a STEP_MULTI uses one per seat
        try:
            rc = self._resumed(native.lib.tp_client_wait(ctx, int(timeout * 1e9)))
        finally:
            ctx.n = self.num_envs
        if rc == native.TIMEOUT:
            raise ConnectError(
                f"shm://{self.shm.name}: the server did not answer the previous client's last "
                f"request within {timeout:g} s"
            )
        if rc < 0:
            self._raise(rc)  # its server died or closed the region
        _UNANSWERED.discard(region.inode)

    def _setup(self) -> None:
        region, n = self.region, self.num_envs
        # owned, never a view of the region (one slot's strided view is contiguous already): the
        # wait context points at it, and it must outlive the mapping
        self._seqs = np.array(region.strided("sem_action_ready"), dtype=np.uint32, copy=True)
        self._seqs &= native.SEQ_MASK
        self._ctx = wait_ctx(region, self.policy, self._seqs)
        self._ctx.n = n  # requests go to the envs' slots (STEP_MULTI: to one slot per seat)
        self._ctx.doorbell_seq = native.load_acquire(region.doorbell) & native.SEQ_MASK
        self._ctx.peer_pid = self.owner_pid
        self._ctx.peer_start = self.owner_start
        self._commands = region.strided("command")
        columns = self.layout.columns
        # the (k,) request records: the slots' (strided), or (column layout) ColumnRecords whose
        # fields are the contiguous columns; the client writes its actions there
        requests: Any = region.column_requests(region.num_slots) if columns else region.requests()
        self._requests = requests
        self._request_fields = {name: requests[name] for name in requests.dtype.names or ()}
        self._request_rows = requests[:n]
        self._actions = self._request_fields[self._action_name]
        self._step_resp = self.ids.STEP_RESP if n == 1 else self.ids.STEP_BATCH_RESP
        self._step_req = self.ids.STEP_REQ if n == 1 else self.ids.STEP_BATCH_REQ
        self._has_seed = region.strided("has_seed")
        self._seeds = region.strided("seed")
        self._status = region.strided("status")
        self._error_len = region.strided("error_len")
        self._error_text = region.strided("error_text")
        self._info_len = region.strided("info_len")
        self._info = region.strided("info")
        self._last_cmd = -1
        self._late = False  # a request timed out: ``settle`` before the next one
        # asynchronous batches: the slots sent and not received yet (docs/shm.md)
        self._in_flight = np.zeros(n, dtype=np.uint8)
        self._in_flight_ptr = native.ffi.cast(
            "uint8_t *", native.ffi.from_buffer(self._in_flight, require_writable=True)
        )
        self._async_count = 0
        # a reset was sent in this lease's session (its envs are fresh): before one, a SEND is
        # the runtime's NOT_RESET at once, as over the streams (``check_reset_sent``)
        self._reset_sent = False
        self._async_next = 0  # RECV scans from here (round robin: no env starves)
        self._every = np.arange(n, dtype=np.uint32)
        self._async_ids = np.zeros(n, dtype=np.uint32)
        self._async_ids_ptr = native.ffi.cast(
            "uint32_t *", native.ffi.from_buffer(self._async_ids, require_writable=True)
        )
        layout = self.layout
        # RECV's gather buffers (owned, reused): one row per slot of each area
        self._scratch = np.zeros((n, layout.result_dtype.itemsize), dtype=np.uint8)
        self._final_scratch = np.zeros((n, layout.final_dtype.itemsize), dtype=np.uint8)
        seats = self.layout.seats
        self._rows: dict[int | None, Any]
        if columns:
            # each result column as (k, field bytes): RECV cuts a wire record from them
            codec = self._result_codec
            self._result_columns = [
                (
                    codec.dtype.fields[name][1],  # type: ignore[index]
                    column.view(np.uint8).reshape(region.num_slots, -1),
                )
                for name, column in region.result_columns.items()
            ]
            self._single: Any = region.column_results(None)
            self._rows = {None: self._single, n: region.column_results(n)}
            if region.num_slots >= seats:
                self._rows[seats] = region.column_results(seats)
        else:
            results = region.results()
            # the slots' result (and final) areas as bytes, and how a wire record is cut from
            # them: RECV gathers the answered slots with a few byte copies (docs/shm.md)
            self._result_runs = _byte_runs(self._result_codec.dtype, layout.result_dtype)
            self._result_bytes = self._byte_rows(
                CONTROL_SIZE + layout.result_base, layout.result_dtype.itemsize, layout.slot_size
            )
            self._single = results[0, ...]
            self._rows = {None: self._single, n: results[:n]}
            if region.num_slots >= seats:
                self._rows[seats] = results[:seats]
        self._ended: list[tuple[int, np.ndarray]] = []
        self._has_finals = region.has_finals
        if region.has_finals:
            final_seqs, finals = region.finals()
            self._final_seqs = final_seqs[:n]
            self._finals = finals[:n]
            self._final_records = [finals[i, ...] for i in range(n)]
            self._final_runs = _byte_runs(self._result_codec.dtype, layout.final_dtype)
            self._final_bytes = self._byte_rows(
                layout.finals_offset(region.num_slots) + layout.final_base,
                layout.final_dtype.itemsize,
                layout.final_size,
            )
        self._roundtrip = native.lib.tp_client_roundtrip
        info_len = int(region.slots[0]["info_len"])
        info: dict[str, Any] = {}
        if 0 < info_len <= self.layout.info_max:
            try:
                info = dict(msgpack.unpackb(region.slots[0]["info"][:info_len].tobytes()))
            except Exception:
                info = {}
        info["num_envs"] = n
        # the env's spaces, which the control block cannot say (its act_size is the mask's
        # length); a server that does not send them: the control block's sizes
        spaces = info.pop("spaces", None)
        # the server's advice on how to wait (not a server_info key: the same keys as over
        # unix): "futex" when its envs run in worker processes, whose steps a spinning client
        # would slow down by taking a core from them (docs/shm.md "Worker processes")
        hint = info.pop("client_wait", None)
        if not self._policy_chosen and isinstance(hint, str) and hint in PRESETS:
            # the advised spin; the URL's slice_ms (if any) stays
            self.policy = WaitPolicy(PRESETS[hint].spin, self.policy.futex_slice_ms)
            self.policy.apply(self._ctx)
        self._env_spaces = (
            (int(spaces[0]), int(spaces[1]))
            if isinstance(spaces, list | tuple) and len(spaces) == 2
            else (region.get("obs_size"), region.get("act_size"))
        )
        self._side = SideReader(self.shm)  # info maps a slot cannot hold (frames)
        self._server_info = info
        self._checksums: SlotChecksums | None = None
        if info.get("checksum") == "crc32":
            self._checksums = SlotChecksums(region)
        elif self.shm.checksum is not None:
            raise ConnectError(
                f"shm://{self.shm.name}: the client asks for ?checksum={self.shm.checksum} but the "
                f"server does not write checksums: start it with shm://{self.shm.name}"
                f"?checksum={self.shm.checksum}"
            )

    def _byte_rows(self, offset: int, width: int, stride: int) -> np.ndarray:
        """(k, width) bytes: one row per slot (or final area) from ``offset``."""
        region = self.region
        return np.ndarray(
            (region.num_slots, width),
            dtype=np.uint8,
            buffer=region.map,
            offset=offset,
            strides=(stride, 1),
        )

    # -- requests ----------------------------------------------------------------------------

    def request(self, msg_type: int, body: Any) -> tuple[int, memoryview]:
        """One request as slot commands; a refusal comes back as an ERROR body."""
        if self._last_cmd == _STEP and msg_type == self._step_req and body is self._request_rows:
            # the hot path: the client wrote its actions into the slots, the command is set
            try:
                rc = self._roundtrip(self._ctx, self._timeout_ns)
                if rc == 0 and self._checksums is None:
                    return self._step_resp, self._empty
                self._finish(rc)
            except _Refused as refused:
                return self.ids.ERROR, memoryview(encode_error(refused.code, refused.text))
            except KeyboardInterrupt:
                self._in_flight_after_interrupt()
                raise
            return self._step_resp, self._empty
        if self._closed:
            raise TransportError("the client is closed")
        if self._late:  # callers other than Client (connect_many) get the same guard
            self.settle()
        handler = self._handlers.get(msg_type)
        if handler is None:
            text = f"shm:// carries no message 0x{msg_type:02X}"
            return self.ids.ERROR, memoryview(encode_error(ErrorCode.UNKNOWN_MESSAGE, text))
        try:
            if self._async_count and msg_type in self._lock_step:
                check_idle(self._async_count, msg_type)
            return handler(body)
        except RequestError as refused:
            return self.ids.ERROR, memoryview(encode_error(refused.code, refused.text))
        except _Refused as refused:
            return self.ids.ERROR, memoryview(encode_error(refused.code, refused.text))

    def request_area(self, codec: StructCodec, count: int) -> tuple[Any, Any]:
        """The slots' request records: the client writes each env's request in its slot."""
        if self._closed:
            raise TransportError(f"shm://{self.shm.name}: the client is closed")
        if count != self.num_envs or codec.ir.name != self.layout.request.ir.name:
            body = bytearray(codec.size * count)
            return codec.view(body, count=count), body
        return self._request_rows, self._request_rows

    def result_records(
        self, body: memoryview, codec: StructCodec, count: int | None, finals: bool
    ) -> Any:
        """Record views of the slots, or (column layout) ``ColumnRecords`` of the columns."""
        try:
            if finals:
                self._find_finals()
            return self._rows[count]
        except AttributeError:  # closed: its views are gone (zero-cost try on the hot path)
            raise TransportError(f"shm://{self.shm.name}: the client is closed") from None

    def final_records(self) -> list[tuple[int, np.ndarray]]:
        return self._ended

    def _step(self, body: Any) -> tuple[int, memoryview]:
        if body is self._request_rows:  # the client wrote the requests into the slots
            self._exchange(SlotCommand.STEP)
            return self._step_resp, self._empty
        cached = self._body_requests
        if cached is None or cached[0] is not body:  # the client reuses one request buffer
            count = len(body) // self._step_request.size
            if count != self.num_envs:
                raise ValueError(f"expected {self.num_envs} requests, got {count}")
            records = self._step_request.view(body, count=count)
            fields = self._request_fields
            pairs = [
                (fields[name][:count], records[name])
                for name in self._step_request.dtype.names or ()
            ]
            cached = self._body_requests = (body, pairs)
        for slot_field, field in cached[1]:  # each request field into its slots (one copy each)
            slot_field[...] = field
        self._exchange(SlotCommand.STEP)
        msg_type = self.ids.STEP_RESP if self.num_envs == 1 else self.ids.STEP_BATCH_RESP
        return msg_type, self._empty

    def _step_multi(self, body: Any) -> tuple[int, memoryview]:
        """STEP_MULTI: seat k's action in slot k, STEP_MULTI in slots 0..seats-1."""
        seats = self.layout.seats
        if self.region.num_slots < seats:
            raise _Refused(
                ErrorCode.BAD_BATCH,
                f"STEP_MULTI_REQ needs a {seats}-env server or one env with step_batch; this one "
                f"has {self.num_envs} envs",
            )
        actions = self._multi.view(body)[self._multi.ir.fields[0].name]
        self._actions[:seats] = actions
        self._ctx.n = seats
        try:
            self._exchange(SlotCommand.STEP_MULTI)
        finally:
            self._ctx.n = self.num_envs
        return self.ids.STEP_MULTI_RESP, self._empty

    def _observe(self, body: Any) -> tuple[int, memoryview]:
        """OBSERVE: the results are rewritten in the slots; each slot's info area holds its env's
        info map. The body (as over streams: N results, then the msgpack array of the maps)
        carries zeros where the results would be: the client reads the slots."""
        self._exchange(SlotCommand.OBSERVE)
        infos = []
        for i in range(self.num_envs):
            length = int(self._info_len[i])
            if length == INFO_SIDE:  # too large for the slot: in the side segment (frames)
                data = self._side.read(self._info[i, : SIDE_REF.size].tobytes())
            else:
                data = self._info[i, :length].tobytes() if length else b""
            infos.append(msgpack.unpackb(data) if data else {})
        results_len = self.layout.result.size * self.num_envs
        return self._observe_resp, memoryview(bytes(results_len) + msgpack.packb(infos))

    # -- asynchronous batches (docs/shm.md): each slot carries its env's request on its own --

    def _send(self, body: Any) -> tuple[int, memoryview]:
        """SEND: each env's request into its slot, published without waiting (in flight)."""
        n, size = self.num_envs, self._step_request.size
        view = memoryview(body).cast("B")
        found = send_env_ids(view, size, n)
        check_send(found, n, self._in_flight)
        check_reset_sent(found, self._reset_sent)
        k = len(found)
        # wire records into the slots' layout (one structured assignment, fields by position)
        # or, column layout, each field into its column
        self._requests[found] = self._step_request.view(view, count=k)
        self._commands[found] = SlotCommand.STEP
        self._last_cmd = -1  # the slots' commands may differ now
        out = self._async_ids
        out[:k] = found
        self._in_flight[found] = 1
        self._async_count += k
        native.lib.tp_client_send(self._ctx, self._async_ids_ptr, k)
        return self.ids.SEND_RESP, self._empty

    def _recv(self, body: Any) -> tuple[int, memoryview]:
        """RECV: wait for any ``min(B, in flight)`` answered slots; the stream RECV_RESP body."""
        if len(body) != self._recv_codec.size:
            raise RequestError(
                ErrorCode.BAD_BODY_SIZE,
                f"RECV_REQ body is {len(body)} bytes, expected {self._recv_codec.size}",
            )
        want = check_recv(self._async_count, int(self._recv_codec.view(body)["batch_size"]))
        n = self._ctx.n = self.num_envs
        if want == n:  # every env in flight, every one wanted: the lock-step wait (see below)
            # Ctrl-C (KeyboardInterrupt from _resumed): the envs stay in flight, as on a timeout
            rc = self._resumed(native.lib.tp_client_wait(self._ctx, self._timeout_ns))
            if rc >= 0:  # a failed slot (rc > 0) is found with the others' statuses below
                start, every, out = self._async_next, self._every, self._async_ids
                out[: n - start] = every[start:]  # wait_any's order: round robin from start
                out[n - start :] = every[:start]
                rc = n
        else:
            while True:  # each pass runs Python's signal handlers first (see _resumed)
                rc = native.lib.tp_client_wait_any(
                    self._ctx,
                    self._in_flight_ptr,
                    want,
                    self._async_next,
                    self._async_ids_ptr,
                    self._timeout_ns,
                )
                if rc != _INTERRUPTED:
                    break
                self._ctx.resumed = 1  # the next pass resumes this wait (its deadline, no spin)
        if rc == native.TIMEOUT:  # the envs stay in flight: a later RECV returns them
            raise TransportTimeoutError(
                f"shm://{self.shm.name}: no env finished within {self.timeout} s "
                f"({self._async_count} in flight)"
            )
        if rc < 0:
            self._raise(rc)
        found = self._async_ids[:rc]  # the answered slots, in the order they were found
        ids = found.tolist()
        self._async_next = (ids[-1] + 1) % self.num_envs
        failed = found[self._status[found] != 0]  # one gather for all, no loop per slot
        if failed.size:  # the answered errors: their envs leave flight, the others stay answered
            self._in_flight[failed] = 0
            self._async_count -= int(failed.size)
            self._raise(int(failed[0]) + 1)
        if self._checksums is not None:
            for i in ids:
                if not self._checksums.matches(i):
                    raise ProtocolError(
                        f"shm://{self.shm.name}: slot {i}'s result does not match the checksum "
                        "its server wrote: do not trust this result"
                    )
        self._in_flight[found] = 0
        self._async_count -= rc
        # the results in the wire layout (the result codec's), then the SAME_STEP finals: the
        # final areas stamped with this request's sequence (only a SAME_STEP end stamps one).
        # Built in the body: a gather of the answered slots, then a few byte runs into place
        codec = self._result_codec
        results_len = codec.size * rc
        finals = b""
        ended: list[int] = []
        if self._has_finals:
            stamped = found[self._final_seqs[found] == self._seqs[found]]
            if stamped.size:
                ended = stamped.tolist()
                block = np.zeros((len(ended), codec.size), dtype=np.uint8)
                _gather(block, self._final_bytes, stamped, self._final_runs, self._final_scratch)
                finals = block.tobytes()
        tail = msgpack.packb([ids, ended, finals])
        body = bytearray(results_len + len(tail))  # sized once: never grown (no copy)
        rows = np.frombuffer(body, dtype=np.uint8, count=results_len).reshape(rc, codec.size)
        if self.layout.columns:  # each column's answered envs into place, one take each
            for to, column in self._result_columns:
                width = column.shape[1]
                np.take(column, found, axis=0, out=rows[:, to : to + width], mode="clip")
        else:
            _gather(rows, self._result_bytes, found, self._result_runs, self._scratch)
        del rows
        body[results_len:] = tail
        return self.ids.RECV_RESP, memoryview(body)

    def _async_reset(self, body: Any) -> tuple[int, memoryview]:
        """ASYNC_RESET: a RESET of every slot; RECV then hands the results out."""
        check_idle(self._async_count, "ASYNC_RESET_REQ")
        entry = self._async_seed.view(body)
        if entry["has_seed"]:
            seed = int(entry["seed"])
            self._seeds[:] = [(seed + i) & U64 for i in range(self.num_envs)]
            self._has_seed[:] = 1
        else:
            self._has_seed[:] = 0
        self._reset_sent = True
        self._exchange(SlotCommand.RESET)
        self._in_flight[:] = 1
        self._async_count = self.num_envs
        return self.ids.SEND_RESP, self._empty

    def _find_finals(self) -> None:
        """The server stamped final_seq = this request's sequence for each ended episode."""
        ended = np.flatnonzero(self._final_seqs == self._seqs[: self.num_envs])
        if ended.size:
            records = self._final_records
            self._ended = [(i, records[i]) for i in ended.tolist()]
        elif self._ended:
            self._ended = []

    def _reset(self, body: Any) -> tuple[int, memoryview]:
        if len(body):
            seed = int(self._seed_codec.view(body)[self._seed_codec.ir.fields[0].name])
            self._seeds[:] = [(seed + i) & U64 for i in range(self.num_envs)]
            self._has_seed[:] = 1
        else:
            self._has_seed[:] = 0
        self._reset_sent = True
        self._exchange(SlotCommand.RESET)
        return self.ids.RESET_RESP, self._empty

    def _reset_seeds(self, body: Any) -> tuple[int, memoryview]:
        """RESET_SEEDS: each env's own seed (or none) into its slot, one RESET."""
        entries = self._seeds_codec.view(body, 0, count=self.num_envs)
        self._seeds[:] = entries["seed"]
        self._has_seed[:] = entries["has_seed"]
        self._reset_sent = True
        self._exchange(SlotCommand.RESET)
        return self.ids.RESET_RESP, self._empty

    def _hello(self, body: Any) -> tuple[int, memoryview]:
        """The handshake: the region was validated at attach; an auto-reset mode other than
        DISABLED is asked with the HELLO slot command (the mode in ``action``)."""
        try:  # answered as the region's server would (it speaks this side's protocol version)
            hello, mode = accept_hello(body, self.schema)  # validated: the region's fingerprint
        except RequestError as refused:
            return self.ids.ERROR, memoryview(encode_error(refused.code, refused.text))
        url = f"shm://{self.shm.name}"
        if carries_finals(mode) and not self.region.has_finals:
            raise ConnectError(
                f"{url}: the region has no final-result areas (a server without auto-reset "
                f"support): {mode.name.lower()} needs them"
            )
        if mode != AutoReset.DISABLED:
            self._actions[:] = int(mode)
            try:
                self._exchange(SlotCommand.HELLO)
            except _Refused as refused:
                raise ConnectError(
                    f"{url}: the server refused auto-reset mode {mode.name.lower()}: {refused.text}"
                ) from None
        reply = encode_hello_response(self.schema, hello, self._server_info, int(mode))
        return self.ids.HELLO_RESP, memoryview(reply)

    def _health(self, body: Any) -> tuple[int, memoryview]:
        """The region is READY and its server alive (no round trip needed)."""
        alive = self.region.state == RegionState.READY and native.peer_alive(
            self.owner_pid, self.owner_start
        )
        return self.ids.HEALTH_RESP, memoryview(b"\x01" if alive else b"\x00")

    def _spaces(self, body: Any) -> tuple[int, memoryview]:
        codec = body_codec(self.schema, "SPACES_RESP")
        first, second = (f.name for f in codec.ir.fields[:2])
        values = {first: self._env_spaces[0], second: self._env_spaces[1]}
        return self.ids.SPACES_RESP, memoryview(codec.encode(values))

    def _exchange(self, command: int, timeout_ns: int | None = None) -> None:
        if self._closed:
            raise TransportError("the client is closed")
        if command != self._last_cmd:
            self._commands[:] = command
            self._last_cmd = command
        try:
            rc = self._roundtrip(self._ctx, self._timeout_ns if timeout_ns is None else timeout_ns)
            self._finish(rc)
        except KeyboardInterrupt:
            self._in_flight_after_interrupt()
            raise

    def _in_flight_after_interrupt(self) -> None:
        """A signal handler raised (Ctrl-C) once the request was published: wherever Python ran
        it (right after the C call returned, entering ``_finish``, in ``_resumed``), the request
        stays in flight, and the next one first waits for it (``settle``), as after a timeout;
        else its actions would be overwritten while the server may still read them."""
        self._late = True
        self._last_cmd = -1  # off the hot path until settled

    def _finish(self, rc: int) -> None:
        """After a round trip: its error as an exception, then the checksums if the server
        writes them (a wait that came back for Python's signal handlers is resumed first)."""
        if rc == _INTERRUPTED:
            rc = self._resumed(rc)
        if rc:
            self._raise(rc)
        if self._checksums is not None:
            bad = self._checksums.first_bad(self._ctx.n)
            if bad >= 0:
                raise ProtocolError(
                    f"shm://{self.shm.name}: slot {bad}'s result does not match the checksum its "
                    "server wrote: another process wrote into the region after the server "
                    "published it (or a forged response); do not trust this result"
                )

    def _resumed(self, rc: int) -> int:
        """A wait on every slot (``tp_client_wait``, or the wait of ``tp_client_roundtrip``)
        that came back ``_INTERRUPTED`` is resumed, to its first deadline, until it ends. Each
        pass runs Python's signal handlers first (the loop's jump back runs them: Python runs
        pending handlers there), so Ctrl-C raises KeyboardInterrupt here, within a few tens of
        milliseconds, instead of once the server answers."""
        ctx = self._ctx
        while rc == _INTERRUPTED:
            ctx.resumed = 1
            rc = native.lib.tp_client_wait(ctx, -1)
        return rc

    def _raise(self, rc: int) -> None:
        url = f"shm://{self.shm.name}"
        if rc > 0:
            i = rc - 1
            length = min(int(self._error_len[i]), self.layout.error_text_max)
            text = self._error_text[i, :length].tobytes().decode("utf-8", "replace")
            raise _Refused(int(self._status[i]), text)
        if rc == native.TIMEOUT:
            self._late = True
            self._last_cmd = -1  # off the hot path until settled (request's general path)
            raise TransportTimeoutError(f"{url}: no response within {self.timeout} s")
        if rc == native.PEER_DEAD:
            raise PeerGoneError(f"{url}: the server (pid {self.owner_pid}) died")
        if rc == native.CLOSED:
            if self.region.truncated:
                raise PeerGoneError(
                    f"{url}: another process truncated {self.shm.path} under this client; the "
                    "region is gone (connect again once a server serves it)"
                )
            raise PeerGoneError(f"{url}: the server closed the region")
        raise TransportError(f"{url}: futex wait failed ({os.strerror(native.ffi.errno)})")

    def settle(self) -> None:
        """After a timeout (the Client calls this before its next request): wait, up to the
        timeout, until the server answered the request that timed out, so that the next request
        is not written into slots the server may still be reading. The late reply (its results,
        or its error) is dropped; the server still did what it asked. Nothing to wait for after
        a RECV's timeout: its envs stay in flight for the next RECV."""
        if not self._late:
            return
        if self._closed:  # the region is unmapped: nothing is left to wait on
            raise TransportError(f"shm://{self.shm.name}: the client is closed")
        rc = self._resumed(native.lib.tp_client_wait(self._ctx, self._timeout_ns))
        if rc == native.TIMEOUT:
            raise TransportTimeoutError(
                f"shm://{self.shm.name}: the late response to an earlier request did not come "
                f"within {self.timeout} s"
            )
        if rc < 0:
            self._raise(rc)
        self._late = False

    @property
    def wait_stats(self) -> tuple[int, int]:
        """(FUTEX_WAKE calls, FUTEX_WAIT calls) this client made: how often it slept."""
        return int(self._ctx.wakes), int(self._ctx.sleeps)

    def close(self) -> None:
        """Say SHUTDOWN (the server drops this session's envs), release the lease, unmap.

        Always releases the lease and the mapping, whatever the SHUTDOWN meets (a refusal, a
        timeout, a dead server): a later connect from this process must find the region free.
        Results the caller kept stay readable (docs/shm.md, "Lifetimes")."""
        if self._closed:
            return
        try:
            if (
                self._holds_lease()
                and self.region.state == RegionState.READY
                and native.peer_alive(self.owner_pid, self.owner_start)
            ):
                self._exchange(SlotCommand.SHUTDOWN, timeout_ns=int(_SHUTDOWN_WAIT_S * 1e9))
        except _Refused as refused:  # the server answered SHUTDOWN with a status: still gone
            log.debug("shm://%s: SHUTDOWN answered %d: %s", self.shm.name, refused.code, refused)
        except TransportTimeoutError:  # a stalled server: the lease goes anyway
            log.debug(
                "shm://%s: SHUTDOWN unanswered within %s s; the lease is released anyway",
                self.shm.name,
                _SHUTDOWN_WAIT_S,
            )
            _UNANSWERED.add(self.region.inode)
        except TransportError as exc:  # its server died: the lease goes anyway
            log.debug("shm://%s: SHUTDOWN: %s", self.shm.name, exc)
        finally:
            self._closed = True
            self._last_cmd = -1  # no hot path after close
            self._release()

    def _holds_lease(self) -> bool:
        """Is the region's lease still this channel's? Not after the server took it back (a
        stalled attach, a holder it took for a foreign process): then another client may hold
        it, and this channel's SHUTDOWN would end that client's session (same pid) and reuse
        its request sequences, and its release would free or alter that client's lease."""
        region = self.region
        return (
            self._leased
            and _LEASES.get(region.inode) is self._lease_token
            and region.get("client_pid") == os.getpid()
        )

    def _release(self) -> None:
        region = getattr(self, "region", None)
        if region is None:
            return
        if self._leased:
            if self._holds_lease():  # else: another client's now (see _holds_lease)
                region.set("client_start_time", 0)
                native.compare_exchange(region.client_pid_word, os.getpid(), 0)
            if _LEASES.get(region.inode) is self._lease_token:
                del _LEASES[region.inode]
            self._leased = False
        self._ended = []
        side = getattr(self, "_side", None)
        if side is not None:
            side.close()
        checksums = getattr(self, "_checksums", None)
        if checksums is not None:
            checksums.release()
            self._checksums = None
        for name in _REGION_VIEWS:  # this channel's own views: a region with none left is
            if hasattr(self, name):  # unmapped at once (the caller's keep a private copy)
                delattr(self, name)
        region.close()

    def __del__(self) -> None:
        try:
            if not self._closed:
                self.close()
        except Exception:
            pass
