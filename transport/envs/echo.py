"""The echo env: a deterministic StepResult derived from the action, at (almost) no cost.

Step with action a: observation[0] = a, observation[1] = the step count, reward = a / 4,
action_mask all ones, done = 0, life = the step count mod 65536; every other field stays 0.
It writes in place (``step_into``), so a server measures transport cost, not env cost. The Node
echo env (node_bridge/src/envs/echo.ts) produces the same bytes.
"""

from __future__ import annotations

import numpy as np

from transport.runtime.env import Spaces

OBS_N = 612
ACT_N = 92


class EchoEnv:
    def __init__(self) -> None:
        self.steps = 0

    def spaces(self) -> Spaces:
        return Spaces(OBS_N, ACT_N)

    def reset_into(self, seed: int | None, out: np.ndarray) -> None:
        self.steps = 0
        out[()] = 0
        out["action_mask"] = 1
        return None

    def step_into(self, action: int, out: np.ndarray) -> None:
        self.steps += 1
        obs = out["observation"]
        obs[0] = action
        obs[1] = self.steps
        out["reward"] = action / 4
        out["life"] = self.steps & 0xFFFF
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
