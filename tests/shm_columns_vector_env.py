"""A vector env over the image_columns schema (for tests/test_shm_columns.py): four Atari-sized
envs in NumPy, each frame a function of its env's last action and step count, episodes of 3 to
5 steps. ``VectorImages`` writes the shm columns directly (``writes_columns``);
``VectorImagesRows`` is the same env without the declaration (the server copies rows)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from transport.generated import image_columns
from transport.runtime.env import Spaces

SCHEMA = image_columns.SCHEMA
NUM_ENVS = 4


class VectorImagesRows:
    steps_subsets = True
    autoreset_next_step = False

    def __init__(self) -> None:
        self.num_envs = NUM_ENVS
        self.steps = np.zeros(NUM_ENVS, dtype=np.int64)
        self.length = 3 + np.arange(NUM_ENVS) % 3

    def spaces(self) -> Spaces:
        return Spaces(3 * 84 * 84, 18)

    def reset_envs(self, ids: np.ndarray, seeds: Sequence[int | None], out: np.ndarray) -> None:
        self.steps[ids] = 0
        out[ids] = np.zeros(len(ids), dtype=SCHEMA["StepResult"].dtype)
        out["action_mask"][ids] = 1

    def step_envs(self, actions: np.ndarray, ids: np.ndarray | None, out: np.ndarray) -> None:
        rows: slice | np.ndarray = slice(None) if ids is None else ids
        taken = np.asarray(actions).reshape(-1)[rows].astype(np.int64)
        steps = self.steps[rows] + 1
        self.steps[rows] = steps
        frame = (taken * 7 + steps) % 251
        out["observation"][rows] = frame[:, None, None, None].astype(np.uint8)
        out["reward"][rows] = taken * 0.5
        out["terminated"][rows] = steps >= self.length[rows]


class VectorImages(VectorImagesRows):
    writes_columns = True
