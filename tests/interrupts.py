"""A real Ctrl-C (SIGINT to this process) in the middle of a call, for the tests of what a
client is like after one (tests/test_ray_misuse.py, tests/test_multi_interrupt.py)."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import numpy as np


def interrupted_step(envs: Any, actions: np.ndarray, after: float) -> bool:
    """``envs.step(actions)`` with a real SIGINT (Ctrl-C) to this process ``after`` seconds
    into it; True if the step raised KeyboardInterrupt. A SIGINT that comes after the step is
    ignored (never a KeyboardInterrupt into pytest)."""
    armed = True

    def on_sigint(signum: int, frame: Any) -> None:
        if armed:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    timer = threading.Timer(after, os.kill, (os.getpid(), signal.SIGINT))
    try:
        try:
            timer.start()
            try:
                envs.step(actions)
            finally:
                armed = False
        except KeyboardInterrupt:
            return True
        return False
    finally:
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGINT, previous)
