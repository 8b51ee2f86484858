"""The shared-memory region of ``shm://``: layout, lifecycle, wait policy, and the record views
of the slots that clients and servers read and write (protocol: docs/shm.md).

The layout is the schema compiler's (the IR's ``shm`` section: the ShmControl, ShmSlot and
ShmFinal structs and flat offset maps; the generated module of each schema prints it as a
diagram). Region = ShmControl (64 bytes, the same in every layout), then k slots, then k final
areas (k >= num_envs: a server whose env has ``step_batch`` has one slot per seat).
``ShmLayout.of(schema)`` reads it; nothing here hand-keeps an offset. The pac_env schema uses the
``pac_shm`` profile: seed 000 Appendix B byte for byte. The column layout (``[env] shm =
"columns"``) keeps only control words and texts in the slots and puts each request / result
field of all envs in one contiguous column after the final areas (``column_views``).

A segment lives at ``/dev/shm/transport-<name>`` (mode 0600), is created with O_EXCL and fully
reserved with ``posix_fallocate`` (a full /dev/shm is an error at creation, never a SIGBUS), and
is unlinked by its owner on a clean shutdown. A segment whose owner is dead (pid gone, a zombie,
or a different start time) is stale: replaced on creation, listed and removed by
``transport-serve --list-shm`` / ``--cleanup-shm``. A live one is never replaced.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from transport import native
from transport.backends.url_params import single_params
from transport.codec import Schema, StructCodec
from transport.errors import ConnectError, ProtocolError
from transport.generated import pac_shm
from transport.schema.ir import FieldIR, ShmColumn, shm_columns
from transport.shm_segment import STALE_CREATING_AFTER as STALE_CREATING_AFTER
from transport.shm_segment import SegmentListing, peek_segment

MAGIC = 0x50414354  # "PACT"
LAYOUT_VERSION: int = int(pac_shm.IR["version"])
CONTROL = pac_shm.ControlBlock
"""The control block: the same fields at the same offsets in every layout (ShmControl)."""
CONTROL_SIZE: int = CONTROL.size  # 64
PREFIX = "transport-"
SHM_DIR = "/dev/shm"
CHANNEL_PREFIXES = ("ring-", "board-", "control-")
"""Names of the channels' segments (/dev/shm/transport-ring-*, ...: transport.channels): no
region is called so, and --list-shm / --cleanup-shm leave them to
``python -m transport.channels``."""

RegionState = pac_shm.RegionState  # CREATING 0, READY 1, CLOSED 2
SlotCommand = pac_shm.SlotCommand  # STEP, RESET, SHUTDOWN, HELLO (mode in the action), OBSERVE,
# STEP_MULTI: the protocol envelope's enum, the same in every schema

CB: dict[str, FieldIR] = {f.name: f for f in CONTROL.ir.fields}

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShmLayout:
    """Where everything is in the region of one schema (the IR's ``shm`` section).

    ``result_dtype`` / ``final_dtype`` / ``request_dtype``: the result (request) fields at their
    offsets relative to ``result_base`` (``final_base``, ``request_base``) in a slot (a final
    area); views with row stride ``slot_size`` (``final_size``) put every field in place.
    """

    schema: Schema
    slot: StructCodec
    final: StructCodec
    result: StructCodec
    request: StructCodec
    slot_fields: dict[str, FieldIR]
    result_dtype: np.dtype[Any]
    result_base: int
    final_dtype: np.dtype[Any]
    final_base: int
    request_dtype: np.dtype[Any]
    request_base: int
    final_seq_offset: int
    checksum_offset: int
    result_span: tuple[int, int]
    """The slot's result bytes [start, end): what ?checksum=crc32 covers."""
    seats: int
    obs_size: int
    act_size: int
    columns: bool = False
    """The column layout (``[env] shm = "columns"``): the request and result fields live in
    columns after the final areas (``column_map``), not in the slots; ``result_dtype`` and
    ``request_dtype`` are then the wire records' (the server's private rows)."""

    @staticmethod
    def of(schema: Schema) -> ShmLayout:
        """The layout of ``schema``'s region (``ProtocolError`` for a schema without [env])."""
        cached = _LAYOUTS.get(schema.fingerprint)
        if cached is not None:
            return cached
        shm, env = schema.ir.shm, schema.ir.env
        if shm is None or env is None:
            raise ProtocolError(
                f"schema {schema.name} has no [env] table: shm:// needs the region layout the "
                "compiler derives from it"
            )
        result, request = schema[env.result], schema[env.request]
        final = schema[shm.final]
        final_dtype, final_base = _placed(result, shm.final_result_offsets)
        if shm.columns:  # the fields are in columns: rows are the wire records
            result_dtype, result_base = result.dtype, 0
            request_dtype, request_base = request.dtype, 0
            span = (0, 0)
        else:
            result_dtype, result_base = _placed(result, shm.result_offsets)
            request_dtype, request_base = _placed(request, shm.request_offsets)
            span = (
                min(shm.result_offsets.values()),
                max(shm.result_offsets[f.name] + f.size for f in result.ir.fields),
            )
        obs_size, act_size = result.ir.control_sizes()
        layout = ShmLayout(
            schema=schema,
            slot=schema[shm.slot],
            final=final,
            result=result,
            request=request,
            slot_fields={f.name: f for f in schema[shm.slot].ir.fields},
            result_dtype=result_dtype,
            result_base=result_base,
            final_dtype=final_dtype,
            final_base=final_base,
            request_dtype=request_dtype,
            request_base=request_base,
            final_seq_offset=final.ir.field("final_seq").offset,
            checksum_offset=schema[shm.slot].ir.field("checksum").offset,
            result_span=span,
            seats=env.seats,
            obs_size=obs_size,
            act_size=act_size,
            columns=shm.columns,
        )
        _LAYOUTS[schema.fingerprint] = layout
        return layout

    @property
    def slot_size(self) -> int:
        return self.slot.size

    @property
    def final_size(self) -> int:
        return self.final.size

    @property
    def error_text_max(self) -> int:
        return self.slot_fields["error_text"].count

    @property
    def info_max(self) -> int:
        return self.slot_fields["info"].count

    def region_size(self, slots: int) -> int:
        """The segment size (without the schema area): control block, ``slots`` slots,
        ``slots`` final-result areas (and, in the column layout, the columns)."""
        if self.columns:
            return shm_columns(self.schema.ir, slots)[1]
        return CONTROL_SIZE + slots * (self.slot_size + self.final_size)

    def column_map(self, slots: int) -> tuple[ShmColumn, ...]:
        """The columns of a column-layout region of ``slots`` slots (where each field starts)."""
        return shm_columns(self.schema.ir, slots)[0]

    def recv_hint_offset(self, slots: int) -> int | None:
        """Where the RECV wake hint word lies in a region of ``slots`` slots: the u32 at byte
        ``RECV_HINT_AT`` of final area 0, which every built-in layout leaves free (pac_shm's
        FinalArea has final_seq at 0 and the result from 16; derived layouts pad to 64). None
        when a profile puts a field there (no hint: the client is woken per publish)."""
        at, end = RECV_HINT_AT, RECV_HINT_AT + 4
        if self.final_size < end:
            return None
        for f in self.final.ir.fields:
            if f.offset < end and f.offset + f.size > at:
                return None
        return self.finals_offset(slots) + at

    def finals_offset(self, slots: int) -> int:
        """Where the first final-result area starts: right after the last slot."""
        return CONTROL_SIZE + slots * self.slot_size

    def slots_in(self, size: int, num_envs: int) -> tuple[int, bool] | None:
        """(slots, has final areas) of a segment of ``size`` bytes serving ``num_envs`` envs:
        size = control + k x (slot + final) with k >= num_envs, or control + num_envs slots (a
        server without final areas). None: no such k."""
        body, unit = size - CONTROL_SIZE, self.slot_size + self.final_size
        if self.columns:
            return self._column_slots_in(size, num_envs)
        if body >= 0 and body % unit == 0 and body // unit >= max(num_envs, 1):
            return body // unit, True
        if body == num_envs * self.slot_size:
            return num_envs, False
        return None

    def _column_slots_in(self, size: int, num_envs: int) -> tuple[int, bool] | None:
        """The smallest k >= max(num_envs, 1) whose column region is ``size`` bytes: k lies
        within (number of columns + 1) of (size - control) / (bytes of one env), as each
        column's rounding adds less than 64 bytes."""
        columns = self.column_map(1)
        unit = self.slot_size + self.final_size + sum(c.field.size for c in columns)
        slack = COLUMN_SLACK * (len(columns) + 1)
        low = max(num_envs, 1, (size - CONTROL_SIZE - slack) // unit)
        for k in range(low, max(low, (size - CONTROL_SIZE) // unit) + 1):
            if self.region_size(k) == size:
                return k, True
        return None


RECV_HINT_AT = 4
"""Byte of final area 0 that holds the RECV wake hint (docs/shm.md "One wake per RECV"): u32,
written by the client before a RECV sleeps, ``in flight - want + 1`` (0: no hint, wake me on
every publish); a server wakes the client only once fewer than that many of its envs are
unanswered."""

COLUMN_SLACK = 64
"""The most one column's start rounding (to 64 bytes) adds."""

_LAYOUTS: dict[int, ShmLayout] = {}


def column_views(
    layout: ShmLayout, buffer: Any, slots: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(request columns, result columns) of a column-layout region of ``slots`` slots held in
    ``buffer`` (the mapping, or any writable buffer of ``region_size(slots)`` bytes): each
    field's (k, *dims) C-contiguous view, env i's value at ``start + i * field.size`` in the
    wire record's encoding."""
    requests: dict[str, np.ndarray] = {}
    results: dict[str, np.ndarray] = {}
    for column in layout.column_map(slots):
        codec, side = (
            (layout.request, requests) if column.part == "request" else (layout.result, results)
        )
        elem = codec.dtype[column.field.name]
        side[column.field.name] = np.ndarray(
            (slots, *elem.shape), dtype=elem.base, buffer=buffer, offset=column.start
        )
    return requests, results


class ColumnRecords:
    """``count`` records of a column-layout region, duck-typed as a record array where the
    client, or a server's vector env that writes the columns (``writes_columns``), needs one:
    ``records[name]`` is the field's column, an (N, ...) C-contiguous view of the mapping (the
    env's field alone without an env axis for ``count`` None); ``copy()`` (and ``np.asarray``)
    gives owned wire records. ``dtype`` is the wire record's."""

    __slots__ = ("dtype", "fields", "ndim", "shape")

    def __init__(
        self,
        dtype: np.dtype[Any],
        columns: dict[str, np.ndarray],
        count: int | None,
        *,
        sliced: bool = False,
    ) -> None:
        self.dtype = dtype
        self.shape: tuple[int, ...] = () if count is None else (count,)
        self.ndim = len(self.shape)
        self.fields = (
            dict(columns)
            if sliced
            else {
                name: column[0, ...] if count is None else column[:count]
                for name, column in columns.items()
            }
        )

    def __getitem__(self, key: Any) -> Any:
        """``[name]``: the column (a view: writes land in the region); ``[i]`` / ``[i, ...]``:
        env i's record, ``[ids]``: those envs' records (owned copies, gathered now); ``[a:b]``:
        the column records of those envs (views)."""
        if isinstance(key, str):
            return self.fields[key]
        if isinstance(key, tuple) and len(key) == 2 and key[1] is Ellipsis:
            key = key[0]
        if isinstance(key, slice):
            rows = {name: column[key] for name, column in self.fields.items()}
            count = len(range(*key.indices(self.shape[0])))
            return ColumnRecords(self.dtype, rows, count, sliced=True)
        index = np.asarray(key)
        return self._gather(index, index.shape)

    def __setitem__(self, key: Any, value: Any) -> None:
        """``[name] = v`` writes the column; ``[rows] = records`` (``...``, a slice, ids) writes
        every field of those envs from a record or record array."""
        if isinstance(key, str):
            self.fields[key][...] = value
            return
        for name, column in self.fields.items():
            column[key] = value[name]

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized column records")
        return self.shape[0]

    def copy(self) -> np.ndarray:
        """The records as an owned record array in the wire layout (one copy per field)."""
        return self._gather(Ellipsis, self.shape)

    def _gather(self, rows: Any, shape: tuple[int, ...]) -> np.ndarray:
        """Owned wire records of ``rows`` (an index, ids, or ``...``: all), field by field."""
        out = np.zeros(shape, dtype=self.dtype)
        for name, column in self.fields.items():
            out[name] = column[rows]
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.copy()
        return out if dtype is None else out.astype(dtype)


# -- the schema area: the region carries its schema (discovery, docs/shm.md) ---------------------
#
#   ... k final areas | IR JSON (utf-8) | zero padding | trailer (the segment's last 16 bytes):
#                     ^ region_size(k)                   u32 magic "SCIR", u32 ir_len, 8 zero bytes
#
# The area is a multiple of 64 bytes and ends the segment, so a client with no schema finds it
# from the segment size alone: it reads the trailer, then the IR, builds the schema and checks
# it against the control block's fingerprint before it computes a single offset of the layout.

SCHEMA_MAGIC = 0x52494353  # "SCIR"
SCHEMA_TRAILER = struct.Struct("<II8x")
SCHEMA_AREA_ALIGN = 64


def schema_area(schema: Schema) -> bytes:
    """The schema area of a region of ``schema``: its IR JSON, padding, the trailer."""
    from transport.protocol import schema_ir_text

    text = schema_ir_text(schema).encode("utf-8")
    size = -(-(len(text) + SCHEMA_TRAILER.size) // SCHEMA_AREA_ALIGN) * SCHEMA_AREA_ALIGN
    area = bytearray(size)
    area[: len(text)] = text
    SCHEMA_TRAILER.pack_into(area, size - SCHEMA_TRAILER.size, SCHEMA_MAGIC, len(text))
    return bytes(area)


def schema_area_of(data: Any, size: int) -> tuple[int, bytes | None]:
    """(area size, IR JSON bytes) of a segment of ``size`` bytes mapped or read as ``data``
    (anything slicable); (0, None) for a segment without a schema area."""
    if size < CONTROL_SIZE + SCHEMA_TRAILER.size:
        return 0, None
    magic, length = SCHEMA_TRAILER.unpack(bytes(data[size - SCHEMA_TRAILER.size : size]))
    area = -(-(length + SCHEMA_TRAILER.size) // SCHEMA_AREA_ALIGN) * SCHEMA_AREA_ALIGN
    if magic != SCHEMA_MAGIC or area > size - CONTROL_SIZE:
        return 0, None
    start = size - area
    return area, bytes(data[start : start + length])


def _placed(codec: StructCodec, offsets: dict[str, int]) -> tuple[np.dtype[Any], int]:
    """``codec``'s fields at ``offsets`` (relative to the smallest), and that smallest offset.
    Where the struct is embedded whole, records span its size (their bytes are the codec's)."""
    names = [f.name for f in codec.ir.fields]
    base = min(offsets[name] for name in names)
    formats = [codec.dtype[name] for name in names]
    rel = [offsets[name] - base for name in names]
    itemsize = max(o + np.dtype(f).itemsize for o, f in zip(rel, formats, strict=True))
    if rel == [f.offset for f in codec.ir.fields]:  # the struct is embedded whole (derived)
        itemsize = codec.size  # a record's bytes are the codec's, padding included
    dtype = np.dtype({"names": names, "formats": formats, "offsets": rel, "itemsize": itemsize})
    return dtype, base


# -- wait policy ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class WaitPolicy:
    """How a waiter waits: ``spin`` busy iterations (a PAUSE each), then FUTEX_WAIT slices.

    ``futex_slice_ms``: the length of one FUTEX_WAIT; after each slice the waiter re-checks the
    peer's liveness and the region state, so a dead peer is found within about one slice.

    CPU cost: while a request is outstanding a waiter burns one core for at most ``spin``
    iterations (PAUSE is ~10-140 cycles depending on the CPU: 20,000 spins are ~0.1-1 ms), then
    sleeps in the kernel at no CPU cost. An idle server or client never burns more than one
    spin budget per request. Presets:

    - ``"spin"``: spin 2,000,000 (~10-100 ms of one core per wait): lowest latency when each side
      has a core of its own; wasteful when cores are shared.
    - ``"balanced"`` (default): spin 20,000, then sleep: microsecond latency when steps come
      back to back, no idle CPU.
    - ``"futex"``: sleep at once: no spinning at all, ~2 context switches per round trip (tens of
      microseconds); for oversubscribed machines.
    """

    spin: int = 20_000
    futex_slice_ms: float = 50.0

    @classmethod
    def named(cls, name: str) -> WaitPolicy:
        try:
            return PRESETS[name]
        except KeyError:
            raise ValueError(
                f"unknown wait policy {name!r} (known: {', '.join(sorted(PRESETS))})"
            ) from None

    @classmethod
    def resolve(cls, policy: WaitPolicy | str | None) -> WaitPolicy:
        if policy is None:
            return PRESETS["balanced"]
        if isinstance(policy, WaitPolicy):
            return policy
        return cls.named(policy)

    def apply(self, ctx: Any) -> None:
        """Set the policy on a native ``tp_ctx``."""
        ctx.spin = max(0, int(self.spin))
        ctx.slice_ns = max(1_000_000, int(self.futex_slice_ms * 1e6))


PRESETS: dict[str, WaitPolicy] = {
    "spin": WaitPolicy(spin=2_000_000, futex_slice_ms=50.0),
    "balanced": WaitPolicy(spin=20_000, futex_slice_ms=50.0),
    "futex": WaitPolicy(spin=0, futex_slice_ms=50.0),
}


# -- URLs and names ------------------------------------------------------------------------------

_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,200}\Z")  # \Z: no trailing newline


@dataclass(frozen=True)
class ShmUrl:
    name: str
    num_envs: int | None
    wait: WaitPolicy
    checksum: str | None = None
    """``crc32``: the server writes, the client checks, a CRC-32 of every slot's result bytes."""

    @property
    def segment(self) -> str:
        """The shm_open name: ``/transport-<name>``."""
        return "/" + PREFIX + self.name

    @property
    def path(self) -> str:
        return os.path.join(SHM_DIR, PREFIX + self.name)


def names_wait_policy(url: str) -> bool:
    """True when an shm URL's query names a wait policy (``wait`` or ``spin``): then it is
    followed as given, never replaced by a default chosen for the envs (a worker pool's)."""
    query = url.partition("?")[2]
    return any(item.partition("=")[0] in ("wait", "spin") for item in query.split("&"))


def parse_url(url: str) -> ShmUrl:
    """``shm://name?num_envs=N&wait=balanced|spin|futex&spin=K&slice_ms=M&checksum=crc32``."""
    scheme, sep, rest = url.partition("://")
    if scheme.lower() != "shm" or not sep:
        raise ConnectError(f"{url!r} is not an shm:// URL")
    name, _, query = rest.partition("?")
    name = name.strip("/")
    if not _NAME.match(name):
        raise ConnectError(
            f"{url!r}: the region name must be 1-201 characters of A-Z a-z 0-9 . _ -, the "
            "first a letter or a digit (it becomes /dev/shm/transport-<name>)"
        )
    if name.startswith(CHANNEL_PREFIXES):
        raise ConnectError(
            f"{url!r}: region names beginning {', '.join(CHANNEL_PREFIXES[:-1])} or "
            f"{CHANNEL_PREFIXES[-1]} are reserved for channels (/dev/shm/{PREFIX}{name} is a "
            "channel's segment: python -m transport.channels --list)"
        )
    params = single_params(url, query)
    unknown = set(params) - {"num_envs", "wait", "spin", "slice_ms", "checksum"}
    if unknown:
        raise ConnectError(f"{url!r}: unknown parameter(s) {', '.join(sorted(unknown))}")
    num_envs: int | None = None
    try:
        if "num_envs" in params:
            num_envs = int(params["num_envs"])
            if num_envs < 1:
                raise ValueError
        policy = WaitPolicy.named(params.get("wait", "balanced"))
        if "spin" in params or "slice_ms" in params:
            policy = WaitPolicy(
                spin=int(params.get("spin", policy.spin)),
                futex_slice_ms=float(params.get("slice_ms", policy.futex_slice_ms)),
            )
    except ValueError as exc:
        reason = str(exc) or "num_envs must be >= 1"
        raise ConnectError(f"{url!r}: bad parameter value ({reason})") from None
    checksum = params.get("checksum")
    if checksum not in (None, *CHECKSUMS):
        raise ConnectError(
            f"{url!r}: unknown checksum {checksum!r} (known: {', '.join(CHECKSUMS)})"
        )
    return ShmUrl(name, num_envs, policy, checksum)


def own_start_time() -> int:
    return native.proc_start_time(os.getpid())


# -- the mapped region ---------------------------------------------------------------------------


class Region:
    """A mapped segment: the control block's words and the slots, as pointers and NumPy views.

    ``slots``: how many slots the owner lays out; None for an attaching client, which reads it
    from the segment size (``num_slots`` 0 when the size fits no layout: validation says so).
    """

    def __init__(
        self,
        segment: str,
        fd: int,
        size: int,
        layout: ShmLayout,
        *,
        owner: bool,
        slots: int | None = None,
    ) -> None:
        self.segment = segment
        self.owner = owner
        self.size = size
        self.layout = layout
        self.inode = os.fstat(fd).st_ino
        self.mapping = native.SharedMapping(fd, size)
        self.map: Any = self.mapping.buffer
        """The writable buffer of the mapping: every view is made of it and keeps it alive."""
        self.guard = self.mapping.guard
        self.control = CONTROL.view(self.map)  # 0-d record
        self.words = np.ndarray((CONTROL_SIZE // 4,), dtype="<u4", buffer=self.map)
        self.base = native.address(self.map)
        self.state_word = native.word(self.map, CB["state"].offset)
        self.doorbell = native.word(self.map, CB["doorbell"].offset)
        self.client_pid_word = native.word(self.map, CB["client_pid"].offset)
        has_finals = True
        self.schema_area, self.schema_ir = schema_area_of(self.map, size)
        if slots is None:  # an attaching client: the size says (validated later)
            found = layout.slots_in(size - self.schema_area, int(self.control["num_envs"]))
            slots, has_finals = found if found is not None else (0, False)
        self.num_slots = slots
        self.has_finals = has_finals
        hint_at = layout.recv_hint_offset(slots) if has_finals and slots else None
        self.recv_hint: Any = (
            native.word(self.map, hint_at)
            if hint_at is not None and hint_at + 4 <= size - self.schema_area
            else None
        )
        """``uint32_t *`` to the RECV wake hint word, or None (no final areas: no hint)."""
        self.slots = layout.slot.view(self.map, CONTROL_SIZE, count=slots)
        self.request_columns: dict[str, np.ndarray] = {}
        """Column layout: each request field's (k, ...) column, C-contiguous (empty otherwise)."""
        self.result_columns: dict[str, np.ndarray] = {}
        """Column layout: each result field's (k, ...) column, C-contiguous (empty otherwise)."""
        if layout.columns and slots:
            self.request_columns, self.result_columns = column_views(layout, self.map, slots)

    @property
    def truncated(self) -> bool:
        """Another process truncated the segment and a touch of it faulted (see native.guard):
        this mapping now holds private zero pages; the region is gone for this process."""
        return self.guard >= 0 and native.guard_lost(self.guard)

    # control block fields
    def get(self, field: str) -> int:
        return int(self.control[field])

    def set(self, field: str, value: int) -> None:
        self.control[field] = value

    @property
    def state(self) -> int:
        """The region's state word (CLOSED once this mapping is closed: no pointer is read)."""
        if self.mapping.closed:
            return int(RegionState.CLOSED)
        return native.load_acquire(self.state_word)

    def strided(self, field: str) -> np.ndarray:
        """A (k, ...) view of one slot field across every slot (row stride = the slot size)."""
        f = self.layout.slot_fields[field]
        elem = self.slots.dtype[field].base
        stride = self.layout.slot_size
        k = self.num_slots
        shape: tuple[int, ...] = (k,) if f.count == 1 else (k, f.count)
        strides: tuple[int, ...] = (stride,) if f.count == 1 else (stride, elem.itemsize)
        return np.ndarray(
            shape, dtype=elem, buffer=self.map, offset=CONTROL_SIZE + f.offset, strides=strides
        )

    def column_results(self, count: int | None) -> ColumnRecords:
        """Column layout: the results of the first ``count`` envs (env 0's for None)."""
        return ColumnRecords(self.layout.result.dtype, self.result_columns, count)

    def column_requests(self, count: int | None) -> ColumnRecords:
        """Column layout: the requests of the first ``count`` envs (the client writes them)."""
        return ColumnRecords(self.layout.request.dtype, self.request_columns, count)

    def results(self) -> np.ndarray:
        """(k,) result records, one per slot, into the mapping (slot layouts only)."""
        lay = self.layout
        return self._rows(lay.result_dtype, CONTROL_SIZE + lay.result_base, lay.slot_size)

    def requests(self) -> np.ndarray:
        """(k,) request records, one per slot (the client writes them, the server reads)."""
        lay = self.layout
        return self._rows(lay.request_dtype, CONTROL_SIZE + lay.request_base, lay.slot_size)

    def finals(self) -> tuple[np.ndarray, np.ndarray]:
        """(k,) final_seq words and (k,) final-result records (the final areas)."""
        lay = self.layout
        base = lay.finals_offset(self.num_slots)
        seqs = self._rows(np.dtype("<u4"), base + lay.final_seq_offset, lay.final_size)
        return seqs, self._rows(lay.final_dtype, base + lay.final_base, lay.final_size)

    def _rows(self, dtype: np.dtype[Any], offset: int, stride: int) -> np.ndarray:
        """One ``dtype`` item per slot (or final area) at ``offset``, ``stride`` bytes apart."""
        return np.ndarray(
            (self.num_slots,), dtype=dtype, buffer=self.map, offset=offset, strides=(stride,)
        )

    @property
    def closed(self) -> bool:
        return self.mapping.closed

    def close(self) -> None:
        """End this process's use of the segment (docs/shm.md, "Lifetimes"). Views still alive
        (results kept by the user) never dangle: they keep a private copy of the mapping, taken
        now, which is unmapped when the last of them dies; with none left it is unmapped now.
        The raw pointers (``base``, the words) must not be used afterwards."""
        if self.mapping.closed:
            return
        self.control = CONTROL.zeros()
        self.words = np.zeros(0, dtype="<u4")
        self.slots = np.zeros(0)
        self.request_columns, self.result_columns = {}, {}
        self.map = bytearray()
        self.mapping.close()


CHECKSUMS = ("crc32",)
"""The optional per-slot checksums (docs/shm.md, "What the zero-copy contract cannot protect")."""


class SlotChecksums:
    """CRC-32 (zlib's, as Node's ``zlib.crc32``) of each slot's result bytes, stored in the
    slot's ``checksum`` word: the server stamps before publishing, the client checks after."""

    def __init__(self, region: Region) -> None:
        layout, start = region.layout, CONTROL_SIZE
        lo, hi = layout.result_span
        whole = memoryview(region.map)
        self.spans: list[Any] = []
        """Each slot's result bytes: one memoryview (slot layouts, checked by ``zlib.crc32``
        itself: no Python frame per slot), or a list of one per result column (the column
        layout: the CRC is chained over them in declaration order)."""
        self._crc: Callable[[Any], int] = zlib.crc32
        if layout.columns:
            columns = [c for c in layout.column_map(region.num_slots) if c.part == "result"]
            self.spans = [
                [
                    whole[c.start + i * c.field.size : c.start + (i + 1) * c.field.size]
                    for c in columns
                ]
                for i in range(region.num_slots)
            ]
            self._crc = _chained_crc
        else:
            self.spans = [
                whole[start + i * layout.slot_size + lo : start + i * layout.slot_size + hi]
                for i in range(region.num_slots)
            ]
        self.words = region.strided("checksum")

    def stamp(self, index: int) -> None:
        self.words[index] = self._crc(self.spans[index])

    def matches(self, index: int) -> bool:
        return bool(self._crc(self.spans[index]) == self.words[index])

    def first_bad(self, count: int) -> int:
        """The first of slots 0..count-1 whose result bytes do not match their word, or -1."""
        crc, spans, words = self._crc, self.spans, self.words
        for i in range(count):
            if crc(spans[i]) != words[i]:
                return i
        return -1

    def release(self) -> None:
        for spans in self.spans:
            for span in spans if isinstance(spans, list) else [spans]:
                span.release()
        self.spans = []


def _chained_crc(spans: list[memoryview]) -> int:
    """CRC-32 of the spans' bytes one after the other (an env's result columns)."""
    crc = 0
    for span in spans:
        crc = zlib.crc32(span, crc)
    return crc


def write_text(buf: np.ndarray, text: str) -> int:
    """UTF-8 ``text`` into a u8 array, cut at a character boundary; returns the byte count."""
    data = text.encode("utf-8")[: buf.shape[-1]]
    data = data.decode("utf-8", "ignore").encode("utf-8")
    buf[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    return len(data)


def wait_ctx(region: Region, policy: WaitPolicy, seqs: np.ndarray) -> Any:
    ctx = native.new_ctx()
    fields = region.layout.slot_fields
    ctx.slots = region.base + CONTROL_SIZE
    ctx.stride = region.layout.slot_size
    ctx.n = region.num_slots
    ctx.req_off = fields["sem_action_ready"].offset
    ctx.resp_off = fields["sem_result_ready"].offset
    ctx.status_off = fields["status"].offset
    ctx.seqs = native.ffi.cast("uint32_t *", native.ffi.from_buffer(seqs, require_writable=True))
    ctx.doorbell = region.doorbell
    ctx.state = region.state_word
    ctx.ready_state = RegionState.READY
    if region.recv_hint is not None:
        ctx.recv_hint = region.recv_hint
    policy.apply(ctx)
    return ctx


# -- inspection, stale detection, cleanup ------------------------------------------------------


@dataclass(frozen=True)
class RegionInfo(SegmentListing):
    """What ``--list-shm`` shows about one ``/dev/shm/transport-*`` entry.

    ``state``: a region's RegionState name (READY, CREATING, CLOSED, UNKNOWN(n)); SIDE (a side
    segment); EMPTY (shorter than a control block, or an all-zero one: a server between
    shm_open and its first header write, for up to 10 s); FOREIGN (anything else: not ours);
    UNREADABLE (``note`` says why); NOT_A_FILE (``note``: "a directory", "a FIFO", ...).
    Only a region or side segment whose owner is dead (or that never got an owner in 10 s) is
    stale: nothing else is ever removed (docs/shm.md "Lifecycle").
    """

    name: str
    path: str
    size: int
    magic_ok: bool
    version: int
    num_envs: int
    state: str
    owner_pid: int
    owner_alive: bool
    client_pid: int
    age_s: float
    uid: int = -1
    note: str = ""
    NOT_OURS = "not a transport region"

    @property
    def ours(self) -> bool:
        """A region or a side segment (its header says so)."""
        return self.magic_ok or self.state == "SIDE"

    def describe(self) -> str:
        """One ``--list-shm`` line."""
        other = self.describe_other()
        if other is not None:
            return other
        return (
            f"{self.path}  {self.verdict}  state={self.state} envs={self.num_envs} "
            f"owner={self.owner_pid or '-'} client={self.client_pid or '-'} size={self.size}"
        )

    def refusal(self, url: str) -> str:
        """Why a server on this name cannot replace it (this segment is not stale)."""
        if self.state == "UNREADABLE":
            return f"{url}: {self.path} cannot be read ({self.note}); it is not replaced"
        if self.state == "NOT_A_FILE":
            return (
                f"{url}: {self.path} is {self.note}, not a shared-memory segment: remove it if "
                "nothing uses it"
            )
        if self.ours and self.owner_alive:
            return (
                f"{url} is in use by a live server (pid {self.owner_pid}); {self.path} is not "
                "replaced"
            )
        if self.ours or self.creating:
            return (
                f"{url} is in use by a live server (a server starting up); {self.path} is not "
                "replaced"
            )
        return (
            f"{url}: {self.path} exists and is not a transport region: remove it if nothing uses it"
        )

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["stale"] = self.stale
        data["verdict"] = self.verdict
        return data


def inspect_segment(path: str) -> RegionInfo:
    """Read a segment's control block without mapping it, without following a link and without
    blocking (a FIFO named like a segment is reported, never opened for reading)."""
    peek = peek_segment(path, CONTROL_SIZE)
    st = peek.st
    name = os.path.basename(path)[len(PREFIX) :]
    age = max(0.0, time.time() - st.st_mtime)

    def other(state: str, note: str = "", size: int = st.st_size) -> RegionInfo:
        return RegionInfo(name, path, size, False, 0, 0, state, 0, False, 0, age, st.st_uid, note)

    if peek.what == "not-a-file":
        return other("NOT_A_FILE", peek.note)
    if peek.what == "unreadable":
        return other("UNREADABLE", peek.note)
    header = peek.head
    if len(header) < CONTROL_SIZE or not any(header):
        return other("EMPTY")
    cb = CONTROL.view(header)
    magic_ok = int(cb["magic"]) == MAGIC
    side = int(cb["magic"]) == SIDE_MAGIC  # a side segment: its owner at the same offsets
    if not magic_ok and not side:
        return other("FOREIGN")
    pid = int(cb["owner_pid"])
    start = int(cb["owner_start_time"])
    state_value = int(cb["state"])
    try:
        state = RegionState(state_value).name
    except ValueError:
        state = f"UNKNOWN({state_value})"
    return RegionInfo(
        name=name,
        path=path,
        size=st.st_size,
        magic_ok=magic_ok,
        version=int(cb["version"]),
        num_envs=0 if side else int(cb["num_envs"]),  # a side segment's generation is there
        state=state if magic_ok else "SIDE",
        owner_pid=pid,
        owner_alive=native.peer_alive(pid, start) if pid else False,
        client_pid=int(cb["client_pid"]) if magic_ok else 0,
        age_s=age,
        uid=st.st_uid,
    )


def list_segments() -> list[RegionInfo]:
    """Every ``/dev/shm/transport-*`` entry but the channels' (``transport-ring-*`` ...:
    ``python -m transport.channels --list``), inspected."""
    out: list[RegionInfo] = []
    try:
        names = sorted(os.listdir(SHM_DIR))
    except FileNotFoundError:
        return out
    channels = tuple(PREFIX + p for p in CHANNEL_PREFIXES)
    for entry in names:
        if entry.startswith(PREFIX) and not entry.startswith(channels):
            try:
                out.append(inspect_segment(os.path.join(SHM_DIR, entry)))
            except FileNotFoundError:
                continue
    return out


def cleanup_stale(errors: list[str] | None = None) -> list[RegionInfo]:
    """Unlink every stale region and side segment; returns the ones removed. A segment that
    cannot be removed does not stop the others: its error is added to ``errors`` (logged when
    there is no such list)."""
    removed = []
    for info in list_segments():
        if info.stale:
            try:
                native.shm_unlink("/" + PREFIX + info.name)
                removed.append(info)
            except FileNotFoundError:
                pass
            except OSError as exc:
                text = f"cannot remove {info.path}: {exc.strerror}"
                if errors is None:
                    log.warning("%s", text)
                else:
                    errors.append(text)
    return removed


def dumps(infos: list[RegionInfo]) -> str:
    return json.dumps([i.to_json() for i in infos], indent=2)


# -- the side area: info maps larger than a slot's info area (docs/shm.md "Frames") --------------
#
# A slot's info area is small by design (256 bytes: the server's info, an env's counters). An
# OBSERVE whose env info map does not fit (a rendered frame: CartPole's 400x600x3 is 720,000
# bytes) is answered through a second segment, /dev/shm/transport-<name>+info, that the server
# creates on the first such OBSERVE and replaces by a larger one (generation + 1) when an OBSERVE
# needs more. The slot then says ``info_len = INFO_SIDE`` and its info area holds a SIDE_REF
# (generation, 0, offset, length) into that segment. Nothing of this runs on a STEP.
#
#   side segment = header (64 bytes: u32 magic "INFO" at 0, u32 version at 4, u32 generation at
#                  8, u32 owner_pid at 32, u64 owner_start_time at 40: the control block's
#                  offsets, so --list-shm / --cleanup-shm judge it like a region) | the maps

SIDE_SUFFIX = "+info"  # "+" is not a region-name character: no region is ever called this
SIDE_MAGIC = 0x4F464E49  # "INFO"
INFO_SIDE = 0xFFFF
"""A slot's ``info_len`` when its info map is in the side segment (SIDE_REF in its info area)."""
SIDE_REF = struct.Struct("<IIQQ")  # generation, reserved 0, offset, length
SIDE_HEADER = 64
SIDE_GENERATION = 8
SIDE_MIN_SIZE = 1 << 16


def side_segment(name: str) -> str:
    """The shm_open name of region ``name``'s side segment: ``/transport-<name>+info``."""
    return "/" + PREFIX + name + SIDE_SUFFIX


class SideWriter:
    """The server's side segment: created on the first info map too large for its slot, grown
    (a new segment, generation + 1) when an OBSERVE needs more, unlinked by ``close()``."""

    def __init__(self, shm: ShmUrl) -> None:
        self.segment = side_segment(shm.name)
        self.path = os.path.join(SHM_DIR, self.segment[1:])
        self.mapping: native.SharedMapping | None = None
        self.inode = 0
        self.generation = 0

    def write(self, maps: dict[int, bytes]) -> dict[int, bytes]:
        """Write each env's packed map; returns each env's SIDE_REF bytes for its slot."""
        spans: dict[int, tuple[int, int]] = {}
        at = SIDE_HEADER
        for index, data in maps.items():
            spans[index] = (at, len(data))
            at += -(-len(data) // 64) * 64
        mapping = self._room(at)
        buffer = mapping.buffer
        refs: dict[int, bytes] = {}
        for index, data in maps.items():
            offset, length = spans[index]
            buffer[offset : offset + length] = data
            refs[index] = SIDE_REF.pack(self.generation, 0, offset, length)
        return refs

    def _room(self, need: int) -> native.SharedMapping:
        mapping = self.mapping
        if mapping is not None and mapping.size >= need:
            return mapping
        size = max(SIDE_MIN_SIZE, 1 << (need - 1).bit_length())  # doubles: few regrowths
        self.close()
        self.generation += 1
        free = _free_bytes()
        if 0 <= free < size:
            raise _refusal(
                f"an env's info map (a rendered frame?) needs {need} bytes, more than a slot's "
                f"info area holds, and /dev/shm has {free} bytes free for {self.path}: enlarge "
                "/dev/shm (docker run --shm-size=1g) or render fewer envs",
            )
        for _ in range(2):
            try:
                fd = native.shm_create(self.segment, size)
                break
            except FileExistsError:  # a dead server's leftover: the region's name is ours
                try:
                    native.shm_unlink(self.segment)
                except FileNotFoundError:
                    pass
            except OSError as exc:
                raise _refusal(
                    f"cannot create {self.path} ({size} bytes): {exc.strerror}"
                ) from None
        else:
            raise _refusal(f"cannot create {self.path}: it keeps existing")
        try:
            self.inode = os.fstat(fd).st_ino
            mapping = native.SharedMapping(fd, size)
        finally:
            os.close(fd)
        header = np.ndarray((SIDE_HEADER // 4,), dtype="<u4", buffer=mapping.buffer)
        header[0], header[1], header[2] = SIDE_MAGIC, LAYOUT_VERSION, self.generation
        header[CB["owner_pid"].offset // 4] = os.getpid()
        struct.pack_into("<Q", mapping.buffer, CB["owner_start_time"].offset, own_start_time())
        del header
        self.mapping = mapping
        return mapping

    def close(self) -> None:
        """Unlink the segment (only this server's inode) and unmap it."""
        if self.mapping is None:
            return
        try:
            if os.stat(self.path).st_ino == self.inode:
                native.shm_unlink(self.segment)
        except FileNotFoundError:
            pass
        self.mapping.close()
        self.mapping = None


class SideReader:
    """The client's view of its server's side segment: mapped on the first SIDE_REF, mapped
    again when the server has replaced it (a SIDE_REF of another generation)."""

    def __init__(self, shm: ShmUrl) -> None:
        self.name = shm.name
        self.segment = side_segment(shm.name)
        self.mapping: native.SharedMapping | None = None
        self.generation = -1

    def read(self, ref: bytes) -> bytes:
        """The packed map a slot's SIDE_REF points at (ProtocolError when it cannot be read)."""
        generation, _, offset, length = SIDE_REF.unpack(ref[: SIDE_REF.size])
        if self.mapping is None or generation != self.generation:
            self._map(generation)
        mapping = self.mapping
        assert mapping is not None
        if offset < SIDE_HEADER or offset + length > mapping.size:
            raise ProtocolError(
                f"shm://{self.name}: an info reference ({offset}, {length}) lies outside "
                f"{SHM_DIR}/{self.segment[1:]} ({mapping.size} bytes)"
            )
        return bytes(mapping.buffer[offset : offset + length])

    def _map(self, generation: int) -> None:
        self.close()
        path = f"{SHM_DIR}/{self.segment[1:]}"
        try:
            fd = native.shm_open(self.segment)
        except OSError as exc:
            raise ProtocolError(
                f"shm://{self.name}: the server answered an info map through {path}, which "
                f"cannot be opened ({exc.strerror})"
            ) from None
        try:
            size = os.fstat(fd).st_size
            if size < SIDE_HEADER:
                raise ProtocolError(f"shm://{self.name}: {path} has no header ({size} bytes)")
            mapping = native.SharedMapping(fd, size)
        finally:
            os.close(fd)
        magic, _, found = struct.unpack_from("<III", mapping.buffer, 0)
        if magic != SIDE_MAGIC or found != generation:
            mapping.close()
            raise ProtocolError(
                f"shm://{self.name}: {path} is not the side area the server referenced "
                f"(magic 0x{magic:08X}, generation {found}, expected {generation})"
            )
        self.mapping, self.generation = mapping, generation

    def close(self) -> None:
        if self.mapping is not None:
            self.mapping.close()
            self.mapping = None
            self.generation = -1


def _refusal(text: str) -> Exception:
    """The OBSERVE's error (status INTERNAL with ``text``): the protocol module imports this one."""
    from transport.protocol import ErrorCode, RequestError

    return RequestError(ErrorCode.INTERNAL, text)


def _free_bytes() -> int:
    try:
        st = os.statvfs(SHM_DIR)
        return st.f_bavail * st.f_frsize
    except OSError:
        return -1
