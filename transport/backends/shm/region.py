"""The shared-memory region of ``shm://`` (seed 000 Appendix B): layout, lifecycle, wait policy,
and the record views of the slots that clients and servers read and write.

Layout (``schema/pac_shm.toml``; the diagram and the protocol are in ``docs/shm.md``)::

    offset 0            64              64 + 5120        64 + N * 5120      + i * 2576
    +-------------------+---------------+----------------+----+-----------+-------------+----
    | ControlBlock (64) | Slot env 0    | Slot env 1     | ...| Final 0   | Final 1     | ...
    +-------------------+---------------+----------------+----+-----------+-------------+----
    one 5120-byte Slot per env, then one 2576-byte Final area per env (SAME_STEP auto-reset)

    ControlBlock: 0 magic u32 "PACT" | 4 version u32 | 8 num_envs u32 | 12 obs_size u32
      16 act_size u32 | 20 slot_size u32 | 24 fingerprint u64 | 32 owner_pid u32
      36 state u32 (CREATING 0, READY 1, CLOSED 2; written last) | 40 owner_start_time u64
      48 client_start_time u64 | 56 doorbell u32 (futex) | 60 client_pid u32 (lease, CAS)
    Slot: 0 sem_action_ready u32 (request seq, futex) | 4 sem_result_ready u32 (response seq,
      futex) | 8 command u32 | 12 action i32 | 16 .. 2573 the StepResult fields | 2573 has_seed
      u8 | 2574 status u16 | 2576 seed u64 | 2584 error_len u16 | 2586 info_len u16
      2592 error_text u8[1024] | 3616 info u8[256] (slot 0) | padding to 5120
    Final: 0 final_seq u32 (the request sequence of the step that ended the episode) |
      4..15 zero | 16 .. 2573 the final StepResult, at the same offsets as in a Slot | 2 zero

A segment lives at ``/dev/shm/transport-<name>`` (mode 0600), is created with O_EXCL and fully
reserved with ``posix_fallocate`` (a full /dev/shm is an error at creation, never a SIGBUS), and
is unlinked by its owner on a clean shutdown. A segment whose owner is dead (pid gone, a zombie,
or a different start time) is stale: replaced on creation, listed and removed by
``transport-serve --list-shm`` / ``--cleanup-shm``. A live one is never replaced.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import numpy as np

from transport import native
from transport.codec import Schema
from transport.errors import ConnectError, ProtocolError
from transport.generated import pac_shm
from transport.schema.ir import FieldIR

MAGIC = 0x50414354  # "PACT"
LAYOUT_VERSION: int = int(pac_shm.IR["version"])
LAYOUT_FINGERPRINT: int = pac_shm.FINGERPRINT
CONTROL_SIZE: int = pac_shm.ControlBlock.size  # 64
SLOT_SIZE: int = pac_shm.Slot.size  # 5120
PREFIX = "transport-"
SHM_DIR = "/dev/shm"
RESULT_OFFSET = (
    16  # the StepResult fields of a slot: bytes 16 .. 2573 (reward .. actions_this_turn)
)
FINAL_SIZE: int = pac_shm.FinalArea.size  # 2576: u32 final_seq, 12 zero bytes, the StepResult
FINAL_SEQ_OFFSET: int = pac_shm.FinalArea.ir.field("final_seq").offset  # 0
STALE_CREATING_AFTER = 10.0  # seconds a header-less segment may take to be initialised


RegionState = pac_shm.RegionState  # CREATING 0, READY 1, CLOSED 2
SlotCommand = pac_shm.SlotCommand  # STEP 0, RESET 1, SHUTDOWN 2, HELLO 3 (mode in `action`)


def _offsets(fields: Sequence[FieldIR]) -> dict[str, FieldIR]:
    return {f.name: f for f in fields}


CB = _offsets(pac_shm.ControlBlock.ir.fields)
SLOT = _offsets(pac_shm.Slot.ir.fields)
ERROR_TEXT_MAX = SLOT["error_text"].count
INFO_MAX = SLOT["info"].count


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

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")


@dataclass(frozen=True)
class ShmUrl:
    name: str
    num_envs: int | None
    wait: WaitPolicy

    @property
    def segment(self) -> str:
        """The shm_open name: ``/transport-<name>``."""
        return "/" + PREFIX + self.name

    @property
    def path(self) -> str:
        return os.path.join(SHM_DIR, PREFIX + self.name)


def parse_url(url: str) -> ShmUrl:
    """``shm://name?num_envs=N&wait=balanced|spin|futex&spin=K&slice_ms=M``."""
    scheme, sep, rest = url.partition("://")
    if scheme.lower() != "shm" or not sep:
        raise ConnectError(f"{url!r} is not an shm:// URL")
    name, _, query = rest.partition("?")
    name = name.strip("/")
    if not _NAME.match(name):
        raise ConnectError(
            f"{url!r}: the region name must be 1-201 characters of A-Z a-z 0-9 . _ - "
            "(it becomes /dev/shm/transport-<name>)"
        )
    params = dict(parse_qsl(query, keep_blank_values=True))
    unknown = set(params) - {"num_envs", "wait", "spin", "slice_ms"}
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
    return ShmUrl(name, num_envs, policy)


