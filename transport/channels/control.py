"""Run control: the global epoch, one stop flag, per-process heartbeats and error flags.

Layout (``schema/channels.toml``; offsets from the segment's start)::

    0     SegmentHeader (64)                    kind CONTROL
    64    ControlHeader: epoch u64 (fetch-add) | stop u32 (futex: 0 run, 1 stop) | slots u32
          | stuck_after_ms u32 | stop_reason u32
    128   ProcEntry[slots], 64 bytes each: pid (CAS 0 -> pid), state (ACTIVE, CLOSED, ERROR),
          start time, heartbeat_ns (CLOCK_MONOTONIC), beats, error_code, role, name

A process joins (takes an entry), beats now and then, and flags an error or leaves. Anyone sees
every member's status: a dead one (its pid gone or reused), a stuck one (no beat for
``stuck_after``), an errored one. ``stop()`` sets the flag and wakes every ``wait_stop``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from transport import native
from transport.channels import lease
from transport.channels.errors import ChannelInUseError
from transport.channels.segment import Kind, Segment
from transport.channels.wait import WaitPolicy, wait_in_slices
from transport.generated import channels as layout

CONTROL_OFFSET = 64
ENTRIES_OFFSET = 128
ENTRY_SIZE: int = layout.ProcEntry.size
_CTL = {f.name: CONTROL_OFFSET + f.offset for f in layout.ControlHeader.ir.fields}
_ENTRY = {f.name: f.offset for f in layout.ProcEntry.ir.fields}
PeerState = layout.PeerState
NAME_MAX: int = layout.ProcEntry.ir.field("name").count


@dataclass(frozen=True)
class MemberStatus:
    """One member of the run as another process sees it."""

    slot: int
    pid: int
    name: str
    role: int
    state: str  # ACTIVE, CLOSED (left cleanly), ERROR (flagged), DEAD (its process is gone)
    heartbeat_age_s: float
    beats: int
    error_code: int
    stuck: bool  # ACTIVE, alive, and no beat for longer than stuck_after

    @property
    def healthy(self) -> bool:
        return self.state in ("ACTIVE", "CLOSED") and not self.stuck


class RunControl:
    """The run's shared control block. Create it once (the learner), open it anywhere."""

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        self.header = layout.ControlHeader.view(segment.map, CONTROL_OFFSET)
        self.slots = int(self.header["slots"])
        self.stuck_after = int(self.header["stuck_after_ms"]) / 1000.0
        self.entries = layout.ProcEntry.view(segment.map, ENTRIES_OFFSET, count=self.slots)
        self._epoch = segment.word64(_CTL["epoch"])
        self._stop = segment.word(_CTL["stop"])
        self._ctx = native.new_ctx()
        WaitPolicy(spin=0, futex_slice_ms=50.0).apply(self._ctx)
        self._ctx.state = segment.state_word
        self._ctx.ready_state = 1

    @classmethod
    def create(cls, name: str, *, slots: int = 64, stuck_after: float = 5.0) -> RunControl:
        if not 1 <= slots <= 4096:
            raise ValueError("slots must be in [1, 4096]")

        def init(seg: Segment) -> None:
            hdr = layout.ControlHeader.view(seg.map, CONTROL_OFFSET)
            hdr["slots"] = slots
            hdr["stuck_after_ms"] = int(stuck_after * 1000)

        size = ENTRIES_OFFSET + slots * ENTRY_SIZE
        return cls(Segment.create(Kind.CONTROL, name, size, init=init))

    @classmethod
    def open(cls, name: str, *, timeout: float = 10.0) -> RunControl:
        return cls(Segment.open(Kind.CONTROL, name, timeout=timeout))

    # -- the run ---------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        self.segment.require_open("epoch")
        return native.load64_acquire(self._epoch)

    def advance(self, n: int = 1) -> int:
        """Add ``n`` to the global epoch; returns the new value."""
        self.segment.require_open("advance")
        return native.fetch_add64(self._epoch, n) + n

    @property
    def stopped(self) -> bool:
        self.segment.require_open("stopped")
        return native.load_acquire(self._stop) & native.SEQ_MASK != 0

    @property
    def stop_reason(self) -> int:
        """0: a clean stop; else the entry slot + 1 whose failure stopped the run."""
        self.segment.require_open("stop_reason")
        return int(self.header["stop_reason"])

    def stop(self, reason: int = 0) -> None:
        """Raise the stop flag and wake every process waiting for it."""
        self.segment.require_open("stop")
        if reason and not self.stopped:
            self.header["stop_reason"] = reason
        native.publish(self._stop, 1)

    def wait_stop(self, timeout: float | None) -> bool:
        """Sleep (no CPU) until the stop flag rises, up to ``timeout``; True if it rose (or the
        segment was closed by its owner)."""
        self.segment.require_open("wait_stop")
        if self.stopped:
            return True
        rc = wait_in_slices(lambda t: native.wait_change(self._ctx, self._stop, 0, t), timeout)
        return rc >= 0 or rc == native.CLOSED

    # -- members ----------------------------------------------------------------------------

    def join(self, name: str, role: int = 0) -> Member:
        """Take a free entry, or else one whose process is gone (entries of live processes,
        and of dead ones while free entries remain, keep their state for everyone to see)."""
        self.segment.require_open("join")
        for reclaim in (False, True):
            for slot in range(self.slots):
                base = ENTRIES_OFFSET + slot * ENTRY_SIZE
                pid_word = self.segment.word(base + _ENTRY["pid"])
                pid = native.load_acquire(pid_word)
                if pid != 0 and (
                    not reclaim or lease.holder_alive(pid, int(self.entries[slot]["start_time"]))
                ):
                    continue
                start_word = self.segment.word64(base + _ENTRY["start_time"])
                if lease.take(pid_word, pid, partial(native.store64_release, start_word)):
                    return Member(self, slot, name, role)
        raise ChannelInUseError(f"{self.segment.path}: all {self.slots} entries are in use")

    def members(self) -> list[MemberStatus]:
        self.segment.require_open("members")
        now = native.monotonic_ns()
        out = []
        for slot in range(self.slots):
            e = self.entries[slot]
            word = int(e["pid"])
            pid = lease.holder(word)
            if pid == 0:
                continue
            state = PeerState(int(e["state"])).name
            if state == "ACTIVE" and not lease.holder_alive(word, int(e["start_time"])):
                state = "DEAD"
            age = max(0, now - int(e["heartbeat_ns"])) / 1e9
            raw = bytes(e["name"]).rstrip(b"\0")
            out.append(
                MemberStatus(
                    slot=slot,
                    pid=pid,
                    name=raw.decode("utf-8", "replace"),
                    role=int(e["role"]),
                    state=state,
                    heartbeat_age_s=age,
                    beats=int(e["beats"]),
                    error_code=int(e["error_code"]),
                    stuck=state == "ACTIVE" and age > self.stuck_after,
                )
            )
        return out

    def problems(self) -> list[MemberStatus]:
        """Members that died, got stuck, or flagged an error."""
        return [m for m in self.members() if not m.healthy]

    def close(self) -> None:
        """Unmap; the creator also marks the block CLOSED (waking ``wait_stop``) and unlinks.
        Every other method (and its members') then raises ChannelClosedError."""
        if self.segment.closed:
            return
        self.header = layout.ControlHeader.zeros()
        self.entries = layout.ProcEntry.zeros(0)
        if self.segment.owner:
            native.futex_wake(self._stop)
        self.segment.close()

    def __enter__(self) -> RunControl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Member:
    """This process's entry in the run: heartbeats, an error flag, a clean leave."""

    def __init__(self, control: RunControl, slot: int, name: str, role: int) -> None:
        self.control = control
        self.slot = slot
        self.entry: Any = control.entries[slot]
        base = ENTRIES_OFFSET + slot * ENTRY_SIZE
        self._state = control.segment.word(base + _ENTRY["state"])
        self._beat = control.segment.word64(base + _ENTRY["heartbeat_ns"])
        data = name.encode()[:NAME_MAX]
        self.entry["name"] = np.frombuffer(data.ljust(NAME_MAX, b"\0"), np.uint8)
        self.entry["role"] = role
        self.entry["error_code"] = 0
        self.entry["beats"] = 0
        self.beat()
        native.store_release(self._state, int(PeerState.ACTIVE))

    def beat(self) -> None:
        """Record that this process is making progress (a few stores, no system call)."""
        self.control.segment.require_open("beat")
        self.entry["beats"] = int(self.entry["beats"]) + 1
        native.store64_release(self._beat, native.monotonic_ns())

    def fail(self, code: int = 1, *, stop_run: bool = True) -> None:
        """Flag an error (and, by default, stop the run naming this entry)."""
        self.control.segment.require_open("fail")
        self.entry["error_code"] = code
        native.store_release(self._state, int(PeerState.ERROR))
        if stop_run:
            self.control.stop(reason=self.slot + 1)

    def leave(self) -> None:
        """Leave cleanly (CLOSED unless an error was flagged); a no-op once the run control was
        closed (like ``close()``)."""
        if self.control.segment.closed:
            return
        if native.load_acquire(self._state) == PeerState.ACTIVE:
            native.store_release(self._state, int(PeerState.CLOSED))
