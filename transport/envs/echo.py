"""The echo env: a deterministic StepResult derived from the action, at (almost) no cost.

Step with action a: observation[0] = a, observation[1] = the step count, reward = a / 4,
action_mask all ones, done = 0, life = the step count mod 65536; every other field stays 0.
It writes in place (``step_into``), so a server measures transport cost, not env cost. The Node
echo env (node_bridge/src/envs/echo.ts) produces the same bytes.

``EchoEnv(episode_len=L)`` (L > 0, for auto-reset tests) also ends episodes: the episode's
length is L, plus ``seed % 5`` after a seeded reset (an unseeded reset keeps the last length),
shown in observation[2]; the step that reaches it sets done = 1. ``VectorEchoEnv``
(``transport.envs.vector_echo``) is the same env, N at a time.
"""

from __future__ import annotations

import numpy as np

from transport.runtime.env import Spaces

OBS_N = 612
ACT_N = 92


def episode_length(episode_len: int, seed: int | None, last: int) -> int:
    """An episode's length after a reset with ``seed`` (``last``: the previous one)."""
    if seed is None:
        return last
    return episode_len + seed % 5


class EchoEnv:
    def __init__(self, episode_len: int = 0) -> None:
        self.steps = 0
        self.episode_len = episode_len
        self.length = episode_len

    def spaces(self) -> Spaces:
        return Spaces(OBS_N, ACT_N)

    def reset_into(self, seed: int | None, out: np.ndarray) -> None:
        self.steps = 0
        out[()] = 0
        out["action_mask"] = 1
        if self.episode_len:
            self.length = episode_length(self.episode_len, seed, self.length)
            out["observation"][2] = self.length
        return None

    def step_into(self, action: int, out: np.ndarray) -> None:
        self.steps += 1
        obs = out["observation"]
        obs[0] = action
        obs[1] = self.steps
        out["reward"] = action / 4
        out["life"] = self.steps & 0xFFFF
        if self.episode_len:
            out["done"] = self.steps >= self.length
        return None

    def reset(self, seed: int | None = None) -> np.ndarray:
        from transport.generated import pac_env

        record = pac_env.StepResult.zeros()
        self.reset_into(seed, record)
        return record

    def step(self, action: int) -> np.ndarray:
        from transport.generated import pac_env

        record = pac_env.StepResult.zeros()
        record["action_mask"] = 1
        self.step_into(action, record)
        return record