def slots_size(num_envs: int) -> int:
    """Bytes of the control block and the N slots (Appendix B; a region without final areas)."""
    return CONTROL_SIZE + num_envs * SLOT_SIZE


def finals_offset(num_envs: int) -> int:
    """Where env 0's final-result area starts: right after the last slot."""
    return slots_size(num_envs)


def region_size(num_envs: int) -> int:
    """The segment size: control block, N slots, N final-result areas."""
    return slots_size(num_envs) + num_envs * FINAL_SIZE


def own_start_time() -> int:
    return native.proc_start_time(os.getpid())


# -- the mapped region ---------------------------------------------------------------------------


class Region:
    """A mapped segment: the control block's words and the slots, as pointers and NumPy views."""

    def __init__(
        self, segment: str, fd: int, size: int, *, owner: bool, num_envs: int | None = None
    ) -> None:
        self.segment = segment
        self.owner = owner
        self.size = size
        self.inode = os.fstat(fd).st_ino
        self.map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.control = pac_shm.ControlBlock.view(self.map)  # 0-d record
        self.words = np.ndarray((CONTROL_SIZE // 4,), dtype="<u4", buffer=self.map)
        self.base = native.address(self.map)
        self.state_word = native.word(self.map, CB["state"].offset)
        self.doorbell = native.word(self.map, CB["doorbell"].offset)
        self.client_pid_word = native.word(self.map, CB["client_pid"].offset)
        if num_envs is None:  # an attaching client: the header says (validated against the size)
            num_envs = int(self.control["num_envs"])
            if slots_size(num_envs) > size:
                num_envs = (size - CONTROL_SIZE) // SLOT_SIZE
        self.num_envs = num_envs
        self.has_finals = size >= region_size(num_envs)
        self.slots = pac_shm.Slot.view(self.map, CONTROL_SIZE, count=self.num_envs)

    # control block fields
    def get(self, field: str) -> int:
        return int(self.control[field])

    def set(self, field: str, value: int) -> None:
        self.control[field] = value

    @property
    def state(self) -> int:
        return native.load_acquire(self.state_word)

    def slot_word(self, index: int, field: str) -> Any:
        return native.word(self.map, CONTROL_SIZE + index * SLOT_SIZE + SLOT[field].offset)

    def strided(self, field: str, dtype: Any | None = None) -> np.ndarray:
        """An (N, ...) view of one slot field across every slot (row stride = SLOT_SIZE)."""
        f = SLOT[field]
        elem = np.dtype(dtype) if dtype is not None else self.slots.dtype[field].base
        shape: tuple[int, ...] = (self.num_envs,) if f.count == 1 else (self.num_envs, f.count)
        strides: tuple[int, ...] = (SLOT_SIZE,) if f.count == 1 else (SLOT_SIZE, elem.itemsize)
        return np.ndarray(
            shape, dtype=elem, buffer=self.map, offset=CONTROL_SIZE + f.offset, strides=strides
        )

    def close(self) -> None:
        """Unmap; if NumPy views are still alive the mapping stays until they die (never a
        dangling pointer)."""
        self.control = np.zeros(())
        self.words = np.zeros(0, dtype="<u4")
        self.slots = np.zeros(0)
        try:
            self.map.close()
        except BufferError:
            pass  # views handed to the user keep the mapping alive; the name is gone anyway


def write_text(buf: np.ndarray, text: str) -> int:
    """UTF-8 ``text`` into a u8 array, cut at a character boundary; returns the byte count."""
    data = text.encode("utf-8")[: buf.shape[-1]]
    data = data.decode("utf-8", "ignore").encode("utf-8")
    buf[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    return len(data)


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


def result_views(region: Region, dtype: np.dtype[Any]) -> np.ndarray:
    """(N,) result records, one per slot (row stride SLOT_SIZE), into the mapping."""
    base = CONTROL_SIZE + RESULT_OFFSET
    return np.ndarray(
        (region.num_envs,), dtype=dtype, buffer=region.map, offset=base, strides=(SLOT_SIZE,)
    )


def final_views(region: Region, dtype: np.dtype[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(N,) final_seq words and (N,) final-result records (the final areas), into the mapping."""
    n = region.num_envs
    base = finals_offset(n)
    seqs = np.ndarray(
        (n,), dtype="<u4", buffer=region.map, offset=base + FINAL_SEQ_OFFSET, strides=(FINAL_SIZE,)
    )
    records = np.ndarray(
        (n,), dtype=dtype, buffer=region.map, offset=base + RESULT_OFFSET, strides=(FINAL_SIZE,)
    )
    return seqs, records


def wait_ctx(region: Region, policy: WaitPolicy, seqs: np.ndarray) -> Any:
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


# -- inspection, stale detection, cleanup ------------------------------------------------------


@dataclass(frozen=True)
class RegionInfo:
    """What ``--list-shm`` shows about one segment of the project."""

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

    @property
    def stale(self) -> bool:
        """Replaceable: a finished header whose owner is dead, or a header-less leftover."""
        if self.owner_pid:
            return not self.owner_alive
        return self.age_s > STALE_CREATING_AFTER

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["stale"] = self.stale
        return data


def inspect_segment(path: str) -> RegionInfo:
    """Read a segment's control block without mapping it writable."""
    st = os.stat(path)
    header = b""
    try:
        with open(path, "rb") as fh:
            header = fh.read(CONTROL_SIZE)
    except OSError:
        pass
    name = os.path.basename(path)[len(PREFIX) :]
    age = max(0.0, time.time() - st.st_mtime)
    if len(header) < CONTROL_SIZE:
        return RegionInfo(name, path, st.st_size, False, 0, 0, "EMPTY", 0, False, 0, age)
    cb = pac_shm.ControlBlock.view(header)
    magic_ok = int(cb["magic"]) == MAGIC
    pid = int(cb["owner_pid"]) if magic_ok else 0
    start = int(cb["owner_start_time"]) if magic_ok else 0
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
        num_envs=int(cb["num_envs"]),
        state=state if magic_ok else "FOREIGN",
        owner_pid=pid,
        owner_alive=native.peer_alive(pid, start) if pid else False,
        client_pid=int(cb["client_pid"]) if magic_ok else 0,
        age_s=age,
    )


def list_segments() -> list[RegionInfo]:
    """Every ``/dev/shm/transport-*`` segment, inspected."""
    out: list[RegionInfo] = []
    try:
        names = sorted(os.listdir(SHM_DIR))
    except FileNotFoundError:
        return out
    for entry in names:
        if entry.startswith(PREFIX):
            try:
                out.append(inspect_segment(os.path.join(SHM_DIR, entry)))
            except FileNotFoundError:
                continue
    return out


def cleanup_stale() -> list[RegionInfo]:
    """Unlink every stale segment of the project; returns the ones removed."""
    removed = []
    for info in list_segments():
        if info.stale:
            try:
                native.shm_unlink("/" + PREFIX + info.name)
                removed.append(info)
            except FileNotFoundError:
                pass
    return removed


def dumps(infos: list[RegionInfo]) -> str:
    return json.dumps([i.to_json() for i in infos], indent=2)
