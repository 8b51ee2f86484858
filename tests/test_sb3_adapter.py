"""The SB3 VecEnv adapter against a real server process: API, terminal_observation, MaskablePPO."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")

from sb3_contrib import MaskablePPO
from sb3_contrib.common.maskable.utils import get_action_masks, is_masking_supported
from stable_baselines3.common.vec_env import VecCheckNan, VecEnv, VecMonitor

from transport.errors import AdapterError
from transport.sb3 import RemoteVecEnv

from .servers import ServerProcess, unique_url

NUM_ENVS = 4


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with ServerProcess(unique_url("unix"), env="pac", num_envs=NUM_ENVS) as server:
        yield server.url


@pytest.fixture
def venv(url: str) -> Iterator[RemoteVecEnv]:
    env = RemoteVecEnv(url, NUM_ENVS)
    yield env
    env.close()


def test_vec_env_api(venv: RemoteVecEnv) -> None:
    assert isinstance(venv, VecEnv) and venv.num_envs == NUM_ENVS
    assert venv.observation_space.shape == (612,)
    venv.seed(11)
    first = venv.reset()
    venv.seed(11)
    assert np.array_equal(first, venv.reset())  # seeded resets are deterministic
    assert first.shape == (NUM_ENVS, 612) and first.dtype == np.float32
    assert len(venv.reset_infos) == NUM_ENVS and "life" in venv.reset_infos[0]
    assert is_masking_supported(venv)
    masks = get_action_masks(venv)
    assert masks.shape == (NUM_ENVS, 92) and masks.dtype == bool
    assert np.array_equal(masks, venv.action_masks())
    assert venv.env_is_wrapped(VecMonitor) == [False] * NUM_ENVS
    assert venv.get_attr("render_mode") == [None] * NUM_ENVS
    venv.set_attr("difficulty", 3, indices=[1])
    assert venv.get_attr("difficulty") == [None, 3, None, None]
    assert venv.has_attr("difficulty") and not venv.has_attr("no_such_thing")
    venv.step_async(np.zeros(NUM_ENVS, dtype=np.int64))  # action 0 (end turn) is always legal
    obs, rewards, dones, infos = venv.step_wait()
    assert obs.shape == (NUM_ENVS, 612) and rewards.shape == dones.shape == (NUM_ENVS,)
    assert len(infos) == NUM_ENVS and all(isinstance(info, dict) for info in infos)


def test_terminal_observation(venv: RemoteVecEnv) -> None:
    venv.seed(3)
    venv.reset()
    rng = np.random.default_rng(3)
    ended = 0
    for _ in range(800):
        masks = venv.action_masks()
        actions = np.array([rng.choice(np.flatnonzero(row)) for row in masks])
        obs, _rewards, dones, infos = venv.step(actions)
        for i in range(NUM_ENVS):
            if dones[i]:
                ended += 1
                final = infos[i]["terminal_observation"]
                assert final.shape == (612,) and final.dtype == np.float32
                assert not np.array_equal(final, obs[i])  # obs[i] is the next episode's start
                assert isinstance(infos[i]["TimeLimit.truncated"], bool)
            else:
                assert "terminal_observation" not in infos[i]
    assert ended >= NUM_ENVS


def test_maskable_ppo_learns(venv: RemoteVecEnv) -> None:
    checked = VecCheckNan(VecMonitor(venv), raise_exception=True)
    model = MaskablePPO(
        "MlpPolicy", checked, n_steps=64, batch_size=64, n_epochs=2, seed=0, device="cpu"
    )
    model.learn(total_timesteps=512)
    assert model.num_timesteps >= 512


def test_num_envs_must_match(url: str) -> None:
    with pytest.raises(AdapterError, match="--num-envs 2"):
        RemoteVecEnv(url, 2)
