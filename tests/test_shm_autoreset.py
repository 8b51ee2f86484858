"""Auto-reset over shm:// (Python server): the same semantics as tests/test_autoreset.py, the
final results in the region's final areas, env errors named and recovered, the adapters."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

import transport.api as api
from transport.backends.shm import ShmChannel
from transport.errors import EnvError
from transport.protocol import AutoReset

from .servers import ServerProcess
from .test_env_errors import POISON, FlakyEnv

NUM_ENVS = 4


def shm_url(num_envs: int = NUM_ENVS) -> str:
    return f"shm://test-ar-{uuid.uuid4().hex[:12]}?num_envs={num_envs}"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with ServerProcess(shm_url(), env="pac", num_envs=NUM_ENVS) as server:
        yield server.url


def legal(result: object, rng: random.Random) -> list[int]:
    masks = result.action_mask  # type: ignore[attr-defined]
    return [rng.choice(np.flatnonzero(masks[i]).tolist()) for i in range(NUM_ENVS)]


def test_same_step_returns_the_reset_and_the_final_result(url: str) -> None:
    with api.connect(url, timeout=10, autoreset="same_step") as client:
        assert isinstance(client.channel, ShmChannel)
        assert client.server_info["autoreset"] == "same_step"
        result, rng = client.reset(seed=7), random.Random(7)
        ended = 0
        for _ in range(600):
            result = client.step(legal(result, rng))
            for index, final in client.finals:
                ended += 1
                assert final.done == 1
                assert result.done[index] == 0  # already reset: a fresh episode
                assert not np.shares_memory(final.observation, result.observation)
                # zero copy: the final result is a view of the region's final area
                assert final.observation.base is not None and not final.observation.flags.owndata
            assert not result.done.any()
        assert ended >= NUM_ENVS


def fields(view: object) -> bytes:
    """Every field's bytes (the shm record dtype has the slot's offsets, so not .tobytes())."""
    return b"".join(np.ascontiguousarray(view[name]).tobytes() for name in view)  # type: ignore[index, attr-defined]


def trace(url: str, mode: str, steps: int = 300) -> list[bytes]:
    """Result bytes and finals of a seeded random walk (for comparing backends)."""
    out: list[bytes] = []
    with api.connect(url, timeout=10, autoreset=mode) as client:
        result, rng = client.reset(seed=11), random.Random(11)
        out.append(fields(result))
        for _ in range(steps):
            result = client.step(legal(result, rng))
            out.append(fields(result))
            out += [bytes([i]) + fields(final) for i, final in client.finals]
    return out


def test_the_mode_belongs_to_the_session(url: str) -> None:
    with api.connect(url, timeout=10, autoreset="same_step") as client:
        client.reset(seed=1)
    with api.connect(url, timeout=10) as client:  # a new lease: disabled again
        assert client.autoreset == AutoReset.DISABLED
        assert client.server_info["autoreset"] == "disabled"


def test_single_env_same_step() -> None:
    with (
        ServerProcess(shm_url(1), env="pac", num_envs=1) as server,
        api.connect(server.url, timeout=10, autoreset="same_step") as client,
    ):
        result, rng, ended = client.reset(seed=2), random.Random(2), 0
        for _ in range(400):
            action = rng.choice(np.flatnonzero(result.action_mask).tolist())
            result = client.step(action)
            ended += len(client.finals)
            for index, final in client.finals:
                assert index == 0 and final.done == 1 and result.done == 0
        assert ended >= 1


# -- env errors -------------------------------------------------------------------------------


@pytest.fixture
def flaky_url() -> Iterator[str]:
    FlakyEnv.broken_resets = 0
    with api.Server(FlakyEnv, shm_url(), num_envs=NUM_ENVS).start() as server:
        yield server.url


def test_env_whose_reset_fails_is_recreated(flaky_url: str) -> None:
    with api.connect(flaky_url, timeout=10) as client:
        client.reset()
        FlakyEnv.broken_resets = 1
        with pytest.raises(EnvError) as info:
            client.step([1, POISON, 1, 1])
        assert info.value.env_id == 1 and "(the env was recreated)" in info.value.text
        client.step([1, 1, 1, 1])


# -- the adapters over shm ------------------------------------------------------------------


def test_gym_vector_env_over_shm(url: str) -> None:
    from gymnasium.vector import AutoresetMode

    from transport.gym import RemoteVectorEnv

    for mode in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP):
        env = RemoteVectorEnv(url, NUM_ENVS, autoreset_mode=mode)
        try:
            env.reset(seed=4)
            rng, finals = np.random.default_rng(4), 0
            for _ in range(300):
                masks = env.action_masks()
                actions = np.array([rng.choice(np.flatnonzero(m)) for m in masks])
                _, _, terminated, _, infos = env.step(actions)
                if mode == AutoresetMode.SAME_STEP and "final_obs" in infos:
                    finals += int(infos["_final_obs"].sum())
                    assert (terminated[infos["_final_obs"]]).all()
            assert mode == AutoresetMode.NEXT_STEP or finals >= 1
        finally:
            env.close()


def test_sb3_vec_env_over_shm(url: str) -> None:
    from transport.sb3 import RemoteVecEnv

    env = RemoteVecEnv(url, NUM_ENVS)
    try:
        env.seed(9)
        env.reset()
        rng, ended = np.random.default_rng(9), 0
        for _ in range(300):
            actions = np.array([rng.choice(np.flatnonzero(m)) for m in env.action_masks()])
            env.step_async(actions)
            _, _, dones, infos = env.step_wait()
            for i in np.flatnonzero(dones):
                ended += 1
                assert infos[i]["terminal_observation"].shape == (612,)
        assert ended >= 1
    finally:
        env.close()
