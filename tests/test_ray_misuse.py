"""transport.ray used the ways a trainer uses it by accident or on purpose, in both server
auto-reset modes: a per-env seed list (``reset(seed=[s0, None, ...])``, as gymnasium's
``SyncVectorEnv`` takes it) and a Ctrl-C in the middle of a step.

One small loopback Ray node (2 logical CPUs) for the module; 2 actors of half a CPU each.
Skipped, with the reason, only where Ray or gymnasium is not installed or Ray cannot start.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'transport[ray]')")

from transport.ray.testing import use_loopback

use_loopback()  # before anything below talks to Ray

from .ray_util import cluster_or_skip  # noqa: E402

gymnasium = pytest.importorskip("gymnasium", reason="gymnasium is not installed")

from transport.envs import env_schema  # noqa: E402
from transport.envs.heavy_tail import SLOW_FACTOR, SLOW_ONE_IN, HeavyTailEnv  # noqa: E402
from transport.errors import AdapterError  # noqa: E402
from transport.gym_serve import gym_factory, gym_schema  # noqa: E402
from transport.ray import launch  # noqa: E402

from .interrupts import interrupted_step  # noqa: E402

CLIENT_TIMEOUT = 10.0
READY_TIMEOUT = 60.0
MODES = ("next_step", "same_step")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    yield from cluster_or_skip(nodes=1, num_cpus=2)


def sync_cartpoles(seed: list[int | None]) -> np.ndarray:
    """What gymnasium's own SyncVectorEnv of 4 CartPoles shows after ``reset(seed=seed)``."""
    envs = gymnasium.vector.SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * 4)
    try:
        observations, _ = envs.reset(seed=seed)
        return np.asarray(observations)
    finally:
        envs.close()


def test_a_per_env_seed_list_seeds_env_i_with_seed_i_in_every_mode(cluster: Any) -> None:
    """``reset(seed=[...])`` (one int or None per env) gives env i ``seed[i]`` through
    ``RayVectorEnv`` and ``ClusterClient`` in every auto-reset mode, as ``SyncVectorEnv`` does
    (same-step was a bare TypeError from a pool thread: ``seed + rows.start`` on a list). A
    wrong length is a clear error before anything is sent, and the client goes on working."""
    every: list[int | None] = [1, 2, 3, 4]
    some: list[int | None] = [1, None, 3, None]
    want_every, want_some = sync_cartpoles(list(every)), sync_cartpoles(some)
    with launch(
        gym_factory("CartPole-v1"),
        schema=gym_schema("CartPole-v1"),
        num_servers=2,
        num_envs=2,
        num_cpus=0.5,
        ready_timeout=READY_TIMEOUT,
    ) as servers:
        for mode in MODES:
            envs = servers.vector_env(autoreset_mode=mode, timeout=CLIENT_TIMEOUT)
            try:
                observations, _ = envs.reset(seed=every)
                np.testing.assert_array_equal(observations, want_every, err_msg=mode)
                observations, _ = envs.reset(seed=some)
                np.testing.assert_array_equal(observations[::2], want_some[::2], err_msg=mode)
                with pytest.raises(AdapterError, match="one seed"):
                    envs.reset(seed=[1, 2, 3])
                observations, *_ = envs.step(np.zeros(4, dtype=np.int64))
                assert observations.shape == (4, 4), mode
            finally:
                envs.close()
        for mode in ("disabled", *MODES):
            client = servers.connect(autoreset=mode, timeout=CLIENT_TIMEOUT)
            try:
                view = client.reset(every, copy=True)
                np.testing.assert_array_equal(view["observation"], want_every, err_msg=mode)
                view = client.reset(tuple(some), copy=True)
                np.testing.assert_array_equal(
                    view["observation"][::2], want_some[::2], err_msg=mode
                )
                view = client.reset(np.array(every), copy=True)  # an array of seeds: its values
                np.testing.assert_array_equal(view["observation"], want_every, err_msg=mode)
                for wrong in ([1, 2, 3], [1, 2, 3, 4, 5]):
                    with pytest.raises(ValueError, match=f"per env: 4, got {len(wrong)}"):
                        client.reset(wrong)
                with pytest.raises(TypeError, match="env 1's seed is '2'"):  # before any reset
                    client.reset([1, "2", 3, 4])  # type: ignore[list-item]
                view = client.reset(0, copy=True)  # an int: env i gets 0 + i
                np.testing.assert_array_equal(
                    view["observation"], sync_cartpoles([0, 1, 2, 3]), err_msg=mode
                )
            finally:
                client.close()


FAST_S = 0.05
SLOW_S = FAST_S * SLOW_FACTOR
"""The heavy-tailed env's steps: 0.05 s, or 1 s one time in 20 (drawn from its seed)."""
UNEVEN_SEED = 103
"""``reset(seed=103)``: env 0 (seed 103) draws fast first steps, env 1 (seed 104) a slow first
step, then fast ones: a Ctrl-C in the first step lands after server 0 answered and while server
1 still steps (``random.Random(seed).randrange(20) == 0`` is a slow step)."""


@pytest.mark.parametrize("mode", MODES)
def test_ctrl_c_in_a_step_leaves_the_vector_env_working_and_in_step(
    cluster: Any, mode: str
) -> None:
    """Ctrl-C while ``RayVectorEnv.step`` waits for a slow server (the other one answered)
    raises KeyboardInterrupt only once every server's call is over: the next step works at once
    (same-step left the slow server's call running on its pool thread: the next step was "another
    thread is in a call on this client", a BatchError, with the envs out of step) and every env
    did the interrupted step (its results are lost), so the envs stay in step."""
    assert [random.Random(UNEVEN_SEED + i).randrange(SLOW_ONE_IN) == 0 for i in range(2)] == [
        False,
        True,
    ]
    with launch(
        functools.partial(HeavyTailEnv, FAST_S),
        schema=env_schema("heavy_tail"),
        num_servers=2,
        num_envs=1,
        num_cpus=0.5,
        ready_timeout=READY_TIMEOUT,
    ) as servers:
        envs = servers.vector_env(autoreset_mode=mode, timeout=CLIENT_TIMEOUT)
        try:
            envs.reset(seed=UNEVEN_SEED)
            actions = np.array([3, 5])
            assert interrupted_step(envs, actions, after=SLOW_S / 2), "the step was not cut"
            # the echo env's observation: [0] the action, [1] the env's step count
            observations, rewards, *_ = envs.step(actions)
            assert observations[:, 0].tolist() == [3.0, 5.0]
            assert observations[:, 1].tolist() == [2.0, 2.0]  # the interrupted step, then this
            assert rewards.tolist() == [0.75, 1.25]
            observations, _ = envs.reset(seed=0)
            assert observations[:, 1].tolist() == [0.0, 0.0]
            observations, *_ = envs.step(actions)
            assert observations[:, 1].tolist() == [1.0, 1.0]
        finally:
            envs.close()
