"""The env interface a server hosts (the same on the Node side), and what it returns."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

StepOutput = Mapping[str, Any] | np.ndarray
"""What an env returns from reset/step: field values by name, or a record of the codec's dtype."""


@dataclass(frozen=True)
class Spaces:
    """Observation length and number of discrete actions."""

    obs_n: int
    act_n: int


@runtime_checkable
class Env(Protocol):
    """The env interface a server hosts (the same on the Node side).

    ``reset`` and ``step`` return the result's field values (a mapping, validated) or a record
    of the result codec's dtype (copied, not validated). Optional methods:

    - ``reset_into(seed, out)`` and ``step_into(action, out)``: write the result straight into
      ``out``, a record view of the response buffer or shm slot (zero copy; not cleared between
      calls, NaNs not canonicalised), and return None.
    - ``step_batch(actions)``: one action per seat of a multi-player game (seed 000's self-play
      ``stepBatch``), one result per seat. A 1-env server whose env has it answers STEP_MULTI
      by calling it once; the runtime checks the range of every action and that the game was
      reset and is not over, the env checks the rest (each seat's mask).
    - ``observe()``: the env's current result without stepping (OBSERVE); without it the last
      result is answered unchanged.
    - ``info()``: a free-form msgpack-able map (the OBSERVE tail); ``{}`` without it.
    - ``close()``: called when the env is dropped.
    """

    def spaces(self) -> Spaces: ...

    def reset(self, seed: int | None = None) -> StepOutput: ...

    def step(self, action: int) -> StepOutput: ...


EnvFactory = Callable[[], Env]
"""A zero-argument callable making a fresh env (one per env of a client; picklable for workers)."""
