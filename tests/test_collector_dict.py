"""The episode collector keeps every field of a Dict observation, with its shape (issue 23): the
``reach`` env (schema dictbox: ``grid`` f32[2,5,5] and ``vec`` f32[4], a Box action f32[2]) over
unix and shm, Python and Node servers; every seeded episode is replayed on a local env and must
match step by step."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import transport
from transport.collector import EpisodeBatch, request_episodes
from transport.envs.rich_spaces import ReachEnv

from .servers import LANGS, ServerProcess, unique_url

MAX_LEN = 12
BATCH = 5
SEED = 17


def towards_goal(obs: Any, env_ids: np.ndarray) -> np.ndarray:
    """Half a step towards the goal (float32, shape (M, 2)); the policy sees every field."""
    assert isinstance(obs, dict) and list(obs) == ["grid", "vec"], obs
    assert obs["grid"].shape == (len(env_ids), 2, 5, 5) and obs["vec"].shape == (len(env_ids), 4)
    vec = obs["vec"]
    move = np.clip((vec[:, 2:] - vec[:, :2]) * 4 * 0.5, -1, 1) + 0.1 * (env_ids[:, None] - 0.5)
    return np.clip(move, -1, 1).astype(np.float32)


def check_dict_batch(batch: EpisodeBatch) -> None:
    """Shapes of every field, and each seeded episode replayed on a local ReachEnv."""
    k = int(batch.lengths.max())
    obs, finals = batch.observations, batch.final_observations
    assert isinstance(obs, dict) and list(obs) == ["grid", "vec"]
    assert isinstance(finals, dict) and list(finals) == ["grid", "vec"]
    assert obs["grid"].shape == (BATCH, k, 2, 5, 5) and obs["vec"].shape == (BATCH, k, 4)
    assert obs["grid"].dtype == obs["vec"].dtype == np.float32
    assert finals["grid"].shape == (BATCH, 2, 5, 5) and finals["vec"].shape == (BATCH, 4)
    assert batch.actions.shape == (BATCH, k, 2) and batch.actions.dtype == np.float32
    assert batch.mask.shape == batch.rewards.shape == (BATCH, k)
    replayed = 0
    for row, length in enumerate(batch.lengths.tolist()):
        for name in ("grid", "vec"):
            assert not obs[name][row, length:].any(), f"{name}: padding not zero"
        seed = int(batch.seeds[row])
        if seed < 0:
            continue  # the env's own auto-reset stream: not replayable from a seed
        replayed += 1
        env = ReachEnv()
        result = env.reset(seed)
        for t in range(length):
            for name in ("grid", "vec"):
                np.testing.assert_array_equal(obs[name][row, t], result[name], err_msg=name)
            result = env.step(batch.actions[row, t])
            assert batch.rewards[row, t] == result["reward"]
        for name in ("grid", "vec"):
            np.testing.assert_array_equal(finals[name][row], result[name], err_msg=name)
        assert batch.terminated[row, length - 1] == result["terminated"]
        if not result["terminated"]:
            assert batch.truncated[row, length - 1]
    assert replayed >= 2


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("scheme", ["unix", "shm"])
def test_every_dict_observation_field_is_kept(scheme: str, lang: str) -> None:
    # a 2-env server (the first two jobs seeded) and a 1-env one (every job seeded: seed + job)
    with ServerProcess(unique_url(scheme), env="reach", num_envs=2, lang=lang) as server:
        with transport.connect(server.url, autoreset="next_step") as client:
            batch = request_episodes(client, BATCH, towards_goal, MAX_LEN, seed=SEED)
        check_dict_batch(batch)
        assert batch.seeds[:2].tolist() == [SEED, SEED + 1]
    with ServerProcess(unique_url(scheme), env="reach", num_envs=1, lang=lang) as server:
        with transport.connect(server.url, autoreset="next_step") as client:
            alone = request_episodes(client, BATCH, towards_goal, MAX_LEN, seed=SEED)
        check_dict_batch(alone)
        assert alone.seeds.tolist() == [SEED + j for j in range(BATCH)]
    # the same seed, another language or backend: the same bytes (every field's)
    with ServerProcess(unique_url("unix"), env="reach", num_envs=1) as server:
        with transport.connect(server.url, autoreset="next_step") as client:
            again = request_episodes(client, BATCH, towards_goal, MAX_LEN, seed=SEED)
    assert again.tobytes() == alone.tobytes()


def test_dict_observations_over_a_multi_client() -> None:
    """connect_many over two 1-env reach servers (Python over unix, Node over shm): every job is
    seeded (seed + job) and replays on a local env, every field kept."""
    with (
        ServerProcess(unique_url("unix"), env="reach") as one,
        ServerProcess(unique_url("shm"), env="reach", lang="node") as two,
        transport.connect_many([one.url, two.url], autoreset="next_step") as multi,
    ):
        batch = request_episodes(multi, BATCH, towards_goal, MAX_LEN, seed=SEED)
    check_dict_batch(batch)
    assert batch.seeds.tolist() == [SEED + j for j in batch.job_ids.tolist()]
