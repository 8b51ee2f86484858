"""Gymnasium adapters against real server processes: RemoteEnv and RemoteVectorEnv."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("gymnasium")

from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode

from transport.errors import AdapterError
from transport.gym import RemoteEnv, RemoteVectorEnv

from .servers import ServerProcess, unique_url

NUM_ENVS = 4


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with ServerProcess(unique_url("unix"), env="echo") as server:
        yield server.url


def backend_url(backend: str) -> str:
    return unique_url("zmq+ipc" if backend == "zmq" else backend)


@pytest.fixture(scope="module", params=["unix", "http", "zmq"])
def pac_url(request: pytest.FixtureRequest) -> Iterator[str]:
    with ServerProcess(backend_url(request.param), env="pac", num_envs=NUM_ENVS) as server:
        yield server.url


def test_remote_env_passes_check_env(echo_url: str) -> None:
    env = RemoteEnv(echo_url)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env, skip_render_check=True)
        # the only complaints allowed: unbounded observations (echo's are unbounded)
        assert all("infinity" in str(w.message) for w in caught), [str(w.message) for w in caught]
        obs, info = env.reset(seed=1)
        assert obs.dtype == np.float32 and obs.shape == (612,)
        assert env.action_masks().shape == (92,) and env.action_masks().all()
        obs2, reward, terminated, truncated, info = env.step(3)
        assert obs2[0] == 3 and reward == 0.75 and terminated is False and truncated is False
        assert not np.shares_memory(obs, obs2)  # copies, not views of the receive buffer
        assert set(info) >= {"life", "rank", "money"}
    finally:
        env.close()


def test_remote_env_uses_the_url_from_the_environment(
    echo_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRANSPORT_URL", echo_url)
    env = RemoteEnv()
    try:
        assert env.observation_space.shape == (612,)
    finally:
        env.close()
    monkeypatch.delenv("TRANSPORT_URL")
    with pytest.raises(AdapterError, match="TRANSPORT_URL"):
        RemoteEnv()


def legal_actions(masks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.array([rng.choice(np.flatnonzero(row)) for row in masks])


def test_vector_env_next_step(pac_url: str) -> None:
    env = RemoteVectorEnv(pac_url, NUM_ENVS)
    try:
        assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
        obs, infos = env.reset(seed=5)
        assert obs.shape == (NUM_ENVS, 612)
        rng = np.random.default_rng(5)
        done = np.zeros(NUM_ENVS, dtype=bool)
        ended = 0
        reference = {k: (v.dtype, v.shape) for k, v in infos.items()}
        for _ in range(600):
            obs, rewards, terminated, truncated, infos = env.step(
                legal_actions(env.action_masks(), rng)
            )
            assert {k: (v.dtype, v.shape) for k, v in infos.items()} == reference
            for i in np.flatnonzero(done):  # the step after the end: the reset result
                ended += 1
                assert not terminated[i] and not truncated[i] and rewards[i] == 0.0
            done = terminated | truncated
        assert ended >= NUM_ENVS
    finally:
        env.close()


def test_vector_env_same_step(pac_url: str) -> None:
    env = RemoteVectorEnv(pac_url, autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        assert env.num_envs == NUM_ENVS  # taken from the server
        assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        _, infos = env.reset(seed=7)
        info_keys = set(infos)
        rng = np.random.default_rng(7)
        ended = 0
        for _ in range(600):
            obs, _rewards, terminated, truncated, infos = env.step(
                legal_actions(env.action_masks(), rng)
            )
            done = terminated | truncated
            if not done.any():
                assert set(infos) == info_keys  # optional keys omitted, never None
                continue
            assert set(infos) == info_keys | {
                "final_obs",
                "_final_obs",
                "final_info",
                "_final_info",
            }
            assert (infos["_final_obs"] == done).all()
            for i in np.flatnonzero(done):
                ended += 1
                assert not np.array_equal(infos["final_obs"][i], obs[i])  # obs: the reset
                assert infos["final_info"]["_life"][i]
            # gymnasium's format: an object array, the final observation or None per env
            assert infos["final_obs"].dtype == object
            finals = infos["final_obs"]
            assert all((o is None) == (not d) for o, d in zip(finals, done, strict=True))
            assert all(o.dtype == np.float32 for o in infos["final_obs"] if o is not None)
        assert ended >= NUM_ENVS
    finally:
        env.close()


def test_vector_env_checks_num_envs_and_mode(pac_url: str) -> None:
    with pytest.raises(AdapterError, match=f"serves {NUM_ENVS} env"):
        RemoteVectorEnv(pac_url, NUM_ENVS + 1)
    with pytest.raises(AdapterError, match="NEXT_STEP or SAME_STEP"):
        RemoteVectorEnv(pac_url, NUM_ENVS, autoreset_mode=AutoresetMode.DISABLED)
    with pytest.raises(AdapterError, match="unknown auto-reset mode 'sometimes'"):
        RemoteVectorEnv(pac_url, NUM_ENVS, autoreset_mode="sometimes")


@pytest.mark.parametrize("name", ["next_step", "NextStep", "same_step", "SAME_STEP"])
def test_vector_env_mode_by_name(pac_url: str, name: str) -> None:
    expected = (
        AutoresetMode.NEXT_STEP if name.lower().startswith("next") else AutoresetMode.SAME_STEP
    )
    env = RemoteVectorEnv(pac_url, NUM_ENVS, autoreset_mode=name)
    try:
        assert env.metadata["autoreset_mode"] == expected
        assert env.client.server_info["autoreset"] == expected.name.lower()
    finally:
        env.close()


def test_vector_env_num_envs_from_the_environment(
    pac_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRANSPORT_NUM_ENVS", str(NUM_ENVS + 2))
    with pytest.raises(AdapterError, match="--num-envs"):
        RemoteVectorEnv(pac_url)


def test_remote_env_on_a_vector_server_points_to_the_vector_adapters(pac_url: str) -> None:
    with pytest.raises(AdapterError) as caught:
        RemoteEnv(pac_url)
    text = str(caught.value)
    assert pac_url in text and f"serves {NUM_ENVS} envs" in text
    assert "RemoteVectorEnv" in text and "RemoteVecEnv" in text
    assert "num_envs=1" in text and "pass num_envs" not in text  # RemoteEnv takes no num_envs


def test_vector_env_drives_a_given_client(pac_url: str) -> None:
    import transport

    client = transport.connect(pac_url, autoreset="next_step")
    with pytest.raises(AdapterError, match="needs 'same_step'"):
        RemoteVectorEnv(client=client, autoreset_mode=AutoresetMode.SAME_STEP)
    env = RemoteVectorEnv(client=client)  # next_step, the default
    try:
        obs, _ = env.reset(seed=3)
        assert obs.shape == (NUM_ENVS, 612) and env.client is client
    finally:
        env.close()
