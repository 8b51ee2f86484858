"""The heavy-tailed env: echo's bytes, with a step time that is heavy-tailed (the benchmark of
asynchronous batches, benchmarks/async_bench.py).

Most steps take ``FAST_S`` of CPU (a busy wait: a real env computes); one in twenty, drawn from
the env's own seeded RNG, takes 20 times as long (a Tetris line clear, an engine that runs many
frames until the next decision). Served by name: ``transport-serve URL --env heavy_tail``.
"""

from __future__ import annotations

import random
import time

import numpy as np

from transport.envs.echo import EchoEnv

FAST_S = 0.0002
SLOW_FACTOR = 20
SLOW_ONE_IN = 20


def busy(seconds: float) -> None:
    """Spend ``seconds`` of CPU (not a sleep: the cost is CPU, as an env's step is)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class HeavyTailEnv(EchoEnv):
    """EchoEnv whose steps cost FAST_S, or SLOW_FACTOR x FAST_S one time in SLOW_ONE_IN."""

    def __init__(self, fast_s: float = FAST_S) -> None:
        super().__init__()
        self.fast_s = fast_s
        self.rng = random.Random()

    def reset_into(self, seed: int | None, out: np.ndarray) -> None:
        if seed is not None:
            self.rng.seed(seed)
        return super().reset_into(seed, out)

    def step_into(self, action: int, out: np.ndarray) -> None:
        slow = self.rng.randrange(SLOW_ONE_IN) == 0
        busy(self.fast_s * (SLOW_FACTOR if slow else 1))
        return super().step_into(action, out)
