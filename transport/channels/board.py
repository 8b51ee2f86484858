"""The policy board: the latest consistent version of a set of named arrays, one publisher,
any number of readers (seed 002's double buffer and snapshot modes).

Layout (``schema/channels.toml``; offsets from the segment's start)::

    0     SegmentHeader (64)             kind BOARD, fingerprint = hash of the array table
    64    BoardHeader: mode, entries, payload_size, table_offset, data_offset, slot_stride,
          the publisher's lease (pid, start time)
    128   version u64 (latest published, 0: none) | active u32 (the slot readers read)
    192   notify u32: futex word bumped on every publish ("newer than v?" sleeps here)
    256   slot 0: seq u64 (odd while written) | version u64      (a line each)
    320   slot 1: seq u64 | version u64                           (DOUBLE_BUFFER only)
    384   BoardEntry[entries], 128 bytes each: name, NumPy dtype string, shape, offset, nbytes
    D     slot 0 payload: every array at its 64-aligned offset (payload_size bytes)
    D+S   slot 1 payload (DOUBLE_BUFFER)

Publishing writes a slot under its own seqlock (seq odd, copy, seq even), then makes it the
active one and announces its version. DOUBLE_BUFFER writes the slot readers are *not* reading
and flips ``active``: readers keep reading the previous version during a publish and never wait.
SEQLOCK has one slot: a reader that overlaps a publish retries. Either way a reader checks the
slot's seq before and after its copy, so it never returns a torn or mixed version, and keeps a
read only if its version is announced, so the versions a reader sees never go back.

A publish checks every array (present, shape, dtype, an array at all) before it touches a
slot, so a failed publish changes nothing. A publish that dies half way (an exception mid-copy,
a SIGKILL) leaves its slot odd; the next publisher of the lease (the same one, or one that took
the lease of a dead one) first *repairs* the board: an odd slot is zeroed and marked empty
(version 0, seq even again and higher than before, so a reader that overlapped retries), the
announced version is the highest one a whole slot or the publisher itself holds, ``active``
points at the newest whole slot. Readers treat a word the protocol never writes (``active``
out of range, a version that went back, one beyond 2**63) as ChannelCorruptError, an empty slot
of a board that announced a version as "no whole version here" (retry).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from typing import Any, Literal

import numpy as np

from transport import native
from transport.channels import lease
from transport.channels.errors import (
    ChannelCorruptError,
    ChannelInUseError,
    ChannelMismatchError,
    ChannelTimeoutError,
    PeerDiedError,
    TornReadError,
)
from transport.channels.segment import Kind, Segment, align
from transport.channels.wait import SLICE_S, WaitPolicy
from transport.generated import channels as layout

BOARD_OFFSET = 64
WORDS_OFFSET = 128
TABLE_OFFSET = 384
ENTRY_SIZE: int = layout.BoardEntry.size
_BOARD = {f.name: BOARD_OFFSET + f.offset for f in layout.BoardHeader.ir.fields}
_WORDS = {f.name: WORDS_OFFSET + f.offset for f in layout.BoardWords.ir.fields}
Mode = layout.BoardMode
MAX_DIMS: int = layout.BoardEntry.ir.field("shape").count
NAME_MAX: int = layout.BoardEntry.ir.field("name").count
MASK64 = 2**64 - 1
MAX_VERSION = 2**63 - 1  # a version word beyond it was never published: a scribble


def as_numpy(value: Any) -> np.ndarray:
    """A NumPy view of an array, a torch tensor (CPU, detached: no copy) or bytes. A torch
    dtype NumPy has no type for (bfloat16, float8, ...) raises TypeError naming it."""
    if hasattr(value, "detach"):  # torch.Tensor, without importing torch
        value = value.detach()
        if value.device.type != "cpu":
            value = value.cpu()
        try:
            return value.contiguous().numpy()  # type: ignore[no-any-return]
        except TypeError as exc:
            raise TypeError(_no_numpy_dtype(value.dtype)) from exc
    if isinstance(value, bytes | bytearray | memoryview):
        return np.frombuffer(value, dtype=np.uint8)
    return np.ascontiguousarray(value)


def _no_numpy_dtype(dtype: Any) -> str:
    return (
        f"{dtype} has no NumPy dtype: convert it (e.g. .float()), or carry its raw bits "
        "(.view(torch.int16)) and view them back"
    )


class ArraySpec:
    """One named array of a board: dtype, shape and where it lives in a slot."""

    def __init__(self, name: str, dtype: np.dtype[Any], shape: tuple[int, ...], offset: int):
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.offset = offset
        self.nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def table_of(arrays: Mapping[str, Any]) -> list[ArraySpec]:
    """The array table of a template (a ``state_dict``, a dict of arrays): 64-aligned offsets.
    A value that is not an array NumPy can hold (a bfloat16 tensor) is ChannelMismatchError."""
    specs = []
    offset = 0
    for name, value in arrays.items():
        try:
            arr = as_numpy(value)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ChannelMismatchError(f"{name}: not an array a board can carry ({exc})") from exc
        if len(name.encode()) > NAME_MAX or arr.ndim > MAX_DIMS:
            raise ValueError(f"{name!r}: names up to {NAME_MAX} bytes, up to {MAX_DIMS} dims")
        dtype = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
        spec = ArraySpec(name, np.dtype(dtype), tuple(int(d) for d in arr.shape), offset)
        specs.append(spec)
        offset = align(offset + spec.nbytes)
    return specs


def table_fingerprint(specs: list[ArraySpec]) -> int:
    """sha256 of ``name:dtype:shape;`` for every array (the Node side computes the same)."""
    text = "".join(f"{s.name}:{s.dtype.str}:{'x'.join(map(str, s.shape))};" for s in specs).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little")


class PolicyBoard:
    """A mapped board. ``publish`` (one publisher at a time: a lease), ``read`` / ``load_into``
    (any reader), ``version`` / ``wait_newer`` (no copy)."""

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        hdr = layout.BoardHeader.view(segment.map, BOARD_OFFSET)
        self._hdr = hdr
        self.mode = Mode(int(hdr["mode"]))
        self.payload_size = int(hdr["payload_size"])
        self._data_offset = int(hdr["data_offset"])
        self._stride = int(hdr["slot_stride"])
        table = layout.BoardEntry.view(segment.map, int(hdr["table_offset"]), int(hdr["entries"]))
        self.specs: list[ArraySpec] = []
        for e in table:
            name = bytes(e["name"]).rstrip(b"\0").decode()
            dtype = np.dtype(bytes(e["dtype"]).rstrip(b"\0").decode())
            shape = tuple(int(d) for d in e["shape"][: int(e["ndim"])])
            self.specs.append(ArraySpec(name, dtype, shape, int(e["offset"])))
        self.slots = [self._slot_views(i) for i in range(self.slot_count)]
        self._version = segment.word64(_WORDS["version"])
        self._active = segment.word(_WORDS["active"])
        self._notify = segment.word(_WORDS["notify"])
        self._seq = [segment.word64(_WORDS[f"slot{i}_seq"]) for i in range(2)]
        self._slot_version = [segment.word64(_WORDS[f"slot{i}_version"]) for i in range(2)]
        self._ctx = native.new_ctx()
        WaitPolicy(spin=0, futex_slice_ms=50.0).apply(self._ctx)
        self._ctx.state = segment.state_word
        self._ctx.ready_state = 1
        self._writer = False
        self._dirty = True  # the publisher repairs before its next publish
        self._published: int | None = None  # the last version this publisher announced
        self._active_slot = 0  # the slot this publisher made active
        self._last = 0  # the last version this reader returned

    @property
    def name(self) -> str:
        return self.segment.name

    @property
    def slot_count(self) -> int:
        return 2 if self.mode == Mode.DOUBLE_BUFFER else 1

    def _slot_views(self, slot: int) -> dict[str, np.ndarray]:
        base = self._data_offset + slot * self._stride
        return {
            s.name: np.ndarray(
                s.shape, dtype=s.dtype, buffer=self.segment.map, offset=base + s.offset
            )
            for s in self.specs
        }

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        name: str,
        template: Mapping[str, Any],
        *,
        mode: Literal["double_buffer", "seqlock"] = "double_buffer",
    ) -> PolicyBoard:
        """Create ``/dev/shm/transport-board-<name>`` for arrays shaped like ``template``
        (a torch ``state_dict``, a dict of NumPy arrays or bytes). Nothing is published yet."""
        if mode not in ("double_buffer", "seqlock"):
            raise ValueError(f"mode must be 'double_buffer' or 'seqlock', got {mode!r}")
        specs = table_of(template)
        payload = specs[-1].offset + specs[-1].nbytes if specs else 0
        stride = align(max(payload, 1), 4096)
        data_offset = align(TABLE_OFFSET + ENTRY_SIZE * len(specs), 4096)
        board_mode = Mode.DOUBLE_BUFFER if mode == "double_buffer" else Mode.SEQLOCK
        slots = 2 if board_mode == Mode.DOUBLE_BUFFER else 1

        def init(seg: Segment) -> None:
            hdr = layout.BoardHeader.view(seg.map, BOARD_OFFSET)
            hdr["mode"] = int(board_mode)
            hdr["entries"] = len(specs)
            hdr["payload_size"] = payload
            hdr["table_offset"] = TABLE_OFFSET
            hdr["data_offset"] = data_offset
            hdr["slot_stride"] = stride
            table = layout.BoardEntry.view(seg.map, TABLE_OFFSET, len(specs))
            for e, s in zip(table, specs, strict=True):
                e["name"] = np.frombuffer(s.name.encode().ljust(NAME_MAX, b"\0"), np.uint8)
                e["dtype"] = np.frombuffer(s.dtype.str.encode().ljust(8, b"\0"), np.uint8)
                e["ndim"] = len(s.shape)
                e["shape"] = list(s.shape) + [0] * (MAX_DIMS - len(s.shape))
                e["offset"] = s.offset
                e["nbytes"] = s.nbytes

        seg = Segment.create(
            Kind.BOARD,
            name,
            data_offset + slots * stride,
            fingerprint=table_fingerprint(specs),
            init=init,
        )
        return cls(seg)

    @classmethod
    def open(
        cls, name: str, template: Mapping[str, Any] | None = None, *, timeout: float = 10.0
    ) -> PolicyBoard:
        """Open a board; with ``template`` its array table must match (fingerprint)."""
        fp = None if template is None else table_fingerprint(table_of(template))
        return cls(Segment.open(Kind.BOARD, name, fingerprint=fp, timeout=timeout))

    # -- publishing ---------------------------------------------------------------------------

    def _take_lease(self) -> None:
        seg = self.segment
        pid_word = seg.word(_BOARD["writer_pid"])
        pid = native.load_acquire(pid_word)
        me = os.getpid()
        if pid == me:
            self._writer = True
            return
        if lease.holder_alive(pid, int(self._hdr["writer_start_time"])):
            raise ChannelInUseError(
                f"{seg.path}: the publisher lease is held by live pid {lease.holder(pid)}"
            )
        start_word = seg.word64(_BOARD["writer_start_time"])
        if not lease.take(pid_word, pid, partial(native.store64_release, start_word)):
            raise ChannelInUseError(f"{seg.path}: another publisher took the lease meanwhile")
        self._writer = True
        self._dirty = True
        self._published = None

    def _sources(self, arrays: Mapping[str, Any]) -> list[np.ndarray]:
        """Every array of the table as NumPy, checked (present, an array, shape, a dtype that
        casts same_kind) before the slot is touched: a publish that raises changes nothing."""
        if not isinstance(arrays, Mapping):
            raise ChannelMismatchError(f"publish: a mapping of arrays, got {type(arrays).__name__}")
        missing = [s.name for s in self.specs if s.name not in arrays]
        if missing:
            raise ChannelMismatchError(f"publish: missing arrays {missing}")
        sources = []
        for spec in self.specs:
            try:
                src = as_numpy(arrays[spec.name])
            except (TypeError, ValueError, RuntimeError) as exc:
                raise ChannelMismatchError(
                    f"{spec.name}: not an array a board can carry ({exc})"
                ) from exc
            if src.shape != spec.shape:
                raise ChannelMismatchError(f"{spec.name}: shape {src.shape}, expected {spec.shape}")
            if not np.can_cast(src.dtype, spec.dtype, casting="same_kind"):
                raise ChannelMismatchError(
                    f"{spec.name}: dtype {src.dtype} does not cast to {spec.dtype} (same_kind)"
                )
            sources.append(src)
        return sources

    def _target(self) -> int:
        return 1 - self._active_slot if self.mode == Mode.DOUBLE_BUFFER else 0

    def _needs_repair(self) -> bool:
        """Anything this publisher did not leave as it is: a publish of its own that died half
        way, a new lease, or words another process wrote."""
        if self._dirty or native.load64_acquire(self._version) != self._published:
            return True
        if (
            self.mode == Mode.DOUBLE_BUFFER
            and native.load_acquire(self._active) != self._active_slot
        ):
            return True
        return bool(native.load64_acquire(self._seq[self._target()]) & 1)

    def _repair(self) -> None:
        """Under the lease, before publishing: an odd slot (a publish died in it) is zeroed and
        marked empty, its seq even again and higher (a reader that overlapped retries); the
        announced version is the highest of the whole slots' and this publisher's own (a word
        beyond MAX_VERSION is ignored); DOUBLE_BUFFER readers are pointed at the newest whole
        slot."""
        best_version, best_slot = 0, 0
        for slot in range(self.slot_count):
            seq = native.load64_acquire(self._seq[slot])
            version = native.load64_acquire(self._slot_version[slot])
            if seq & 1 or version > MAX_VERSION:
                begin = ((seq + 1) | 1) & MASK64  # odd, and not a value a reader saw
                native.store64_release(self._seq[slot], begin)
                native.fence_release()
                for view in self.slots[slot].values():
                    view[...] = 0
                native.store64_release(self._slot_version[slot], 0)
                native.store64_release(self._seq[slot], (begin + 1) & MASK64)
                version = 0
            if version > best_version:
                best_version, best_slot = version, slot
        if self._published is None:
            word = native.load64_acquire(self._version)
            announced = max(best_version, word if word <= MAX_VERSION else 0)
        else:
            announced = max(best_version, self._published)
        if self.mode == Mode.DOUBLE_BUFFER:
            native.store_release(self._active, best_slot)
        self._active_slot = best_slot if self.mode == Mode.DOUBLE_BUFFER else 0
        native.store64_release(self._version, announced)
        self._published = announced
        self._dirty = False
        native.publish(self._notify, (native.load_acquire(self._notify) + 1) & native.SEQ_MASK)

    def next_version(self) -> int:
        """The version the next :meth:`publish` gets (to make arrays that carry it). Takes the
        publisher lease on first use (a new publisher first repairs what a dead one left)."""
        self.segment.require_open("next_version")
        if not self._writer:
            self._take_lease()
        if self._needs_repair():
            self._repair()
        assert self._published is not None
        return self._published + 1

    def publish(self, arrays: Mapping[str, Any]) -> int:
        """Copy every named array in as the next version (readers never see it half-written);
        returns that version. Takes the publisher lease on first use. Arrays that do not match
        the table raise ChannelMismatchError before anything is written."""
        self.segment.require_open("publish")
        sources = self._sources(arrays)
        version = self.next_version()
        if version > MAX_VERSION:
            raise ChannelCorruptError(f"{self.segment.path}: version {version} is out of range")
        slot = self._target()
        begin = ((native.load64_acquire(self._seq[slot]) + 1) | 1) & MASK64  # odd: being written
        self._dirty = True  # until the slot is whole again: an exception leaves it odd
        native.store64_release(self._seq[slot], begin)
        native.fence_release()
        views = self.slots[slot]
        for spec, src in zip(self.specs, sources, strict=True):
            np.copyto(views[spec.name], src, casting="same_kind")
        native.store64_release(self._slot_version[slot], version)
        native.store64_release(self._seq[slot], (begin + 1) & MASK64)  # even: stable
        native.store_release(self._active, slot)
        native.store64_release(self._version, version)
        self._active_slot, self._published, self._dirty = slot, version, False
        native.publish(self._notify, (native.load_acquire(self._notify) + 1) & native.SEQ_MASK)
        return version

    # -- reading -------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The latest published version (0: none yet). No copy."""
        self.segment.require_open("version")
        return native.load64_acquire(self._version)

    def newer_than(self, version: int) -> bool:
        return self.version > version

    def wait_newer(self, version: int, timeout: float | None) -> int:
        """Sleep (no CPU) until a version newer than ``version`` is published; returns it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.segment.require_open("wait_newer")
            seen = native.load_acquire(self._notify) & native.SEQ_MASK
            current = self.version
            if current > version:
                return current
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise ChannelTimeoutError(
                    f"{self.segment.path}: no version newer than {version} within {timeout} s"
                )
            # a slice at a time: Ctrl-C comes within SLICE_S, not when the next version does
            rc = native.wait_change(
                self._ctx, self._notify, seen, SLICE_S if left is None else min(left, SLICE_S)
            )
            if rc == native.CLOSED:
                raise PeerDiedError(f"{self.segment.path}: the board was closed")

    def _read(self, copy_into: Any, timeout: float) -> int:
        """Run ``copy_into(views)`` on the active slot until it ran on a stable one; returns the
        version read. Raises TornReadError after ``timeout`` of racing publishes."""
        deadline = time.monotonic() + timeout
        attempt = 0
        while True:
            self.segment.require_open("read")
            slot = self._read_slot()
            before = native.load64_acquire(self._seq[slot])
            if before % 2 == 0:
                version = native.load64_acquire(self._slot_version[slot])
                copy_into(self.slots[slot])
                native.fence_acquire()
                if native.load64_acquire(self._seq[slot]) == before and self._accept(version):
                    self._last = version
                    return version
            attempt += 1
            if time.monotonic() > deadline:
                self._check_writer()
                raise TornReadError(
                    f"{self.segment.path}: no stable read in {timeout} s ({attempt} attempts)"
                )
            if attempt > 3:
                time.sleep(0.0002 if attempt < 100 else 0.002)
            else:
                os.sched_yield()

    def _read_slot(self) -> int:
        """The slot to read: ``active`` (DOUBLE_BUFFER) or 0; out of range is corrupt."""
        if self.mode != Mode.DOUBLE_BUFFER:
            return 0
        slot = native.load_acquire(self._active)
        if slot not in (0, 1):
            raise ChannelCorruptError(f"{self.segment.path}: active slot {slot} (0 or 1)")
        return int(slot)

    def _announced(self, version: int) -> bool:
        """A stable slot may hold a version the publisher completed but has not yet announced
        (``active`` and the version word come after the slot): a reader that took ``active``
        just before two publishes finds it there. Returning it could make the next read go back
        one version, so such a read is retried; announced versions never decrease. An empty
        slot (version 0: zeroed by a repair) of a board that announced a version has no whole
        version in it."""
        announced = native.load64_acquire(self._version)
        return version <= announced and (version > 0 or announced == 0)

    def _accept(self, version: int) -> bool:
        """Whether a stable read of ``version`` may be returned (else retry); a version word
        out of range or below what this reader already returned is ChannelCorruptError."""
        announced = native.load64_acquire(self._version)
        if announced > MAX_VERSION or version > MAX_VERSION:
            raise ChannelCorruptError(
                f"{self.segment.path}: version {max(announced, version)} is out of range"
            )
        if announced < self._last:
            raise ChannelCorruptError(
                f"{self.segment.path}: the version went back from {self._last} to {announced}"
            )
        if not self._announced(version):
            return False
        if version < self._last:
            raise ChannelCorruptError(
                f"{self.segment.path}: read version {version} went back from {self._last}"
            )
        return True

    def _check_writer(self) -> None:
        pid = int(self._hdr["writer_pid"])
        if pid and not lease.holder_alive(pid, int(self._hdr["writer_start_time"])):
            raise PeerDiedError(
                f"{self.segment.path}: the publisher (pid {lease.holder(pid)}) died mid-publish"
            )

    def read(
        self, out: dict[str, np.ndarray] | None = None, *, timeout: float = 10.0
    ) -> tuple[int, dict[str, np.ndarray]]:
        """Copy the latest consistent version: (version, arrays). ``out`` (writable NumPy arrays
        of the table's shapes under its names, e.g. a previous result) is reused: no allocation.
        An ``out`` that does not fit raises ChannelMismatchError before anything is copied."""
        if out is None:
            target = {s.name: np.empty(s.shape, s.dtype) for s in self.specs}
        else:
            self._check_out(out)
            target = out

        def copy(views: dict[str, np.ndarray]) -> None:
            for name, view in views.items():
                np.copyto(target[name], view)

        return self._read(copy, timeout), target

    def _check_out(self, out: Mapping[str, Any]) -> None:
        """Every array of the table has a writable NumPy array in ``out`` of its shape and a
        dtype it casts to (same_kind): checked before a read copies anything."""
        if not isinstance(out, Mapping):
            raise ChannelMismatchError(f"read: out must be a mapping, got {type(out).__name__}")
        for spec in self.specs:
            dst = out.get(spec.name)
            if dst is None:
                missing = [s.name for s in self.specs if s.name not in out]
                raise ChannelMismatchError(f"read: out lacks arrays {missing}")
            if not isinstance(dst, np.ndarray):
                raise ChannelMismatchError(
                    f"read: out[{spec.name!r}] is a {type(dst).__name__}, not a NumPy array"
                )
            self._check_target(spec, dst, "out array")

    @staticmethod
    def _check_target(spec: ArraySpec, dst: np.ndarray, what: str) -> None:
        if dst.shape != spec.shape:
            raise ChannelMismatchError(
                f"{spec.name}: the {what} has shape {dst.shape}, the board's {spec.shape}"
            )
        if dst.dtype is not spec.dtype and not np.can_cast(
            spec.dtype, dst.dtype, casting="same_kind"
        ):
            raise ChannelMismatchError(
                f"{spec.name}: the board's {spec.dtype} does not cast to the {what}'s "
                f"{dst.dtype} (same_kind)"
            )
        if not dst.flags.writeable:
            raise ChannelMismatchError(f"{spec.name}: the {what} is read-only")

    def load_into(self, module: Any, *, strict: bool = True, timeout: float = 10.0) -> int:
        """Copy the latest consistent version straight into a torch module's parameters and
        buffers (one copy each, no intermediate; non-contiguous CPU tensors too); returns the
        version. Every tensor is checked first (CPU, a NumPy-able dtype, the board's shape, a
        dtype the board's casts to): a mismatch raises ChannelMismatchError and changes
        nothing. ``strict`` (as ``load_state_dict``): the module's state_dict has exactly the
        board's names; False: the module's tensors the board lacks are left as they are."""
        import torch

        self.segment.require_open("load_into")
        state = module.state_dict()
        missing = [s.name for s in self.specs if s.name not in state]
        names = {s.name for s in self.specs}
        unexpected = [k for k in state if k not in names] if strict else []
        if missing or unexpected:
            problems = [f"the module lacks {missing}"] if missing else []
            if unexpected:
                who = "it" if missing else "the module"
                problems.append(f"{who} has {unexpected} the board lacks (strict=False: kept)")
            raise ChannelMismatchError(f"load_into: {'; '.join(problems)}")
        targets = {}
        for spec in self.specs:
            tensor = state[spec.name]
            if not isinstance(tensor, torch.Tensor):
                raise ChannelMismatchError(
                    f"{spec.name}: the module's value is a {type(tensor).__name__}, not a tensor"
                )
            if tensor.device.type != "cpu":
                raise ChannelMismatchError(
                    f"{spec.name}: the module's tensor is on {tensor.device}; load_into writes "
                    "CPU tensors (read() it, then copy_ to the device)"
                )
            try:
                arr = tensor.detach().numpy()  # a view, strided for a non-contiguous tensor
            except TypeError as exc:
                raise ChannelMismatchError(f"{spec.name}: {_no_numpy_dtype(tensor.dtype)}") from exc
            except RuntimeError as exc:  # conjugate / negative views
                raise ChannelMismatchError(f"{spec.name}: the module's tensor: {exc}") from exc
            if any(st == 0 and n > 1 for st, n in zip(arr.strides, arr.shape, strict=True)):
                raise ChannelMismatchError(
                    f"{spec.name}: the module's tensor is expanded (elements share memory)"
                )
            self._check_target(spec, arr, "module's tensor")
            targets[spec.name] = arr

        def copy(views: dict[str, np.ndarray]) -> None:
            for name, view in views.items():
                np.copyto(targets[name], view)

        with torch.no_grad():
            return self._read(copy, timeout)

    @contextmanager
    def snapshot(self) -> Iterator[tuple[int, dict[str, np.ndarray], Any]]:
        """Zero-copy: ``(version, views, still_valid)`` of the active slot. Use the views, then
        call ``still_valid()``: False means a publish overlapped (discard what was computed).
        The views stay readable after :meth:`close` (their values at close); ``still_valid()``
        is then False."""
        self.segment.require_open("snapshot")
        slot = self._read_slot()
        before = native.load64_acquire(self._seq[slot])
        version = native.load64_acquire(self._slot_version[slot])

        def still_valid() -> bool:
            if self.segment.closed:
                return False
            native.fence_acquire()
            stable = before % 2 == 0 and native.load64_acquire(self._seq[slot]) == before
            return stable and self._announced(version)

        yield version, self.slots[slot], still_valid

    def close(self) -> None:
        """Give up the publisher lease; unmap (snapshot views kept by the caller keep their
        values: docs/channels.md); the creator also unlinks. Every other method then raises
        ChannelClosedError."""
        if self.segment.closed:
            return
        if self._writer:
            native.compare_exchange(self.segment.word(_BOARD["writer_pid"]), os.getpid(), 0)
        if self.segment.owner:
            native.futex_wake(self._notify)
        self.slots = []
        self._hdr = layout.BoardHeader.zeros()  # this object's own views go first
        self.segment.close()

    def __enter__(self) -> PolicyBoard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
