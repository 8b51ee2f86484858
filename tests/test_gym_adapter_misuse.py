"""Misuse of the gymnasium adapters (RemoteEnv, RemoteVectorEnv) against real gym servers, over
unix and shm: an action of another shape is refused with the client's ActionError (never
reshaped so that an env gets another env's numbers), a non-integer for a Discrete action is
refused, reset options (which the protocol cannot carry) are refused with what to do instead,
and render() on a gym server without a render mode says how to start it with one.
docs/client.md "Actions", docs/adapters.md."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

gymnasium = pytest.importorskip("gymnasium")

from gymnasium import spaces  # noqa: E402
from gymnasium.vector import SyncVectorEnv  # noqa: E402

from transport.errors import ActionError, AdapterError  # noqa: E402
from transport.gym import RemoteAsyncVectorEnv, RemoteEnv, RemoteVectorEnv  # noqa: E402
from transport.gym_serve import gym_server  # noqa: E402

from .servers import unique_url  # noqa: E402

BACKENDS = ["unix", "shm"]
N = 3


class EchoAction(gymnasium.Env[np.ndarray, Any]):
    """Its observation is the action it was given (cast to float32, its action's shape)."""

    def __init__(self, action_space: Any) -> None:
        self.action_space = action_space
        shape = action_space.shape or (1,)
        self.observation_space = spaces.Box(-10.0, 10.0, shape, np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        assert self.action_space.contains(action), action
        obs = np.asarray(action, dtype=np.float32).reshape(self.observation_space.shape)
        return obs, 0.0, False, False, {}


def echo_box() -> EchoAction:
    return EchoAction(spaces.Box(-10.0, 10.0, (2,), np.float32))


def echo_discrete_start() -> EchoAction:
    """Discrete(4, start=3): served as an i32[1] field (gymnasium's shape is ())."""
    return EchoAction(spaces.Discrete(4, start=3))


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def echo_url(backend: str) -> Iterator[str]:
    with gym_server(echo_box, unique_url(backend), num_envs=N).start() as server:
        yield server.bound_url


def test_box_actions_of_another_shape_are_refused_not_reshaped(echo_url: str) -> None:
    """(N, 2) is one action per env; its transpose, the flat (2N,) and a (1, 2N) are refused
    with ActionError (before: silently reshaped, env 1 got [5, 2]); nothing is stepped."""
    envs = RemoteVectorEnv(echo_url)
    try:
        envs.reset(seed=0)
        actions = np.array([[1, 2], [3, 4], [5, 6]], np.float32)
        assert envs.step(actions)[0].tolist() == actions.tolist()
        for wrong in (actions.T, actions.ravel(), actions.reshape(1, 6), actions.T.tolist()):
            with pytest.raises(ActionError, match=r"Box\(-10.0, 10.0, \(2,\), float32\)") as got:
                envs.step(wrong)
            assert "pass one action per env: an array of shape (3, 2)" in str(got.value)
        # nothing was stepped: the envs still show the last accepted actions
        assert envs.step(actions + 1)[0].tolist() == (actions + 1).tolist()
    finally:
        envs.close()


def test_a_wrong_count_is_an_action_error_naming_the_space(echo_url: str) -> None:
    """Before: numpy's "cannot reshape array of size 4 into shape (3,2)"."""
    envs = RemoteVectorEnv(echo_url)
    try:
        envs.reset(seed=0)
        for wrong in (np.zeros((2, 2), np.float32), [[0.0, 0.0]] * 4):
            with pytest.raises(ActionError, match=r"expected 3 actions, got \d") as got:
                envs.step(wrong)
            assert "Box(-10.0, 10.0, (2,), float32) (3 envs)" in str(got.value)
    finally:
        envs.close()


def test_discrete_vector_actions_of_another_shape_are_refused(backend: str) -> None:
    """CartPole, N = 3: a (3, 1), (1, 3) or (2,) array, or floats, are ActionErrors naming
    Discrete(2); (before: (3, 1) and (1, 3) were reshaped and stepped, (2,) a numpy error)."""
    with gym_server("CartPole-v1", unique_url(backend), num_envs=N).start() as server:
        envs = RemoteVectorEnv(server.bound_url)
        try:
            envs.reset(seed=0)
            for wrong in (np.ones((3, 1), np.int64), np.ones((1, 3), np.int64), np.ones(2, int)):
                with pytest.raises(ActionError, match=r"Discrete\(2\) \(3 envs\)"):
                    envs.step(wrong)
            with pytest.raises(ActionError, match="would be truncated"):
                envs.step(np.array([0.0, 1.0, 1.0]))
        finally:
            envs.close()


def test_pendulum_actions_of_another_shape_are_refused(backend: str) -> None:
    """Pendulum (Box (1,)), N = 3: (1, 3) and the flat (3,) are refused (before: reshaped)."""
    with gym_server("Pendulum-v1", unique_url(backend), num_envs=N).start() as server:
        envs = RemoteVectorEnv(server.bound_url)
        try:
            envs.reset(seed=0)
            for wrong in (np.zeros((1, 3), np.float32), [0.5, 1.0, -1.0]):
                with pytest.raises(ActionError, match=r"an array of shape \(3, 1\)"):
                    envs.step(wrong)
            envs.step(np.zeros((3, 1), np.float32))
        finally:
            envs.close()


@pytest.mark.parametrize("given", [1.7, np.float64(0.9), 0.2, "1", np.array([1]), [[1]]])
def test_one_env_discrete_takes_integers_only(backend: str, given: Any) -> None:
    """RemoteEnv on CartPole: floats and strings (before: truncated, 0.2 -> 0) and a batch
    (before: a raw TypeError) are ActionErrors naming Discrete(2). (True stays accepted as 1:
    the client's rule takes bools into an integer field, as gymnasium's Discrete does.)"""
    with gym_server("CartPole-v1", unique_url(backend), num_envs=1).start() as server:
        env = RemoteEnv(server.bound_url)
        try:
            env.reset(seed=0)
            with pytest.raises(ActionError, match=r"Discrete\(2\)"):
                env.step(given)
        finally:
            env.close()


def test_correct_actions_match_sync_vector_env_and_refusals_step_nothing(backend: str) -> None:
    """Lists, int64 / int8 arrays and numpy ints are taken; a refused action steps no env, so
    the trajectory stays SyncVectorEnv's (before: the refused ones were reshaped and stepped)."""
    rng = np.random.default_rng(3)
    steps = [rng.integers(0, 2, N) for _ in range(40)]
    with gym_server("CartPole-v1", unique_url(backend), num_envs=N).start() as server:
        remote = RemoteVectorEnv(server.bound_url)
        local = SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * N)
        try:
            np.testing.assert_array_equal(remote.reset(seed=7)[0], local.reset(seed=7)[0])
            for t, action in enumerate(steps):
                given: Any = [action.tolist(), action, action.astype(np.int8)][t % 3]
                if t % 4 == 0:
                    with pytest.raises(ActionError):
                        remote.step(action.reshape(1, N))
                got, want = remote.step(given), local.step(action)
                for k in range(4):
                    np.testing.assert_array_equal(got[k], want[k], err_msg=f"step {t} item {k}")
        finally:
            remote.close()
            local.close()


def test_one_env_correct_actions_match_gymnasium(backend: str) -> None:
    """RemoteEnv: ints and numpy ints give gymnasium's own trajectory; a refused batch of one
    steps nothing (before: a raw TypeError, and np.array([[1]]) the same)."""
    rng = np.random.default_rng(4)
    actions = [int(a) for a in rng.integers(0, 2, 20)]
    with gym_server("CartPole-v1", unique_url(backend), num_envs=1).start() as server:
        env = RemoteEnv(server.bound_url)
        ref = gymnasium.make("CartPole-v1")
        try:
            np.testing.assert_array_equal(env.reset(seed=7)[0], ref.reset(seed=7)[0])
            for t, action in enumerate(actions):
                if t % 5 == 0:
                    with pytest.raises(ActionError, match="not a batch"):
                        env.step(np.array([action]))
                given = [action, np.int64(action), np.array(action), np.uint8(action)][t % 4]
                got, want = env.step(given), ref.step(action)
                np.testing.assert_array_equal(got[0], want[0], err_msg=f"step {t}")
                assert got[1:4] == want[1:4], t
                if got[2] or got[3]:
                    break
        finally:
            env.close()
            ref.close()


def test_a_one_env_vector_env_takes_a_batch_of_one(backend: str) -> None:
    """RemoteVectorEnv with N = 1 takes (1, *S) only; one action of shape S is refused (before:
    taken, and rewards / terminated came back with no env axis)."""
    with gym_server("CartPole-v1", unique_url(backend), num_envs=1).start() as server:
        envs = RemoteVectorEnv(server.bound_url)
        try:
            envs.reset(seed=0)
            for wrong in (1, np.int64(1), np.array(1)):
                with pytest.raises(ActionError, match=r"one action per env: an array of shape"):
                    envs.step(wrong)
            obs, rewards, terminated, truncated, _ = envs.step(np.array([1]))
            assert obs.shape == (1, 4)
            assert rewards.shape == terminated.shape == truncated.shape == (1,)
        finally:
            envs.close()


def test_a_discrete_action_with_a_start_is_one_integer(backend: str) -> None:
    """Discrete(4, start=3) travels as an i32[1] field: RemoteEnv takes one int (the env gets
    it), refuses a batch of one and floats; RemoteVectorEnv takes (N,) ints."""
    with gym_server(echo_discrete_start, unique_url(backend), num_envs=1).start() as server:
        env = RemoteEnv(server.bound_url)
        try:
            assert env.action_space == spaces.Discrete(4, start=3)
            env.reset(seed=0)
            assert env.step(4)[0].tolist() == [4.0]
            assert env.step(np.int64(6))[0].tolist() == [6.0]
            for wrong in (np.array([4]), [[4]], 4.5):
                with pytest.raises(ActionError):
                    env.step(wrong)
        finally:
            env.close()
    with gym_server(echo_discrete_start, unique_url(backend), num_envs=N).start() as server:
        envs = RemoteVectorEnv(server.bound_url)
        try:
            envs.reset(seed=0)
            assert envs.step(np.array([3, 4, 6]))[0].tolist() == [[3.0], [4.0], [6.0]]
            assert envs.step([5, 5, 3])[0].tolist() == [[5.0], [5.0], [3.0]]
            with pytest.raises(ActionError):
                envs.step(np.array([3, 4]))
        finally:
            envs.close()
        batches = RemoteAsyncVectorEnv(server.bound_url, batch_size=N)
        try:  # send takes the same (K,) ints (before: an ActionError asking for (K, 1))
            batches.async_reset(seed=0)
            batches.recv()
            batches.send(np.array([6, 3, 4]), np.array([2, 0, 1]))
            obs, *_, infos = batches.recv()
            got = dict(zip(infos["env_id"].tolist(), obs.tolist(), strict=True))
            assert got == {0: [3.0], 1: [4.0], 2: [6.0]}
        finally:
            batches.close()


def test_reset_options_are_refused_with_what_to_do(backend: str) -> None:
    """options=None and {} are fine (SB3 and wrappers pass them); any option is an AdapterError
    that says the server does not get them and where to set the envs up (before: ignored)."""
    with gym_server("Pendulum-v1", unique_url(backend), num_envs=N).start() as server:
        envs = RemoteVectorEnv(server.bound_url)
        try:
            envs.reset(seed=1, options=None)
            envs.reset(seed=1, options={})
            with pytest.raises(AdapterError, match="not carried to the server") as got:
                envs.reset(seed=1, options={"x_init": 0.01})
            assert "--gym-kwargs" in str(got.value) and "options=None" in str(got.value)
        finally:
            envs.close()
    with gym_server("Pendulum-v1", unique_url(backend), num_envs=1).start() as server:
        env = RemoteEnv(server.bound_url)
        try:
            env.reset(seed=1, options=None)
            env.reset(options={})
            with pytest.raises(AdapterError, match=r"RemoteEnv\.reset.*not carried to the server"):
                env.reset(seed=1, options={"y_init": 0.5})
        finally:
            env.close()


def test_render_without_a_render_mode_tells_a_gym_user_the_flag(backend: str) -> None:
    """A --gym server started without render_mode: render() says to start it with
    --gym-kwargs '{"render_mode": "rgb_array"}' (before: only the hand-written env's info()
    advice). CartPole's schema says it was derived from gymnasium spaces: that advice alone;
    Pendulum's plain schema cannot say so: both."""
    with gym_server("CartPole-v1", unique_url(backend), num_envs=2).start() as server:
        envs = RemoteVectorEnv(server.bound_url, render_mode="rgb_array")
        try:
            envs.reset(seed=0)
            with pytest.raises(AdapterError, match="no 'frame'") as got:
                envs.render()
            text = str(got.value)
            assert """--gym-kwargs '{"render_mode": "rgb_array"}'""" in text
            assert "frame_shape" not in text  # the hand-written env's advice is not for it
        finally:
            envs.close()
    with gym_server("Pendulum-v1", unique_url(backend), num_envs=1).start() as server:
        env = RemoteEnv(server.bound_url, render_mode="rgb_array")
        try:
            env.reset(seed=0)
            with pytest.raises(AdapterError, match="no 'frame'") as got:
                env.render()
            text = str(got.value)
            assert """--gym-kwargs '{"render_mode": "rgb_array"}'""" in text
            assert "frame_shape" in text
        finally:
            env.close()
