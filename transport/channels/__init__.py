"""Actor-learner channels on shared memory (seed 002, docs/channels.md).

- :class:`Ring`: experience records of a schema struct from producers to one consumer.
- :class:`PolicyBoard`: named arrays (a torch ``state_dict``) from one publisher to any readers.
- :class:`RunControl`: the run's epoch, stop flag, per-process heartbeats and error flags.

All three live in ``/dev/shm/transport-<kind>-<name>`` segments with one lifecycle
(:mod:`transport.channels.segment`) and interoperate byte for byte with ``node_bridge``'s
``channels`` module.
"""

from __future__ import annotations

from transport.channels.board import PolicyBoard
from transport.channels.control import Member, MemberStatus, RunControl
from transport.channels.errors import (
    ChannelClosedError,
    ChannelCorruptError,
    ChannelError,
    ChannelInUseError,
    ChannelMismatchError,
    ChannelNotFoundError,
    ChannelTimeoutError,
    PeerDiedError,
    TornReadError,
)
from transport.channels.ring import Batch, Consumer, Producer, Ring, record_fingerprint
from transport.channels.segment import SegmentInfo, cleanup_stale, list_segments
from transport.channels.wait import WaitPolicy

__all__ = [
    "Batch",
    "ChannelClosedError",
    "ChannelCorruptError",
    "ChannelError",
    "ChannelInUseError",
    "ChannelMismatchError",
    "ChannelNotFoundError",
    "ChannelTimeoutError",
    "Consumer",
    "Member",
    "MemberStatus",
    "PeerDiedError",
    "PolicyBoard",
    "Producer",
    "Ring",
    "RunControl",
    "SegmentInfo",
    "TornReadError",
    "WaitPolicy",
    "cleanup_stale",
    "list_segments",
    "record_fingerprint",
]
