"""render() of real envs nobody here wrote (issue 23 item 3): MuJoCo's 480x480x3 frame from a
worker process over shm, Atari's 210x160x3 frame over unix, each equal to the frames gymnasium's
SyncVectorEnv renders in this process after the same seeds and actions."""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; before mujoco is imported

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from transport.gym_serve import gym_server

from .servers import unique_url

gymnasium = pytest.importorskip("gymnasium")
from transport.gym import RemoteVectorEnv  # noqa: E402

SEED = 3
STEPS = 5


def _renders(make: Callable[[], Any]) -> None:
    """Skip (with the reason) where this machine cannot render the env at all."""
    try:
        env = make()
        env.reset(seed=0)
        env.render()
        env.close()
    except Exception as exc:  # no EGL, no ROM, no package: not this test's subject
        pytest.skip(f"the env cannot render here: {type(exc).__name__}: {exc}")


def _reference_frames(make: Callable[[], Any], actions: list[np.ndarray], n: int) -> list[Any]:
    """gymnasium's SyncVectorEnv on the same seeds and actions (a lone MuJoCo env made after
    others in a process can render a slightly different first frame: the vector env is the
    reference the issue names)."""
    envs = gymnasium.vector.SyncVectorEnv([make] * n)
    try:
        envs.reset(seed=SEED)
        for action in actions:
            envs.step(action)
        return list(envs.render())
    finally:
        envs.close()


def _served_frames(url: str, actions: list[np.ndarray]) -> list[Any]:
    envs = RemoteVectorEnv(url, render_mode="rgb_array")
    try:
        envs.reset(seed=SEED)
        for action in actions:
            envs.step(action)
        frames = envs.render()
        assert frames is not None
        return list(frames)
    finally:
        envs.close()


@pytest.mark.parametrize(
    ("env_id", "backend", "workers", "shape"),
    [
        pytest.param("InvertedPendulum-v5", "shm", 1, (480, 480, 3), id="mujoco-shm-workers"),
        pytest.param("ALE/Pong-v5", "unix", 0, (210, 160, 3), id="atari-unix"),
    ],
)
def test_a_served_real_env_renders_its_own_frame(
    env_id: str, backend: str, workers: int, shape: tuple[int, ...]
) -> None:
    kwargs = {"render_mode": "rgb_array"}
    if env_id.startswith("ALE/"):
        ale_py = pytest.importorskip("ale_py")
        gymnasium.register_envs(ale_py)
        kwargs["repeat_action_probability"] = 0.0  # type: ignore[assignment]
    else:
        pytest.importorskip("mujoco")

    def make() -> Any:
        return gymnasium.make(env_id, **kwargs)

    _renders(make)
    n = 2
    space = make().action_space
    space.seed(SEED)
    actions = [np.stack([space.sample() for _ in range(n)]) for _ in range(STEPS)]
    server = gym_server(env_id, unique_url(backend), num_envs=n, workers=workers, gym_kwargs=kwargs)
    with server.start():
        got = _served_frames(server.bound_url, actions)
    want = _reference_frames(make, actions, n)
    for frame, reference in zip(got, want, strict=True):
        assert frame.shape == shape and frame.dtype == np.uint8
        np.testing.assert_array_equal(frame, reference)
