"""The pid leases of the channels: the board's publisher, a ring's consumer and its producer
entries, run-control members. A lease is a u32 pid word taken by compare-and-swap, beside the
holder's start time (a u64 from /proc, so a reused pid is not taken for the holder).

Taking one is three steps: CAS the word from the value read to ``pid | CLAIMING``, write the
holder's fields (its start time first), then store the plain pid with release. While CLAIMING is
set the start time is not written yet, so the holder is alive while that pid runs: no third
process judges it dead in the gap and takes the lease too (two publishers tear weights). The
Node side (node_bridge/src/channels/lease.ts) and the C ring checks read the word the same way
(docs/channels.md, "Leases")."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from transport import native

CLAIMING = 0x8000_0000
"""Set in a lease word while its new holder writes its start time (pids are below 2^22)."""
PID_MASK = 0x7FFF_FFFF


def holder(word: int) -> int:
    """The pid a lease word names (0: free)."""
    return word & PID_MASK


def holder_alive(word: int, start_time: int) -> bool:
    """The lease's holder runs: the pid and its start time, or only the pid while it is
    still being taken."""
    if word & CLAIMING:
        return native.peer_alive(word & PID_MASK, 0)
    return word != 0 and native.peer_alive(word, start_time)


def take(pid_word: Any, seen: int, fill: Callable[[int], None]) -> bool:
    """Take the lease word from the value ``seen`` (free, or a dead holder's): False when
    another process changed it first. ``fill(start_time)`` writes the holder's fields before
    the lease shows this process as its holder."""
    me = os.getpid()
    if not native.compare_exchange(pid_word, seen, me | CLAIMING):
        return False
    fill(native.proc_start_time(me))
    native.store_release(pid_word, me)
    return True
