"""shm://name?num_envs=N: POSIX shared memory + futex, zero copy (region and protocol: docs/shm.md).

The server (``server.Listener``) creates ``/dev/shm/transport-<name>`` and hands each client's
envs record views of the slots, so ``step_into`` writes the result where the client reads it.
The client side (``channel.ShmChannel``, a Channel under the one ``Client``) writes the actions
into the slots, publishes every slot's request sequence, rings the doorbell once and waits
(spin, then FUTEX_WAIT slices with liveness checks, all in C with the GIL released) for every
response sequence; results are NumPy views straight into the mapping. ``region`` holds the
layout, the segment's lifecycle and the wait policy.

One client per region at a time: the client takes a lease (``client_pid``, CAS 0 -> pid); the
server reclaims the lease of a dead client, so another client can attach.
"""

from __future__ import annotations

from transport.backends.shm.channel import ShmChannel, open_channel
from transport.backends.shm.server import Listener
from transport.errors import RegionMismatchError

__all__ = ["Listener", "RegionMismatchError", "ShmChannel", "open_channel"]
