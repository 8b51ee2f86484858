"""The wait policy of the channels: the one shm:// uses (spin budget, then futex slices).

Imported from one place so the move of ``transport/shm.py`` touches one line.
"""

from __future__ import annotations

from transport.backends.shm.region import WaitPolicy

__all__ = ["WaitPolicy"]
