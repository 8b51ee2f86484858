"""The episode collector's rewards keep the reward field's precision, and a policy output of the
wrong shape is a typed error that names it.

Regressions: (1) the collector stored rewards as float32, so an f64 reward field's values were
rounded (0.44662690758705137 became 0.4466269) and returns differed from gymnasium's; now the
rewards have the field's own float dtype (float64 for f64, float32 stays float32). (2) A policy
that returned M + 1 actions for M envs surfaced as NumPy's ``ValueError: cannot reshape array of
size 5 into shape (4,)``; now it is an ``ActionError`` naming the policy's output and the shape
expected, and an output of the right size but another shape is refused too, never reshaped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import gymnasium
import numpy as np
import pytest

import transport
import transport.api as api
from transport.collector import EpisodeCollector, request_episodes
from transport.envs.pac import PacEnv
from transport.errors import ActionError
from transport.gym_serve import gym_server

from .servers import unique_url


class Thirds(gymnasium.Env[np.int64, np.int64]):
    """Step t (from 0) of an episode rewards (t + 1) / 3, not a float32 value; episodes end
    after 3 + seed % 3 steps (3 without a seed)."""

    observation_space = gymnasium.spaces.Discrete(16)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self) -> None:
        self.t = 0
        self.length = 3

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.int64, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        if seed is not None:
            self.length = 3 + seed % 3
        return np.int64(0), {}

    def step(self, action: np.int64) -> tuple[np.int64, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return np.int64(self.t), self.t / 3, self.t >= self.length, False, {}


@pytest.fixture
def thirds() -> Iterator[str]:
    with gym_server(Thirds, unique_url("unix"), num_envs=4).start() as server:
        yield server.bound_url


def zeros(obs: Any, env_ids: np.ndarray) -> np.ndarray:
    return np.zeros(len(env_ids), np.int64)


def test_f64_rewards_are_kept_exactly(thirds: str) -> None:
    with transport.connect(thirds, autoreset="next_step") as client:
        batch = request_episodes(client, 6, zeros, max_len=10, seed=0)
    assert batch.rewards.dtype == np.float64  # was float32
    for row, length in enumerate(batch.lengths.tolist()):
        want = [(t + 1) / 3 for t in range(length)]
        assert batch.rewards[row, :length].tolist() == want  # exact: 1/3, not 0.33333334
        assert not batch.rewards[row, length:].any()
        assert batch.rewards[row].sum() == sum(want)  # the episode's return, as gymnasium's


def test_f32_rewards_stay_float32() -> None:
    with api.Server(PacEnv, unique_url("unix"), num_envs=2).start() as server:
        with transport.connect(server.bound_url, autoreset="next_step") as client:

            def legal(obs: np.ndarray, env_ids: np.ndarray) -> np.ndarray:
                masks = obs[:, 512:604] > 0
                return np.array([np.flatnonzero(m)[0] for m in masks])

            batch = request_episodes(client, 2, legal, max_len=5, seed=3)
    assert batch.rewards.dtype == np.float32


def test_reward_dtype_rule() -> None:
    from transport.collector import reward_dtype_of

    assert reward_dtype_of(np.dtype("<f8")) == np.float64
    assert reward_dtype_of(np.dtype("<f4")) == np.float32
    assert reward_dtype_of(np.dtype(">f8")) == np.float64  # native order
    assert reward_dtype_of(np.dtype("<i4")) == np.float64  # not a float: as the adapters
    assert reward_dtype_of(np.dtype("u1")) == np.float64


@pytest.mark.parametrize(
    ("output", "given"),
    [
        (lambda m: np.zeros(m + 1, np.int64), r"ndarray of shape \(5,\), dtype int64"),
        (lambda m: np.zeros(m - 1, np.int64), r"ndarray of shape \(3,\), dtype int64"),
        (lambda m: np.zeros((m, 1), np.int64), r"ndarray of shape \(4, 1\), dtype int64"),
        (lambda m: [0] * m + [1], r"list of shape \(5,\), dtype int64"),
        (lambda m: 0, r"int 0"),
    ],
)
def test_a_policy_output_of_the_wrong_shape_is_an_action_error(
    thirds: str, output: Any, given: str
) -> None:
    def policy(obs: Any, env_ids: np.ndarray) -> Any:
        return output(len(env_ids))

    with (
        transport.connect(thirds, autoreset="next_step") as client,
        EpisodeCollector(client, policy, max_len=10, batch_size=2) as collector,
    ):
        with pytest.raises(ActionError) as caught:
            collector.request_episodes(timeout=30)
        text = str(caught.value)
        assert text.startswith("policy_fn returned "), text
        assert re.search(given, text), text
        assert "for 4 envs (env ids [0, 1, 2, 3])" in text
        assert "expected one action per env, an array of shape (4,) for Discrete(2)" in text
        # the client is not harmed: a collector with a right policy works on it
        with EpisodeCollector(client, zeros, max_len=10, batch_size=2) as good:
            assert good.request_episodes(timeout=30).lengths.tolist() == [3, 4]
