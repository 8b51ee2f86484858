"""Reference envs for the richer spaces (issue 12 item 7), the same in Node
(node_bridge/src/envs/rich_spaces.ts: same seeds, same bytes):

- ``ReachEnv`` (schema ``dictbox``): a Dict observation (``grid`` f32[2,5,5], ``vec`` f32[4])
  and a Box action ``move`` f32[2] in -1..1. The agent moves by (dx, dy) in a 5 x 5 square
  towards a goal cell: reward -0.1 x distance per step, 1.0 and terminated within 0.5 of the
  goal, truncated after 50 steps.
- ``LockEnv`` (schema ``multidiscrete``): a MultiDiscrete action ``dials`` u8[3] (3, 4, 5
  positions). Each step sets every dial; reward 1.0 and terminated when all three are right,
  else -0.05; truncated after 20 steps. Observation: each dial's position scaled to 0..1, then
  1.0 for each dial that is right.

Both draw from MINSTD (state * 48271 mod 2^31 - 1), exact in both languages' doubles; a seed s
sets the state to s mod (2^31 - 2) + 1, an unseeded reset continues the stream.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from transport.runtime.env import Spaces

MODULUS = 2**31 - 1
SIDE = 5
REACH_STEPS = 50
LOCK_NVEC = (3, 4, 5)
LOCK_STEPS = 20


class Minstd:
    """The Lehmer generator both languages share."""

    def __init__(self) -> None:
        self.state = 1

    def seed(self, seed: int | None) -> None:
        if seed is not None:
            self.state = seed % (MODULUS - 1) + 1

    def next(self, n: int) -> int:
        """A draw in 0..n-1."""
        self.state = self.state * 48271 % MODULUS
        return self.state % n


def _cell(v: float) -> int:
    """The grid cell of a coordinate (round half up, the same in JavaScript)."""
    return min(SIDE - 1, max(0, math.floor(v + 0.5)))


class ReachEnv:
    """Reach a goal cell with continuous moves (schema dictbox)."""

    def __init__(self) -> None:
        self.rng = Minstd()
        self.x = self.y = 0.0
        self.gx = self.gy = 0
        self.steps = 0

    def spaces(self) -> Spaces:
        return Spaces(2 * SIDE * SIDE + 4, 2)  # act_n: the action's element count

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        self.rng.seed(seed)
        self.x, self.y = float(self.rng.next(SIDE)), float(self.rng.next(SIDE))
        self.gx, self.gy = self.rng.next(SIDE), self.rng.next(SIDE)
        if (self.gx, self.gy) == (int(self.x), int(self.y)):
            self.gx = (self.gx + 2) % SIDE
        self.steps = 0
        return self._result(0.0, False, False)

    def step(self, action: Any) -> dict[str, Any]:
        move = np.asarray(action, dtype=np.float64)
        self.x = min(SIDE - 1.0, max(0.0, self.x + float(move[0])))
        self.y = min(SIDE - 1.0, max(0.0, self.y + float(move[1])))
        self.steps += 1
        distance = self._distance()
        terminated = distance < 0.5
        reward = 1.0 if terminated else -0.1 * distance
        return self._result(reward, terminated, not terminated and self.steps >= REACH_STEPS)

    def _distance(self) -> float:
        dx, dy = self.x - self.gx, self.y - self.gy
        return math.sqrt(dx * dx + dy * dy)

    def _result(self, reward: float, terminated: bool, truncated: bool) -> dict[str, Any]:
        grid = np.zeros((2, SIDE, SIDE), dtype=np.float32)
        grid[0, _cell(self.y), _cell(self.x)] = 1.0
        grid[1, self.gy, self.gx] = 1.0
        scale = SIDE - 1
        vec = np.array(
            [self.x / scale, self.y / scale, self.gx / scale, self.gy / scale], dtype=np.float32
        )
        return {
            "grid": grid,
            "vec": vec,
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "distance": self._distance(),
        }


class LockEnv:
    """Set three dials to a hidden combination (schema multidiscrete)."""

    def __init__(self) -> None:
        self.rng = Minstd()
        self.target = [0, 0, 0]
        self.dials = [0, 0, 0]
        self.steps = 0

    def spaces(self) -> Spaces:
        return Spaces(2 * len(LOCK_NVEC), len(LOCK_NVEC))  # act_n: the action's element count

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        self.rng.seed(seed)
        self.target = [self.rng.next(n) for n in LOCK_NVEC]
        self.dials = [0, 0, 0]
        self.steps = 0
        return self._result(0.0, False)

    def step(self, action: Any) -> dict[str, Any]:
        self.dials = [int(v) for v in np.asarray(action).reshape(len(LOCK_NVEC))]
        self.steps += 1
        solved = self.dials == self.target
        return self._result(1.0 if solved else -0.05, solved)

    def _result(self, reward: float, terminated: bool) -> dict[str, Any]:
        right = [float(d == t) for d, t in zip(self.dials, self.target, strict=True)]
        scaled = [d / (n - 1) for d, n in zip(self.dials, LOCK_NVEC, strict=True)]
        return {
            "observation": np.array(scaled + right, dtype=np.float32),
            "reward": reward,
            "terminated": terminated,
            "truncated": not terminated and self.steps >= LOCK_STEPS,
            "matched": int(sum(right)),
        }
