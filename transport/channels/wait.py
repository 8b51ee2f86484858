"""How the channels wait: the shm:// wait policy (spin budget, then futex slices), and native
waits cut into slices so Python's signal handlers (Ctrl-C, alarms) run meanwhile.

The policy is imported from one place so the move of ``transport/shm.py`` touches one line.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from transport import native
from transport.backends.shm.region import WaitPolicy

__all__ = ["SLICE_S", "WaitPolicy", "wait_in_slices"]

SLICE_S = 0.25
"""The longest a native wait runs before it returns to Python (which runs pending handlers)."""


def wait_in_slices(call: Callable[[float], int], timeout: float | None) -> int:
    """``call(seconds)``, a native wait, in slices of at most ``SLICE_S`` until it returns
    anything but TIMEOUT or ``timeout`` (None: no deadline) has passed: a Ctrl-C comes within a
    slice, not when the peer acts."""
    if timeout is not None and timeout <= SLICE_S:
        return int(call(timeout))
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = SLICE_S if deadline is None else min(SLICE_S, deadline - time.monotonic())
        rc = int(call(max(0.0, left)))
        if rc != native.TIMEOUT or (deadline is not None and time.monotonic() >= deadline):
            return rc
