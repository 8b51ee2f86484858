"""The contract's oracle: what a server of ContractEnv must answer, computed locally.

``ExpectedSession`` replays the protocol's env semantics (docs/protocol.md: seeds, the first
unseeded reset seeded by the server, action checks, the three auto-reset modes, env errors) over
local ``ContractEnv`` instances, so a check can compare every byte a server sends with the bytes
it should send. It is a specification written as code, deliberately simple and slow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from transport.codec import Schema
from transport.protocol import AutoReset, ErrorCode
from transport.testing.contract_env import POISON_ACTION, ContractEnv, result_codec


@dataclass(frozen=True)
class Refusal:
    """The ERROR a request must get: its code and the env it names."""

    code: ErrorCode
    env: int


class ExpectedSession:
    """One connection's expected envs: N ContractEnvs under an auto-reset mode."""

    def __init__(
        self,
        schema: Schema,
        num_envs: int,
        *,
        server_seed: int | None,
        autoreset: AutoReset = AutoReset.DISABLED,
    ) -> None:
        self.codec = result_codec(schema)
        self.envs = [ContractEnv(schema) for _ in range(num_envs)]
        self.server_seed = server_seed
        self.autoreset = autoreset
        self.results: list[np.ndarray | None] = [None] * num_envs
        self.ever_reset = False
        self.act_n = self.envs[0].spaces().act_n
        mask = self.codec.ir.role("action_mask")
        self.mask_name = mask.name if mask else None
        self.end_names = [f.name for f in self.codec.ir.episode_end_fields()]

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    def reset(self, seed: int | None = None) -> list[np.ndarray]:
        """RESET (seed None) or RESET_SEED: env i gets seed + i; the first unseeded reset of a
        session uses the server's seed."""
        if seed is None and not self.ever_reset:
            seed = self.server_seed
        self.ever_reset = True
        self.results = [
            env.reset(None if seed is None else seed + i) for i, env in enumerate(self.envs)
        ]
        return [r for r in self.results if r is not None]

    def done(self, index: int) -> bool:
        result = self.results[index]
        return result is not None and any(bool(result[name]) for name in self.end_names)

    def allowed(self, index: int) -> list[int]:
        """The actions env ``index`` may take now (mask allows, in range, not the poison)."""
        result = self.results[index]
        if result is None or self.mask_name is None:
            return [a for a in range(self.act_n) if a != POISON_ACTION]
        mask = np.asarray(result[self.mask_name])
        return [a for a in range(self.act_n) if mask[a] and a != POISON_ACTION]

    def refusal(self, actions: Sequence[int]) -> Refusal | None:
        """The ERROR a step with ``actions`` must get before any env steps, or None."""
        skip_done = self.autoreset == AutoReset.NEXT_STEP
        for i, action in enumerate(actions):
            result = self.results[i]
            if result is None:
                return Refusal(ErrorCode.NOT_RESET, i)
            if self.done(i):
                if skip_done:
                    continue
                return Refusal(ErrorCode.NOT_RESET, i)
            if not 0 <= action < self.act_n:
                return Refusal(ErrorCode.INVALID_ACTION, i)
            if self.mask_name is not None and not np.asarray(result[self.mask_name])[action]:
                return Refusal(ErrorCode.MASKED_ACTION, i)
        return None

    def step(
        self, actions: Sequence[int]
    ) -> tuple[list[np.ndarray], list[tuple[int, np.ndarray]], list[int]]:
        """A step request that passed the checks: (results, finals, envs that raised).

        An env that raises is reset without a seed (the server's recovery); the others step.
        """
        finals: list[tuple[int, np.ndarray]] = []
        failed: list[int] = []
        for i, action in enumerate(actions):
            env = self.envs[i]
            if self.autoreset == AutoReset.NEXT_STEP and self.done(i):
                self.results[i] = env.reset(None)
                continue
            try:
                result = env.step(int(action))
            except Exception:
                failed.append(i)
                self.results[i] = env.reset(None)
                continue
            self.results[i] = result
            if self.autoreset == AutoReset.SAME_STEP and self.done(i):
                finals.append((i, result))
                self.results[i] = env.reset(None)
        return [r for r in self.results if r is not None], finals, failed


def field_differences(got: np.ndarray, expected: np.ndarray, what: str) -> list[str]:
    """The fields whose bytes differ between a server's record and the expected one."""
    problems = []
    for name in expected.dtype.names or ():
        a = np.ascontiguousarray(got[name]).tobytes()
        b = np.ascontiguousarray(expected[name]).tobytes()
        if a != b:
            problems.append(f"{what}: field {name} differs from the contract env's")
    return problems
