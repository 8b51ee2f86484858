"""transport.rollout with policies that return what ``TorchClient.step`` takes besides tensors
(a QA pass, 2026-11-27): NumPy actions, a list, an int, and plain-number or NumPy extras are
made tensors (``torch.as_tensor``) and kept like a tensor policy's; they were torch's
``TypeError`` / ``AttributeError`` from inside the collector. What is not numbers of one shape
is a typed error that names the output."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import transport  # noqa: E402
import transport.torch as tt  # noqa: E402
from transport.api import Server  # noqa: E402
from transport.errors import ActionError, AdapterError  # noqa: E402
from transport.gym_serve import gym_server  # noqa: E402
from transport.rollout import RolloutCollector  # noqa: E402

from .servers import unique_url  # noqa: E402

N = 3
T = 12


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with gym_server("CartPole-v1", unique_url("shm"), num_envs=N).start() as srv:
        yield srv


@pytest.fixture(scope="module")
def single() -> Iterator[Server]:
    with gym_server("CartPole-v1", unique_url("unix"), num_envs=1).start() as srv:
        yield srv


def pushes(obs: Any) -> np.ndarray:
    """Push toward the pole's lean: keeps episodes going, and depends on the observation."""
    return (np.asarray(obs)[..., 2] > 0).astype(np.int64)


def replay(url: str, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The plain client, same seed and actions: observations and rewards of each step."""
    obs, rewards = [], []
    with transport.connect(url, autoreset="same_step") as client:
        view = client.reset(seed=3)
        for t in range(actions.shape[0]):
            obs.append(np.array(view["observation"]))
            view = client.step(actions[t])
            reward = np.array(view["reward"], dtype=np.float32)
            for index, final in client.finals:
                reward[index] = final["reward"]
            rewards.append(reward)
    return np.stack(obs), np.stack(rewards)


POLICIES: dict[str, Callable[[Any, Any], Any]] = {
    "numpy": lambda obs, masks: pushes(obs),
    "list": lambda obs, masks: pushes(obs).tolist(),
    "numpy-int32-and-number-extras": lambda obs, masks: (
        pushes(obs).astype(np.int32),
        {"value": 0.5, "logprob": np.full(N, -0.25, np.float64), "steps": [1] * N},
    ),
    "readonly-and-reversed-numpy": lambda obs, masks: (
        np.broadcast_to(pushes(obs), (N,)),
        {"value": np.arange(N, dtype=np.float32)[::-1]},
    ),
}


@pytest.mark.parametrize("name", list(POLICIES))
def test_non_tensor_outputs_are_kept_as_tensors(server: Server, name: str) -> None:
    with tt.connect(server.bound_url, device="cpu", autoreset="same_step") as client:
        buf = RolloutCollector(client, POLICIES[name], T, seed=3).collect()
        actions = buf.actions.numpy().copy()
        rewards = buf.rewards.numpy().copy()
        observations = buf.observations.numpy().copy()
        extras = {key: value.numpy().copy() for key, value in buf.extras.items()}
    assert buf.actions.shape == (T, N)
    assert buf.actions.dtype == (torch.int32 if "int32" in name else torch.int64)
    want_obs, want_rewards = replay(server.bound_url, actions)
    assert np.array_equal(observations, want_obs)
    assert np.array_equal(rewards, want_rewards)
    assert np.array_equal(actions, pushes(observations))
    if name == "numpy-int32-and-number-extras":
        assert extras["value"].shape == (T,) and np.all(extras["value"] == 0.5)
        assert extras["logprob"].dtype == np.float64 and np.all(extras["logprob"] == -0.25)
        assert extras["steps"].shape == (T, N) and np.all(extras["steps"] == 1)
    if name == "readonly-and-reversed-numpy":
        assert np.array_equal(extras["value"], np.tile([2.0, 1.0, 0.0], (T, 1)))


def test_an_int_action_of_a_one_env_server(single: Server) -> None:
    with tt.connect(single.bound_url, device="cpu", autoreset="same_step") as client:
        buf = RolloutCollector(client, lambda obs, masks: int(obs[0, 2] > 0), T, seed=3).collect()
        actions = buf.actions.numpy().copy()
        observations = buf.observations.numpy().copy()
    assert buf.actions.dtype == torch.int64
    assert np.array_equal(actions.reshape(T), pushes(observations).reshape(T))
    want_obs, _ = replay(single.bound_url, actions.reshape(T))
    assert np.array_equal(observations.reshape(T, 4), want_obs.reshape(T, 4))


def test_outputs_that_are_not_numbers_are_typed_errors(server: Server) -> None:
    with tt.connect(server.bound_url, device="cpu", autoreset="same_step") as client:
        with pytest.raises(ActionError, match="policy returned actions as str"):
            RolloutCollector(client, lambda obs, masks: "left", T, seed=3).collect()
        ragged = RolloutCollector(
            client, lambda obs, masks: (pushes(obs), {"value": [[1], [2, 3], []]}), T, seed=3
        )
        with pytest.raises(AdapterError, match="policy returned extra 'value' as list"):
            ragged.collect()
