"""The frames env (schema ``frames``): a small engine with decision-boundary runs (seed 004).

Each request runs the engine until its next decision: a run of 1 + rand(40) frames (always
fewer than the schema's ``max_frames`` = 64), counting events on the way: drops (one per 4
frames), clears (one when rand(4) == 0), spawns (one per run), bonuses (rand(2)). The reward is
the clears; 24 decisions end the episode (terminated). Fault modes for the no-progress
watchdog: action 2 jams the engine (every later request runs 0 frames, until a reset), action 3
spins it (the run uses all max_frames frames without reaching a decision). The Node env
(node_bridge/src/envs/frames.ts) gives the same bytes for the same seed and actions.

RNG: MINSTD as in rich_spaces (seed s: state s mod (2^31 - 2) + 1; unseeded resets continue).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from transport.envs.rich_spaces import Minstd
from transport.runtime.env import Spaces

MAX_FRAMES = 64
"""The schema's [env] max_frames: a run that reaches it found no decision."""
DECISIONS = 24
"""Decisions per episode."""
JAM, SPIN = 2, 3


class FramesEnv:
    """The frames reference env (rules in the module docstring)."""

    def __init__(self) -> None:
        self.rng = Minstd()
        self.decisions = 0
        self.total = 0
        self.jammed = False

    def spaces(self) -> Spaces:
        return Spaces(obs_n=8, act_n=4)

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        self.rng.seed(seed)
        self.decisions = self.total = 0
        self.jammed = False
        return self._result(0, [0, 0, 0, 0], 0.0)

    def step(self, action: int) -> dict[str, Any]:
        if action == JAM:
            self.jammed = True
        if self.jammed:
            return self._result(0, [0, 0, 0, 0], 0.0)
        if action == SPIN:
            frames = MAX_FRAMES
            events = [frames // 4, 0, 0, 0]
        else:
            frames = 1 + self.rng.next(40)
            clears = 1 if self.rng.next(4) == 0 else 0
            events = [frames // 4, clears, 1, self.rng.next(2)]
            self.decisions += 1
        self.total += frames
        return self._result(frames, events, float(events[1]))

    def _result(self, frames: int, events: list[int], reward: float) -> dict[str, Any]:
        obs = np.zeros(8, dtype=np.float32)
        obs[0] = self.decisions / 32
        obs[1] = self.total / 1024
        obs[2] = frames / 64
        obs[3:7] = np.array(events, dtype=np.float32) / 16
        obs[7] = 1.0 if self.jammed else 0.0
        return {
            "observation": obs,
            "reward": reward,
            "terminated": self.decisions >= DECISIONS,
            "truncated": False,
            "frames": frames,
            "events": np.array(events, dtype=np.uint32),
            "decisions": self.decisions,
            "action_mask": np.ones(4, dtype=np.uint8),  # every action is legal
        }
