"""Experience rings: fixed-size records of a schema struct from producers to one consumer.

Layout (``schema/channels.toml``; offsets from the segment's start; docs/channels.md)::

    0     SegmentHeader (64)                   kind RING, fingerprint = the record struct's
    64    RingHeader: capacity, record_size, policy, multi_producer, max_producers,
          consumer lease (pid, start time, state), producers/seqs/records offsets
    128   head    u64   next record index to reserve (producers: CAS, or a store when single)
    192   cursor  u64   consumer tail (low 32 bits) | records it holds << 32  (CAS)
    256   data    u32   futex word the consumer sleeps on (bit 31: it sleeps)
    320   space   u32   futex word producers sleep on
    384   overwritten u64, lost u64
    512   ProducerEntry[max_producers]: pid, state, start time, reservation (intent, count)
    S     seqs u64[capacity]   record k is committed when seqs[k % capacity] == k + 1
    R     records[capacity]    the record struct back to back (NumPy views of these)

Record k lives in slot ``k % capacity``. A producer reserves records (CAS on ``head`` after
checking room against ``tail - held``), writes them in place, and commits by storing each
slot's sequence with release; the consumer claims the committed prefix from its tail (CAS on
``cursor``, which also counts the records it holds), reads them in place and releases them.
OVERWRITE: a producer that finds the ring full drops the oldest committed record the consumer
does not hold (CAS on ``cursor``, counted in ``overwritten``): the consumer never sees a torn
record. The hot path is C (``tp_ring_*`` in transport/native/tp_native.c): a waiter spins for
the wait policy's budget, then sleeps in FUTEX_WAIT slices and checks the peers' liveness
between slices.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import deque
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any, Literal

import numpy as np

from transport import native
from transport.channels import lease
from transport.channels.errors import (
    ChannelClosedError,
    ChannelError,
    ChannelInUseError,
    ChannelMismatchError,
    ChannelTimeoutError,
    PeerDiedError,
)
from transport.channels.segment import Kind, Segment, align
from transport.channels.wait import WaitPolicy, wait_in_slices
from transport.codec import StructCodec
from transport.generated import channels as layout

RING_OFFSET = 64
# Rings default to sleeping at once (no spin): actor-learner runs have more processes than
# cores, where a spinning waiter delays the peer it waits for (benchmarks/RESULTS.md, Channels).
DEFAULT_WAIT = "futex"
PRODUCERS_OFFSET = 512
ENTRY_SIZE: int = layout.ProducerEntry.size  # 64
_RING = {f.name: RING_OFFSET + f.offset for f in layout.RingHeader.ir.fields}
_ENTRY = {f.name: f.offset for f in layout.ProducerEntry.ir.fields}
Policy = layout.RingPolicy
PeerState = layout.PeerState


def record_fingerprint(record: StructCodec) -> int:
    """The u64 a ring stores for its record type: sha256 of the schema fingerprint and the
    struct name (the Node side computes the same)."""
    text = f"{record.schema.fingerprint:016x}:{record.name}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little")


def ring_size(capacity: int, record_size: int, max_producers: int) -> tuple[int, int, int]:
    """(seqs offset, records offset, segment size) of a ring."""
    seqs = align(PRODUCERS_OFFSET + ENTRY_SIZE * max_producers)
    records = align(seqs + 8 * capacity)
    return seqs, records, align(records + capacity * record_size, 4096)


class Ring:
    """A mapped ring: the segment, its geometry and its record array. Create or open one, then
    take a role: ``producer()`` (any number, or one for a single-producer ring) or ``consumer()``
    (one at a time: a lease)."""

    def __init__(self, segment: Segment, record: StructCodec, wait: WaitPolicy) -> None:
        self.segment = segment
        self.record = record
        self.wait = wait
        hdr = layout.RingHeader.view(segment.map, RING_OFFSET)
        self.capacity = int(hdr["capacity"])
        self.record_size = int(hdr["record_size"])
        self.policy = Policy(int(hdr["policy"]))
        self.multi_producer = bool(hdr["multi_producer"])
        self.max_producers = int(hdr["max_producers"])
        seqs_offset = int(hdr["seqs_offset"])
        records_offset = int(hdr["records_offset"])
        if self.record_size != record.size:
            raise ChannelMismatchError(
                f"{segment.path}: record_size is {self.record_size}, "
                f"expected {record.size} ({record.name})"
            )
        end = records_offset + self.capacity * self.record_size
        if self.capacity & (self.capacity - 1) or end > segment.size:
            raise ChannelMismatchError(f"{segment.path}: bad geometry (capacity {self.capacity})")
        self.seqs = segment.array("<u8", seqs_offset, (self.capacity,))
        self.records = np.ndarray(
            (self.capacity,), dtype=record.dtype, buffer=segment.map, offset=records_offset
        )
        self._hdr = hdr
        self._seqs_ptr = segment.word64(seqs_offset)

    @property
    def name(self) -> str:
        return self.segment.name

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        name: str,
        record: StructCodec,
        capacity: int,
        *,
        policy: Literal["block", "overwrite"] = "block",
        multi_producer: bool = False,
        max_producers: int = 16,
        wait: WaitPolicy | str | None = None,
    ) -> Ring:
        """Create ``/dev/shm/transport-ring-<name>``: ``capacity`` (a power of two) records of
        ``record`` (a struct codec of a generated schema module)."""
        if capacity < 2 or capacity & (capacity - 1) or capacity >= 2**31:
            raise ValueError(f"capacity must be a power of two in [2, 2**31), got {capacity}")
        if policy not in ("block", "overwrite"):
            raise ValueError(f"policy must be 'block' or 'overwrite', got {policy!r}")
        producers = max_producers if multi_producer else 1
        if not 1 <= producers <= 4096:
            raise ValueError("max_producers must be in [1, 4096]")
        seqs_offset, records_offset, size = ring_size(capacity, record.size, producers)

        def init(seg: Segment) -> None:
            hdr = layout.RingHeader.view(seg.map, RING_OFFSET)
            hdr["capacity"] = capacity
            hdr["record_size"] = record.size
            hdr["policy"] = int(Policy.OVERWRITE if policy == "overwrite" else Policy.BLOCK)
            hdr["multi_producer"] = int(multi_producer)
            hdr["max_producers"] = producers
            hdr["producers_offset"] = PRODUCERS_OFFSET
            hdr["seqs_offset"] = seqs_offset
            hdr["records_offset"] = records_offset

        seg = Segment.create(
            Kind.RING, name, size, fingerprint=record_fingerprint(record), init=init
        )
        return cls(seg, record, WaitPolicy.resolve(wait or DEFAULT_WAIT))

    @classmethod
    def open(
        cls,
        name: str,
        record: StructCodec,
        *,
        timeout: float = 10.0,
        wait: WaitPolicy | str | None = None,
    ) -> Ring:
        """Open an existing ring; its record type must be ``record`` (fingerprint checked)."""
        seg = Segment.open(Kind.RING, name, fingerprint=record_fingerprint(record), timeout=timeout)
        try:
            return cls(seg, record, WaitPolicy.resolve(wait or DEFAULT_WAIT))
        except BaseException:
            seg.close()
            raise

    def producer(self) -> Producer:
        self.segment.require_open("producer")
        return Producer(self)

    def consumer(self) -> Consumer:
        self.segment.require_open("consumer")
        return Consumer(self)

    # -- state ----------------------------------------------------------------------------------

    def _load(self, field: str) -> int:
        self.segment.require_open(field)
        return native.load64_acquire(self.segment.word64(_RING[field]))

    @property
    def head(self) -> int:
        """Records reserved so far (the next record's index)."""
        return self._load("head")

    @property
    def tail(self) -> int:
        """Index of the oldest record the consumer has not claimed (or that was dropped)."""
        head = self.head
        cursor = self._load("cursor")
        return head - ((head - cursor) & 0xFFFFFFFF)

    @property
    def overwritten(self) -> int:
        """Records dropped by OVERWRITE producers (the consumer never saw them)."""
        return self._load("overwritten")

    @property
    def lost(self) -> int:
        """Records reserved but never committed, skipped: by producers that died, or given
        back (``Producer.abort``) after another producer had reserved past them."""
        return self._load("lost")

    def stats(self) -> dict[str, int]:
        head, tail = self.head, self.tail
        return {
            "head": head,
            "tail": tail,
            "pending": head - tail,
            "held": self._load("cursor") >> 32,
            "overwritten": self.overwritten,
            "lost": self.lost,
        }

    def producer_states(self) -> list[tuple[int, str, int]]:
        """(pid, state name, records committed) of every producer entry used so far."""
        self.segment.require_open("producer_states")
        out = []
        entries = layout.ProducerEntry.view(
            self.segment.map, PRODUCERS_OFFSET, count=self.max_producers
        )
        for e in entries:
            if int(e["pid"]) or int(e["state"]):
                pid = lease.holder(int(e["pid"]))
                out.append((pid, PeerState(int(e["state"])).name, int(e["committed"])))
        return out

    def _native(self) -> Any:
        """A ``tp_ring`` over this mapping (each role owns one: statistics and producer slot)."""
        seg = self.segment
        r = native.new_ring()
        r.state = seg.state_word
        r.head = seg.word64(_RING["head"])
        r.cursor = seg.word64(_RING["cursor"])
        r.data_word = seg.word(_RING["data_word"])
        r.space_word = seg.word(_RING["space_word"])
        r.overwritten = seg.word64(_RING["overwritten"])
        r.lost = seg.word64(_RING["lost"])
        r.seqs = self._seqs_ptr
        r.producers = native.address(seg.map, PRODUCERS_OFFSET)
        r.consumer_pid = seg.word(_RING["consumer_pid"])
        r.consumer_start = seg.word64(_RING["consumer_start_time"])
        r.consumer_state = seg.word(_RING["consumer_state"])
        r.capacity = self.capacity
        r.policy = int(self.policy)
        r.multi = int(self.multi_producer)
        r.max_producers = self.max_producers
        self.wait.apply(r)
        return r

    def close(self) -> None:
        """Unmap; the creator also marks the ring CLOSED (waking every waiter) and unlinks it.
        Batches and reservations kept by the caller keep their values (docs/channels.md); every
        method of the ring, its producers and its consumer then raises ChannelClosedError."""
        if self.segment.closed:
            return
        if self.segment.owner:
            self.segment.mark_closed()
            for field in ("data_word", "space_word"):
                native.publish(self.segment.word(_RING[field]), 0)
                native.futex_wake(self.segment.word(_RING[field]))
        self.records = np.zeros(0, dtype=self.record.dtype)
        self.seqs = np.zeros(0, dtype="<u8")
        self._seqs_ptr = None
        self._hdr = layout.RingHeader.zeros()  # this object's own views go first
        self.segment.close()

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _describe(value: Any) -> str:
    """A short description of an array's (or a dtype's) type for an error message."""
    if isinstance(value, np.ndarray):
        return f"a {value.ndim}-D array of {_describe(value.dtype)}"
    if isinstance(value, np.dtype):
        if value.names:
            names = ", ".join(value.names[:4]) + (", ..." if len(value.names) > 4 else "")
            return f"a {value.itemsize}-byte struct ({names})"
        return str(value)
    return type(value).__name__


def _raise_for(rc: int, ring: Ring, what: str, peer: str, timeout: float | None) -> None:
    if rc == native.TIMEOUT:
        raise ChannelTimeoutError(f"{ring.segment.path}: {what} timed out after {timeout} s")
    if rc == native.PEER_DEAD:
        raise PeerDiedError(f"{ring.segment.path}: {what}: the {peer} died")
    if rc == native.CLOSED:
        raise ChannelClosedError(f"{ring.segment.path}: {what}: the {peer} closed the ring")
    raise ChannelError(f"{ring.segment.path}: {what} failed ({rc})")


class Producer:
    """One producer of a ring: reserve records, write them in place, commit."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self.index = self._attach()
        self._native = ring._native()
        self._native.me = self.index
        self._got = native.ffi.new("uint32_t *")
        self._first = -1
        self._count = 0
        self.closed = False

    def _attach(self) -> int:
        """Take a free producer entry, else one of a producer that is gone (a dead one only
        when it left no reservation behind): the consumer keeps seeing deaths while it can."""
        ring = self.ring
        for reclaim in (False, True):
            for index in range(ring.max_producers):
                base = PRODUCERS_OFFSET + index * ENTRY_SIZE
                pid_word = ring.segment.word(base + _ENTRY["pid"])
                state_word = ring.segment.word(base + _ENTRY["state"])
                entry = layout.ProducerEntry.view(ring.segment.map, base)
                pid, state = native.load_acquire(pid_word), native.load_acquire(state_word)
                if pid & lease.CLAIMING:  # being taken: its state is still the last holder's
                    gone = not lease.holder_alive(pid, 0)
                else:
                    gone = state != PeerState.ACTIVE or not lease.holder_alive(
                        pid, int(entry["start_time"])
                    )
                free = pid == 0 or (reclaim and gone and int(entry["intent"]) == 0)

                def fill(start: int, entry: Any = entry, state_word: Any = state_word) -> None:
                    entry["start_time"] = start
                    entry["intent_count"] = 0
                    entry["committed"] = 0
                    native.store_release(state_word, int(PeerState.ACTIVE))

                if free and lease.take(pid_word, pid, fill):
                    return index
        if ring.multi_producer:
            raise ChannelInUseError(
                f"{ring.segment.path}: all {ring.max_producers} producer entries are in use"
            )
        raise ChannelInUseError(
            f"{ring.segment.path} is a single-producer ring and its producer "
            f"(pid {native.load_acquire(ring.segment.word(PRODUCERS_OFFSET))}) is alive"
        )

    def reserve(self, timeout: float | None = None) -> np.void:
        """One record to write in place (a view into the ring); then :meth:`commit`."""
        return self.reserve_many(1, timeout)[0]  # type: ignore[no-any-return]

    def reserve_many(self, n: int, timeout: float | None = None) -> np.ndarray:
        """Up to ``n`` contiguous records (at least one; fewer at the wrap or when the ring
        has less room) as a writable view; fill them, then :meth:`commit` (or :meth:`abort`).
        ``n`` must be at least 1 (ValueError). BLOCK: waits for room up to ``timeout`` (None:
        forever), then ChannelTimeoutError."""
        self._require_open("reserve")
        if n < 1:
            raise ValueError(f"reserve_many: n must be at least 1, got {n}")
        if self._count:
            raise ChannelError("commit the previous reservation first (or abort it)")
        cap = self.ring.capacity
        want = n if n < cap else cap  # the C side takes a u32; never more than the ring holds
        first = wait_in_slices(
            lambda t: native.ring_reserve(self._native, want, self._got, t), timeout
        )
        if first < 0:
            _raise_for(first, self.ring, "reserve", "consumer", timeout)
        count = int(self._got[0])
        self._first, self._count = first, count
        slot = first & (cap - 1)
        return self.ring.records[slot : slot + count]

    def commit(self) -> int:
        """Publish the reserved records; returns the index of the first one."""
        self._require_open("commit")
        if not self._count:
            raise ChannelError("nothing reserved")
        native.lib.tp_ring_commit(self._native, self._first, self._count)
        first, self._count = self._first, 0
        return first

    def abort(self, timeout: float | None = None) -> None:
        """Give the current reservation back without publishing it (nothing reserved: does
        nothing). The consumer never sees the records. When no producer reserved after it
        (always on a single-producer ring) the reservation is undone (``head`` moves back);
        otherwise the records cannot be un-reserved, so this waits up to ``timeout`` (None:
        forever) for the consumer to reach them and skips them, counted in ``Ring.lost`` as a
        dead producer's are. ChannelTimeoutError if that wait ran out: the reservation is
        still this producer's (call ``abort`` again; ``close`` gives it up)."""
        self._require_open("abort")
        if not self._count:
            return
        if not self._give_back(timeout):
            raise ChannelTimeoutError(
                f"{self.ring.segment.path}: abort: the consumer did not reach records "
                f"{self._first}..{self._first + self._count - 1} within {timeout} s"
            )

    def _give_back(self, timeout: float | None) -> bool:
        """Undo or skip the current reservation (see :meth:`abort`); False if the consumer
        did not reach it within ``timeout`` (the reservation is kept)."""
        ring = self.ring
        seg = ring.segment
        first, count = self._first, self._count
        head = seg.word64(_RING["head"])
        cursor = seg.word64(_RING["cursor"])
        intent = seg.word64(PRODUCERS_OFFSET + self.index * ENTRY_SIZE + _ENTRY["intent"])
        # Undo: only this producer's CAS (or store) moved head past first + count, so while
        # head is still there nobody reserved after it; another producer that read the old
        # head fails its CAS and reads again. The consumer never claims uncommitted records.
        if native.compare_exchange64(head, first + count, first):
            native.store64_release(intent, 0)
            self._count = 0
            native.wake_if_sleeping(seg.word(_RING["space_word"]))
            return True
        # Skip: once the consumer's tail reaches `first` (every older record taken) only this
        # producer may move it past its own uncommitted records, as the consumer does for a
        # dead producer's (tp_ring_take: ring_check_producers).
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if seg.closed or native.load_acquire(seg.state_word) != 1:
                self._count = 0  # the ring is gone: nothing left to give back
                return True
            c = native.load64_acquire(cursor)
            h = native.load64_acquire(head)
            tail = h - ((h - c) & 0xFFFFFFFF)
            end = first + count
            skipped = tail >= end  # (the consumer only skips a dead producer's records)
            if not skipped and tail >= first:
                skipped = native.compare_exchange64(
                    cursor, c, ((c >> 32) << 32) | (end & 0xFFFFFFFF)
                )
                if skipped:
                    native.fetch_add64(seg.word64(_RING["lost"]), end - tail)
            if skipped:
                native.store64_release(intent, 0)
                self._count = 0
                native.wake_if_sleeping(seg.word(_RING["data_word"]))
                native.wake_if_sleeping(seg.word(_RING["space_word"]))
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.0005)

    def push(self, records: np.ndarray, timeout: float | None = None) -> int:
        """Copy a 1-D NumPy array of records of exactly the ring's record dtype in (anything
        else raises ChannelMismatchError before a record is reserved), in as few reservations
        as possible; returns the index of the first (-1 for no records). ``timeout`` bounds
        each wait for room. An error while copying gives the reservation back
        (:meth:`abort`) before it propagates."""
        dtype = self.ring.records.dtype
        if not (
            isinstance(records, np.ndarray)
            and (records.dtype is dtype or records.dtype == dtype)
            and records.ndim == 1
        ):
            raise ChannelMismatchError(
                f"{self.ring.segment.path}: push takes a 1-D NumPy array of "
                f"{self.ring.record.name} records ({_describe(dtype)}), got {_describe(records)}"
            )
        first = -1
        done = 0
        total = len(records)
        while done < total:
            view = self.reserve_many(total - done, timeout)
            try:
                view[...] = records[done : done + len(view)]
            except BaseException:
                with suppress(Exception):  # the copy's error is the one to report
                    self._give_back(timeout)
                raise
            index = self.commit()
            first = index if first < 0 else first
            done += len(view)
        return first

    def _require_open(self, what: str) -> None:
        """ChannelClosedError once this producer or its ring was closed by this process."""
        if self.closed:
            raise ChannelClosedError(f"{self.ring.segment.path}: {what}: this producer was closed")
        self.ring.segment.require_open(what)

    @property
    def committed(self) -> int:
        self._require_open("committed")
        entry = layout.ProducerEntry.view(
            self.ring.segment.map, PRODUCERS_OFFSET + self.index * ENTRY_SIZE
        )
        return int(entry["committed"])

    def close(self) -> None:
        """Mark this producer CLOSED (the consumer sees the end once every producer closed) and
        unmap if this object opened the ring."""
        if self.closed:
            return
        self.closed = True
        if not (self.ring.segment.closed or self.ring.segment.forked):  # a fork's copy: not ours
            # A reservation left open is given back; one that cannot be at once (others
            # reserved after it) is left as a dead producer's: the consumer skips it (lost).
            state = PeerState.CLOSED
            if self._count and not self._give_back(0.0):
                state = PeerState.DEAD
            base = PRODUCERS_OFFSET + self.index * ENTRY_SIZE
            native.store_release(self.ring.segment.word(base + _ENTRY["state"]), int(state))
            native.wake_if_sleeping(self.ring.segment.word(_RING["data_word"]))

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Batch:
    """Records claimed by the consumer: ``views`` are one contiguous array, or two where the
    ring wraps, into the ring itself (no copy). Valid until :meth:`release`."""

    consumer: Consumer
    first: int
    count: int
    views: list[np.ndarray]
    released: bool = False

    @property
    def indices(self) -> np.ndarray:
        """The records' ring-wide sequence numbers (consecutive)."""
        return np.arange(self.first, self.first + self.count, dtype=np.uint64)

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter(self.views)

    def __len__(self) -> int:
        return self.count

    def copy(self) -> np.ndarray:
        """The records as one owned array."""
        return np.concatenate(self.views) if len(self.views) > 1 else self.views[0].copy()

    def field(self, name: str) -> np.ndarray:
        """One field of every record: a view when contiguous, else a concatenated copy."""
        if len(self.views) == 1:
            return self.views[0][name]
        return np.concatenate([v[name] for v in self.views])

    def release(self) -> None:
        """Give the records back (batches may be released in any order: the ring frees them
        oldest first, once every older batch was released too)."""
        if not self.released:
            self.released = True
            self.consumer._settle()

    def __enter__(self) -> Batch:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class Consumer:
    """The consumer of a ring (a lease: one at a time)."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self._attach()
        self._native = ring._native()
        self._got = native.ffi.new("uint32_t *")
        self.next_index = ring.tail  # the first record index this consumer expects
        self._outstanding: deque[Batch] = deque()
        self.closed = False

    def _attach(self) -> None:
        ring = self.ring
        seg = ring.segment
        pid_word = seg.word(_RING["consumer_pid"])
        pid = native.load_acquire(pid_word)
        hdr = ring._hdr
        if lease.holder_alive(pid, int(hdr["consumer_start_time"])):
            raise ChannelInUseError(
                f"{seg.path}: the consumer lease is held by live pid {lease.holder(pid)}"
            )
        start_word = seg.word64(_RING["consumer_start_time"])
        if not lease.take(pid_word, pid, partial(native.store64_release, start_word)):
            raise ChannelInUseError(f"{seg.path}: another consumer attached meanwhile")
        if pid != 0:  # a dead consumer's held records are free again
            cursor = seg.word64(_RING["cursor"])
            while True:
                c = native.load64_acquire(cursor)
                if native.compare_exchange64(cursor, c, c & 0xFFFFFFFF):
                    break
        native.store_release(seg.word(_RING["consumer_state"]), int(PeerState.ACTIVE))

    def take(self, max_records: int = 256, timeout: float | None = None) -> Batch:
        """Claim up to ``max_records`` committed records (waiting up to ``timeout`` for the
        first: None forever, 0 not at all). ChannelTimeoutError when none came; ChannelClosedError
        when every producer closed and the ring is drained; PeerDiedError when every producer
        is gone and one died. ``max_records`` 0 returns an empty batch at once (no wait, nothing
        claimed); a negative one raises ValueError."""
        self._require_open("take")
        ring = self.ring
        cap = ring.capacity
        if max_records < 1:
            if max_records < 0:
                raise ValueError(f"take: max_records must be at least 0, got {max_records}")
            return Batch(self, self.next_index, 0, [ring.records[0:0]])  # up to 0: none
        want = max_records if max_records < cap else cap  # a u32 for C; at most the ring
        first = wait_in_slices(
            lambda t: native.ring_take(self._native, want, self._got, t), timeout
        )
        if first < 0:
            _raise_for(first, ring, "take", "producers", timeout)
        count = int(self._got[0])
        slot = first & (cap - 1)
        views = [ring.records[slot : slot + count]]
        if slot + count == cap and count < want:  # the ring wraps: a second view
            more = native.ring_take(self._native, want - count, self._got, 0)
            if more >= 0:
                extra = int(self._got[0])
                views.append(ring.records[0:extra])
                count += extra
        self.next_index = first + count
        batch = Batch(self, first, count, views)
        self._outstanding.append(batch)
        return batch

    def _settle(self) -> None:
        """Release the oldest outstanding batches that were released (the ring's held count is
        a FIFO: a younger batch's release must not free an older batch's records). Nothing
        is left to give back once the consumer or its ring was closed."""
        if self.closed or self.ring.segment.closed:
            self._outstanding.clear()
            return
        count = 0
        while self._outstanding and self._outstanding[0].released:
            count += self._outstanding.popleft().count
        if count:
            self._release(count)

    def _require_open(self, what: str) -> None:
        """ChannelClosedError once this consumer or its ring was closed by this process."""
        if self.closed:
            raise ChannelClosedError(f"{self.ring.segment.path}: {what}: this consumer was closed")
        self.ring.segment.require_open(what)

    def _release(self, count: int) -> None:
        native.lib.tp_ring_release(self._native, count)

    def __iter__(self) -> Iterator[Batch]:
        """Batches until every producer closed (or died) and the ring is drained."""
        while True:
            try:
                batch = self.take(timeout=None)
            except (ChannelClosedError, PeerDiedError):
                return
            yield batch

    def close(self) -> None:
        """Give up the lease (held records are released)."""
        if self.closed:
            return
        self.closed = True
        seg = self.ring.segment
        if seg.closed or seg.forked:  # a fork's copy: the parent's lease
            return
        held = native.load64_acquire(seg.word64(_RING["cursor"])) >> 32
        self._outstanding.clear()
        if held:
            self._release(int(held))
        native.store_release(seg.word(_RING["consumer_state"]), int(PeerState.CLOSED))
        native.compare_exchange(seg.word(_RING["consumer_pid"]), os.getpid(), 0)
        native.wake_if_sleeping(seg.word(_RING["space_word"]))

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
