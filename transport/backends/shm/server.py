"""The shm:// server: creates the region and serves one client lease at a time (docs/shm.md).

Each lease gets an ``EnvRuntime`` (``transport.runtime``) over record views of the slots: the
envs write their results straight into the slots (zero copy) and SAME_STEP final results into
the final areas. In the column layout (``[env] shm = "columns"``) the runtime writes private
row records and the server copies the published envs' rows into the result columns (one
vectorised copy per field) before it publishes them. This module moves slot commands to the
runtime and statuses back; every env rule is the runtime's. Every 250 ms, idle or busy, the
server looks at its region (``watch.RegionWatch``): a region removed, replaced, resized or no
longer READY stops it (``stop_reason``), fields it owns that another process changed are
rewritten, and a lease held by a live process that is not a client is reclaimed.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import msgpack
import numpy as np

from transport import native
from transport.backends.shm.region import (
    CB,
    INFO_SIDE,
    LAYOUT_VERSION,
    MAGIC,
    ColumnRecords,
    Region,
    RegionState,
    ShmLayout,
    SideWriter,
    SlotChecksums,
    SlotCommand,
    inspect_segment,
    names_wait_policy,
    own_start_time,
    parse_url,
    schema_area,
    wait_ctx,
    write_text,
)
from transport.backends.shm.watch import CONTROL_FIELDS, WATCH_PERIOD_S, RegionWatch
from transport.codec import Schema
from transport.errors import ConnectError
from transport.protocol import DEFAULT_MAX_BODY, ErrorCode, RequestError
from transport.runtime.async_batches import AsyncBatches
from transport.runtime.core import EnvRuntime, describe
from transport.runtime.env import steps_on_own_threads, writes_columns
from transport.runtime.host import EnvHost

log = logging.getLogger("transport.shm")
_CLIENT_PID_WORD = CB["client_pid"].offset // 4
# the slot commands as module names: on Python 3.11 each SlotCommand.X lookup costs ~50 ns
_STEP, _RESET, _HELLO = SlotCommand.STEP, SlotCommand.RESET, SlotCommand.HELLO
_OBSERVE, _STEP_MULTI, _SHUTDOWN = SlotCommand.OBSERVE, SlotCommand.STEP_MULTI, SlotCommand.SHUTDOWN
_STEP_CODE = int(_STEP)  # the lock-step hot path compares plain ints
# the per-request native calls, looked up once (each ``native.lib.X`` is a cffi lookup)
_server_pending, _server_publish = native.lib.tp_server_pending, native.lib.tp_server_publish


class _Lease:
    """The client holding the region's lease, its envs' runtime and, when a worker pool runs
    them, the envs in flight there (asynchronous batches: slots answered as each env ends)."""

    def __init__(self, runtime: EnvRuntime, client_pid: int) -> None:
        self.runtime = runtime
        self.client_pid = client_pid
        self.batches = AsyncBatches(runtime) if runtime.runner.concurrent else None


class Listener:
    """Creates the region and serves it: one thread, one client lease at a time."""

    def __init__(self, url: str, host: EnvHost, *, max_body: int = DEFAULT_MAX_BODY) -> None:
        self.url = url
        self.shm = parse_url(url)
        self._checksums: SlotChecksums | None = None
        self.host = host
        self.schema: Schema = host.schema
        n = self.shm.num_envs
        if n is not None and n != host.num_envs:
            if host.num_envs != 1 or host.factory is None:
                raise ConnectError(
                    f"{url} asks for {n} envs but the server was given num_envs={host.num_envs}"
                )
            host.num_envs = n  # the URL's num_envs wins over the default of 1
        self.num_envs: int = host.num_envs
        self.region: Region | None = None
        self._closed = threading.Event()
        self._stopped = threading.Event()
        self._serving = False
        self.stop_reason: str | None = None  # why serve_forever returned without close()
        self.lease: _Lease | None = None
        self._flying: AsyncBatches | None = None  # the lease's envs in a pool, while any are
        self._closing: EnvRuntime | None = None  # a SHUTDOWN's runtime, closed once answered
        self._spare: EnvRuntime | None = None
        self._spare_failed = False  # making the spare failed: the next client's HELLO retries
        self._watch: RegionWatch | None = None
        self._side = SideWriter(self.shm)  # info maps a slot cannot hold (frames): on demand

    # -- creation ----------------------------------------------------------------------------

    def start(self) -> None:
        """Create the region (replacing a stale one, never a live one) and mark it READY."""
        host, layout = self.host, ShmLayout.of(self.schema)
        self.layout = layout
        # one env: made now, it says whether it needs a slot per seat (step_batch); more envs
        # are made once the region (checked against /dev/shm's room) exists
        envs = host.create_envs() if self.num_envs == 1 else None
        slots = host.rows(envs) if envs is not None else self.num_envs
        area = schema_area(self.schema)  # the region carries its schema (discovery)
        size = layout.region_size(slots) + len(area)
        fd = self._create(size)
        try:
            region = Region(self.shm.segment, fd, size, layout, owner=True, slots=slots)
        finally:
            os.close(fd)
        self.region = region
        region.set("owner_pid", os.getpid())
        region.set("owner_start_time", own_start_time())
        # the magic with the owner, before the envs are made (which may take long): the
        # segment is this server's (live, or stale once it is gone), never a foreign file
        region.set("version", LAYOUT_VERSION)
        region.set("magic", MAGIC)
        try:
            n = self.num_envs
            if envs is None:
                envs = host.create_envs()
            self._columns: list[tuple[np.ndarray, np.ndarray]] = []
            self.results: Any
            if layout.columns and writes_columns(envs):  # a vector env writes the columns
                self.results = ColumnRecords(layout.result_dtype, region.result_columns, slots)
            elif layout.columns:  # the runtime writes private rows; publishing copies them over
                self.results = np.zeros(slots, dtype=layout.result_dtype)
                self._columns = [
                    (column, self.results[name]) for name, column in region.result_columns.items()
                ]
            else:
                self.results = region.results()
            # envs in worker processes, or a vector env on threads of its own (EnvPool): a
            # step takes their time (ms on a real env), and a server or client spinning
            # meanwhile takes a core from them (2 cores: one of two), so both sleep at once
            # unless the URL names a wait policy
            pool_sleeps = (bool(host.workers) or steps_on_own_threads(envs)) and not (
                names_wait_policy(self.url)
            )
            final_seqs, finals = region.finals()
            self._final_seqs, self.finals = final_seqs[:n], finals[:n]
            self._spare = host.runtime(envs, self.results, self.finals)
            region.map[size - len(area) : size] = area
            for field, value in (
                ("magic", MAGIC),
                ("version", LAYOUT_VERSION),
                ("num_envs", n),
                ("obs_size", layout.obs_size),
                ("act_size", layout.act_size),
                ("slot_size", layout.slot_size),
                ("fingerprint", self.schema.fingerprint),
            ):
                region.set(field, value)
            self._watch = RegionWatch(
                self.url,
                self.shm.path,
                region,
                {field: region.get(field) for field in CONTROL_FIELDS},
                area,
            )
            info: dict[str, Any] = {
                "env": host.env_name,
                "server": host.server_lang,
                "masked_actions": host.masked_actions,
                # the env's spaces (SPACES_RESP): the control block's act_size is the mask's
                # length (Appendix B), 0 for an env without one (CartPole's Discrete(2))
                "spaces": [self._spare.spaces.obs_n, self._spare.spaces.act_n],
            }
            if pool_sleeps:
                info["client_wait"] = "futex"  # the client's advice (channel.py pops it)
            if self.shm.checksum is not None:
                info["checksum"] = self.shm.checksum
                self._checksums = SlotChecksums(region)
            self._server_info = msgpack.packb(info)
            self._write_info(0, self._server_info)
        except BaseException:
            self._remove()
            raise
        self._seqs = np.zeros(slots, dtype=np.uint32)
        self._pending = np.zeros(slots, dtype=np.uint8)
        self._same_cmd = native.ffi.new("int32_t *")
        self._pending_ptr = native.ffi.cast(
            "uint8_t *", native.ffi.from_buffer(self._pending, require_writable=True)
        )
        self._done = np.zeros(slots, dtype=np.uint8)  # slots answered as their env ends
        self._done_ptr = native.ffi.cast(
            "uint8_t *", native.ffi.from_buffer(self._done, require_writable=True)
        )
        self._ctx = wait_ctx(region, self.shm.wait, self._seqs)
        if pool_sleeps:
            self._ctx.spin = 0
        self._command_offset = layout.slot_fields["command"].offset
        self._words = region.words
        requests = region.request_columns if layout.columns else region.requests()
        self._actions = requests[host.action.name]
        self._env_actions = self._actions[: self.num_envs]
        # an array action (Box, MultiDiscrete): the HELLO mode is in its first element
        self._scalar_action = self._actions.ndim == 1
        self._modes = self._actions[(slice(None),) + (0,) * (self._actions.ndim - 1)]
        self._has_seed = region.strided("has_seed")
        self._slot_seeds = region.strided("seed")
        self._commands = region.strided("command")
        self._status = region.strided("status")
        self._error_len = region.strided("error_len")
        self._error_text = region.strided("error_text")
        self._info_len = region.strided("info_len")
        self._info = region.strided("info")
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
                if not info.stale:  # live, starting up, unreadable or not ours: never replaced
                    raise ConnectError(info.refusal(url)) from None
                log.warning("replacing stale region %s (owner pid %s)", info.path, info.owner_pid)
                try:
                    native.shm_unlink(self.shm.segment)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    raise ConnectError(
                        f"{url}: cannot remove the stale region {self.shm.path}: {exc.strerror}"
                    ) from None
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
        # an idle slice never outlasts the watch's period: the region is looked at while idle
        idle_ns = int(min(max(self.shm.wait.futex_slice_ms, 1.0), WATCH_PERIOD_S * 1e3) * 1e6)
        spin, idle = ctx.spin, False  # spin before each request; not once idle for a slice
        last = self._doorbell_at_start  # read before READY: a ring right after it is seen
        watch, now = self._watch, time.monotonic
        assert watch is not None
        try:
            while not self._closed.is_set():
                if now() >= watch.next_at and self._look_at_region(watch):
                    return  # the region changed under the server: stop_reason says how
                if self._flying is not None:
                    last = self._wait_in_flight(self._flying, last, idle_ns)
                    if last >= 0:
                        continue
                    if not self._closed.is_set():
                        self._stray_state()
                    return
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
                    if not self._closed.is_set():
                        self._stray_state()
                    return
                else:
                    log.error(
                        "futex wait failed on %s: %s", self.url, os.strerror(native.ffi.errno)
                    )
                    time.sleep(0.01)
        finally:
            self._stopped.set()

    def _look_at_region(self, watch: RegionWatch) -> bool:
        """The watch's periodic look (docs/shm.md "A region changed under its server"): True
        when the server must stop (``stop_reason`` set, logged); scribbled fields it owns are
        rewritten and a lease held by a live process that is not a client is reclaimed."""
        watch.next_at = time.monotonic() + WATCH_PERIOD_S
        region = self.region
        if region is None or self._closed.is_set():
            return True
        reason = watch.lost()  # before anything past the first page is read
        if reason is not None:
            self.stop_reason = reason
            log.error("%s", reason)
            return True
        if region.truncated or region.state != RegionState.READY:
            if not self._closed.is_set():
                self._stray_state()
            return True
        watch.repair()
        pid = int(region.words[_CLIENT_PID_WORD])
        if pid:
            start = region.get("client_start_time")
            if native.peer_alive(pid, start):  # a dead one: _housekeeping reclaims it
                why = watch.foreign_holder(pid, start)
                if why is not None:
                    log.warning("%s", why)
                    self._reclaim(pid, start)
        else:
            watch.forget()  # released: the next holder, even the same process, is looked at anew
        return False

    def _reclaim(self, pid: int, start: int) -> None:
        """Free the lease of ``pid`` (dead, or not a client) unless it changed meanwhile; its
        envs are dropped. client_start_time first (0: "attaching"), then the CAS, as a client
        releases."""
        region = self.region
        assert region is not None
        if int(region.words[_CLIENT_PID_WORD]) != pid or region.get("client_start_time") != start:
            return  # released or taken meanwhile: not ours to touch
        region.set("client_start_time", 0)
        native.compare_exchange(region.client_pid_word, pid, 0)
        if self.lease is not None and self.lease.client_pid == pid:
            self._drop_lease()
        if self._watch is not None:
            self._watch.forget()

    def _stray_state(self) -> None:
        """The state word left READY while this server did not close: another process wrote
        it. Clients of a non-READY region give up, so the server cannot keep serving: it stops
        (``transport.serve`` then exits non-zero and removes the region) and says why."""
        region = self.region
        if region is not None and region.truncated:
            try:
                size = f"{os.stat(self.shm.path).st_size} bytes"
            except OSError:
                size = "removed"
            self.stop_reason = (
                f"{self.url}: another process truncated {self.shm.path} (now {size}) while this "
                f"server (pid {os.getpid()}) was serving; the server stops and removes it"
            )
            log.error("%s", self.stop_reason)
            return
        value = region.state if region is not None else -1
        try:
            name = RegionState(value).name
        except ValueError:
            name = "an unknown value"
        self.stop_reason = (
            f"{self.url}: the region's state word was set to {value} ({name}) by another "
            f"process while this server (pid {os.getpid()}) was serving; the server stops "
            "(clients of a region that is not READY give up)"
        )
        log.error("%s", self.stop_reason)

    def _serve_batch(self) -> None:
        ctx, pending = self._ctx, self._pending_ptr
        count = _server_pending(ctx, pending, self._command_offset, self._same_cmd)
        if self._flying is not None:
            flying = self._flying.in_flight
            if self._shutdown_in_flight(flying):
                return
            self._pending[flying] = 0  # answered when their env ends
            count = int(np.count_nonzero(self._pending))
        if count == 0:
            return
        lease = self.lease
        pid = self._words.item(_CLIENT_PID_WORD)
        cmd = self._same_cmd[0]
        if (lease is None or lease.client_pid != pid) and cmd == _SHUTDOWN:
            # no session of this client to end: none is made (a pool)
            self._drop_lease(deferred=True)  # a previous holder's, if any
            self._answer(0)
            return
        status = 0
        try:
            if lease is None or lease.client_pid != pid:
                # making the client's envs can fail (the env factory): its HELLO says why
                lease = self._new_lease(pid) if pid else None
            if lease is None:
                raise RequestError(ErrorCode.HELLO_REQUIRED, "take the region's lease first")
            runtime = lease.runtime
            n = self.num_envs
            if count == n and cmd == _STEP_CODE:
                if n > 1:
                    ended = runtime.step(self._env_actions)
                    if ended:
                        self._stamp(ended)
                elif runtime.step_one(
                    0, self._actions.item(0) if self._scalar_action else self._action_at(0)
                ):
                    self._final_seqs[0] = self._seqs[0]
            elif count == n and cmd == _RESET:
                runtime.reset(self._seeds())
            elif count == n and cmd == _HELLO:
                runtime.set_autoreset(int(self._modes[0]))
            elif count == n and cmd == _OBSERVE:
                self._write_infos([msgpack.packb(info) for info in runtime.observe()])
            elif cmd == _OBSERVE:
                raise RequestError(
                    ErrorCode.BAD_BATCH,
                    f"OBSERVE needs slots 0..{n - 1} and no others ({count} slots asked)",
                )
            elif cmd == _STEP_MULTI:
                seats = runtime.seats
                if count != seats or not self._pending[:seats].all():
                    raise RequestError(
                        ErrorCode.BAD_BATCH,
                        f"STEP_MULTI needs slots 0..{seats - 1} and no others ({count} slots "
                        "asked)",
                    )
                self._stamp(runtime.step_multi(self._actions[:seats]))
            elif cmd == _SHUTDOWN:
                self._drop_lease(deferred=True)
            else:
                self._mixed(runtime)
                status = -1  # statuses written per slot
        except RequestError as exc:
            if exc.env_ids and count == self.num_envs:
                # the failed envs' slots carry the error; the others did their step (a
                # lock-step client reads the first failed slot; an async one each env's own)
                failed = [i for i in exc.env_ids if self._pending[i]]
                self._status[np.flatnonzero(self._pending)] = 0
                for i in failed:
                    self._status[i] = int(exc.code)
                    self._error_len[i] = write_text(self._error_text[i], exc.text)
                status = -1
            else:
                status = int(exc.code)
                self._error(exc.text)
        except Exception as exc:  # a bug must not take the server down (env errors: runtime)
            status = int(ErrorCode.INTERNAL)
            self._error(describe(exc))
        if self._columns and cmd not in (_HELLO, _SHUTDOWN):
            self._to_columns(None if count == self.num_envs else np.flatnonzero(self._pending))
        self._answer(status)

    def _answer(self, status: int) -> None:
        """Publish the pending slots with ``status`` (-1: each slot's own, written), their
        checksums stamped first; then close the runtime of a SHUTDOWN this answered (after the
        answer: a pool's close may wait for a busy worker, the client's close waits 1 s)."""
        if self._checksums is not None:
            for index in np.flatnonzero(self._pending).tolist():
                self._checksums.stamp(index)
        _server_publish(self._ctx, self._pending_ptr, status)
        closing = self._closing
        if closing is not None:
            self._closing = None
            closing.close()

    def _to_columns(self, ids: np.ndarray | list[int] | None) -> None:
        """Column layout: the runtime's rows of envs ``ids`` (None: every env) into the result
        columns, one vectorised copy per field, before they are published (docs/shm.md,
        "Column layout")."""
        if ids is None:  # every env: contiguous blocks
            n = self.num_envs
            for column, rows in self._columns:
                column[:n] = rows[:n]
            return
        for column, rows in self._columns:
            column[ids] = rows[ids]

    def _error(self, text: str) -> None:
        for i in np.flatnonzero(self._pending):
            self._error_len[i] = write_text(self._error_text[i], text)

    def _new_runtime(self) -> EnvRuntime:
        host = self.host
        return host.runtime(host.create_envs(), self.results, self.finals)

    def _new_lease(self, pid: int) -> _Lease:
        runtime = self._spare if self._spare is not None else self._new_runtime()
        self._spare, self._spare_failed = None, False
        self.lease = _Lease(runtime, pid)
        self._flying = None
        self._clear_recv_hint()
        return self.lease

    def _clear_recv_hint(self) -> None:
        """A new client starts without a RECV wake hint (an older one never writes it: a
        hint left by the previous client must not hold back its wakes)."""
        region = self.region
        if region is not None and region.recv_hint is not None:
            native.store_release(region.recv_hint, 0)

    def _drop_lease(self, *, deferred: bool = False) -> None:
        """The client said SHUTDOWN or died: its envs go (a worker pool stops); slot 0's info
        area says the server's info again (OBSERVE wrote env info there). ``deferred``: the
        lease's runtime is closed by ``_answer``, once the SHUTDOWN is answered (closing a pool
        waits up to 2 s for a worker busy in a step; the client's close waits 1 s)."""
        runtime = self.lease.runtime if self.lease is not None else None
        self.lease = self._flying = None
        self._clear_recv_hint()
        self._write_info(0, self._server_info)
        if runtime is not None:
            if deferred:
                self._closing = runtime
            else:
                runtime.close()

    def _write_info(self, index: int, data: bytes) -> None:
        """A msgpack map into slot ``index``'s info area (info_len 0 when it does not fit)."""
        region = self.region
        assert region is not None
        slot = region.slots[index]
        if len(data) > region.layout.info_max:
            slot["info_len"] = 0
            return
        slot["info"][: len(data)] = np.frombuffer(data, dtype=np.uint8)
        slot["info_len"] = len(data)

    def _write_infos(self, maps: list[bytes]) -> None:
        """OBSERVE's info maps: each in its slot's info area, or, when it does not fit (a
        rendered frame), in the side segment with a SIDE_REF in the slot (docs/shm.md "Frames")."""
        region = self.region
        assert region is not None
        large = {i: data for i, data in enumerate(maps) if len(data) > region.layout.info_max}
        refs = self._side.write(large) if large else {}
        for i, data in enumerate(maps):
            ref = refs.get(i)
            if ref is None:
                self._write_info(i, data)
                continue
            slot = region.slots[i]
            slot["info"][: len(ref)] = np.frombuffer(ref, dtype=np.uint8)
            slot["info_len"] = INFO_SIDE

    def _step_one(self, runtime: EnvRuntime, i: int) -> list[int]:
        return [i] if runtime.step_one(i, self._action_at(i)) else []

    def _action_at(self, i: int) -> Any:
        """Slot ``i``'s action: an int, or an owned array (Box, MultiDiscrete)."""
        return int(self._actions[i]) if self._scalar_action else self._actions[i].copy()

    def _stamp(self, ended: list[int]) -> None:
        """Mark each final area written by this step: final_seq = the request's sequence
        (stored before the response words are published: release)."""
        if len(ended) > 8:  # many at once (a vectorised env's episodes end together): one gather
            self._final_seqs[ended] = self._seqs[ended]
            return
        for i in ended:
            self._final_seqs[i] = self._seqs[i]

    def _seeds(self) -> list[int | None]:
        has_seed = self._has_seed.tolist()
        seeds = self._slot_seeds.tolist()
        return [seeds[i] if has_seed[i] else None for i in range(self.num_envs)]

    def _mixed(self, runtime: EnvRuntime) -> None:
        """Slots with different commands, or a subset: each answered on its own (a worker
        pool's STEPs: submitted together, each answered when its env ends)."""
        lease = self.lease
        batches = lease.batches if lease is not None else None
        if batches is not None:
            self._submit(batches)
        for i in np.flatnonzero(self._pending).tolist():
            code = 0
            try:
                cmd = int(self._commands[i])
                if cmd == SlotCommand.SHUTDOWN:
                    self._drop_lease(deferred=True)
                elif cmd == SlotCommand.HELLO:
                    runtime.set_autoreset(int(self._modes[i]))
                elif i >= self.num_envs:
                    raise RequestError(
                        ErrorCode.BAD_BATCH,
                        f"slot {i} is a seat slot (STEP_MULTI only); this server has "
                        f"{self.num_envs} envs",
                    )
                elif cmd == SlotCommand.STEP:
                    self._stamp(self._step_one(runtime, i))
                elif cmd == SlotCommand.RESET:
                    runtime.reset_one(i, int(self._slot_seeds[i]) if self._has_seed[i] else None)
                elif cmd in (SlotCommand.OBSERVE, SlotCommand.STEP_MULTI):
                    raise RequestError(
                        ErrorCode.BAD_BATCH,
                        f"slot {i}: {SlotCommand(cmd).name} is asked of its slots alone, not "
                        "mixed with other commands",
                    )
                else:
                    raise RequestError(ErrorCode.UNKNOWN_MESSAGE, f"slot {i}: command {cmd}")
            except RequestError as exc:
                code = int(exc.code)
                self._error_len[i] = write_text(self._error_text[i], exc.text)
            except Exception as exc:
                code = int(ErrorCode.INTERNAL)
                self._error_len[i] = write_text(self._error_text[i], describe(exc))
            self._status[i] = code

    # -- asynchronous batches on a worker pool (docs/shm.md) ------------------------------------

    def _shutdown_in_flight(self, flying: np.ndarray) -> bool:
        """A SHUTDOWN in a slot whose env is still in the pool (a client closed with envs in
        flight: its close writes SHUTDOWN into every slot). Answered at once, every pending slot
        with status 0, then the session's pool is closed (its in-flight envs are dropped; a
        worker stuck in a step is killed after its grace): the client's close, bounded to 1 s,
        must not wait for the envs, and its lease is free for the next client as soon as it
        is answered. False (nothing done) when no in-flight slot carries a SHUTDOWN."""
        n = flying.shape[0]
        again = flying & (self._pending[:n] != 0)  # a new request over an env in flight
        if not again.any() or not (self._commands[:n][again] == _SHUTDOWN).any():
            return False
        self._drop_lease(deferred=True)
        self._answer(0)
        return True

    def _submit(self, batches: AsyncBatches) -> None:
        """The pending STEP slots go to the pool at once; they leave ``_pending`` (answered by
        ``_publish_finished``), unless the runtime refuses them (answered now, with the error)."""
        pending = np.flatnonzero(self._pending)
        steps = pending[self._commands[pending] == SlotCommand.STEP]
        if steps.size == 0:
            return
        try:
            batches.send(steps, self._actions[steps])
        except RequestError as exc:
            for i in steps.tolist():
                self._status[i] = int(exc.code)
                self._error_len[i] = write_text(self._error_text[i], exc.text)
            self._pending[steps] = 0
            self._publish(steps.tolist())
            return
        self._pending[steps] = 0
        self._flying = batches
        self._publish_finished(batches)

    def _publish_finished(self, batches: AsyncBatches, check_workers: bool = False) -> None:
        """Answer the slots of the envs that ended by now (status, final_seq, response word)."""
        ids, ended, failed = batches.harvest(check_workers)
        if batches.count == 0:
            self._flying = None
        if not ids and not failed:
            return
        for i in ids:
            self._status[i] = 0
        self._stamp(ended)
        for i, exc in failed:
            self._status[i] = int(exc.code)
            self._error_len[i] = write_text(self._error_text[i], exc.text)
        # an env's error wakes the client at once (a Node client's RECV ends on the first)
        self._publish(ids + [i for i, _ in failed], None if failed else batches.count)

    def _publish(self, ids: list[int], remaining: int | None = None) -> None:
        """Answer slots ``ids`` (statuses written). ``remaining``: the envs still in flight
        after these; the client is then woken only when its RECV can end (the RECV wake hint,
        docs/shm.md "One wake per RECV"); None: wake it if it sleeps."""
        done = self._done
        done[:] = 0
        done[ids] = 1
        if self._columns:
            self._to_columns(ids)
        if self._checksums is not None:
            for i in ids:
                self._checksums.stamp(i)
        if remaining is None:
            native.lib.tp_server_publish(self._ctx, self._done_ptr, -1)
        else:
            native.lib.tp_server_publish_async(self._ctx, self._done_ptr, remaining)

    def _wait_in_flight(self, batches: AsyncBatches, last: int, idle_ns: int) -> int:
        """Envs run in the pool: wait for the doorbell (new requests) or a finished env,
        whichever comes first; returns the doorbell sequence handled (-1: the region closed)."""
        region = self.region
        assert region is not None
        word, ring = batches.runtime.runner.completion_word()
        rc = native.lib.tp_wait_either(self._ctx, region.doorbell, last, word, ring, idle_ns)
        if rc == 1:
            last = native.load_acquire(region.doorbell) & native.SEQ_MASK
            self._serve_batch()
        elif rc == 2:
            self._publish_finished(batches)
        elif rc == 0:
            self._publish_finished(batches, check_workers=True)
            self._housekeeping()
        elif rc == native.CLOSED:
            return -1
        return last

    def _housekeeping(self) -> None:
        """Idle: reclaim the lease of a dead client (its envs are dropped)."""
        region = self.region
        if region is None:
            return
        pid = int(region.words[_CLIENT_PID_WORD])
        start = region.get("client_start_time")
        if pid and not native.peer_alive(pid, start):
            log.warning("%s: client pid %d is gone; reclaiming its lease", self.url, pid)
            self._reclaim(pid, start)
        if self._spare is None and self.lease is None and not self._spare_failed:
            try:
                self._spare = self._new_runtime()  # ready for the next client
            except Exception as exc:  # the next client's HELLO is told (it tries again)
                self._spare_failed = True
                log.error("%s: cannot make the next client's envs: %s", self.url, describe(exc))

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
        self._side.close()
        if self.lease is not None:
            self.lease.runtime.close()
        if self._spare is not None:
            self._spare.close()
        if self._closing is not None:
            self._closing.close()
        self.lease = self._spare = self._flying = self._watch = self._closing = None
        self.results = self.finals = np.zeros(0)
        self._columns = []
        self._final_seqs = np.zeros(0, dtype=np.uint32)
        for name in (
            "_actions",
            "_modes",
            "_has_seed",
            "_slot_seeds",
            "_commands",
            "_status",
            "_words",
        ):
            if hasattr(self, name):
                delattr(self, name)
        self._error_len = self._error_text = np.zeros(0)
        if self._checksums is not None:
            self._checksums.release()
            self._checksums = None
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
