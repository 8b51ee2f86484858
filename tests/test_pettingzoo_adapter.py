"""The PettingZoo AEC adapter against the mahjong server (seed 003), and the mahjong rules."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("pettingzoo")

from pettingzoo.test import api_test

from transport.api import Server
from transport.envs.mahjong import A_WIN, MahjongEnv, is_winning
from transport.generated import mahjong_env
from transport.pettingzoo import RemoteAECEnv

from .servers import ServerProcess, unique_url

WINNING = (0, 1, 2, 3, 4, 5, 6, 7, 8, 27, 27, 27, 33, 33)


class RiggedMahjong(MahjongEnv):
    """East is dealt a winning hand."""

    def _deal(self, seed: int | None) -> None:
        super()._deal(seed)
        self.hands[0] = 0
        for kind in WINNING:
            self.hands[0, kind] += 1


@pytest.fixture(scope="module", params=["unix", "http", "zmq+ipc", "zmq+tcp", "shm"])
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    with ServerProcess(unique_url(request.param), env="mahjong") as server:
        yield server.url


def test_api_test(url: str) -> None:
    env = RemoteAECEnv(url)
    try:
        assert env.possible_agents == ["player_0", "player_1", "player_2", "player_3"]
        space = env.observation_space("player_0")
        assert space["observation"].shape == (290,) and space["action_mask"].shape == (104,)
        assert float(space["observation"].high[0]) == 1.0  # the mahjong env's known bounds
        api_test(env, num_cycles=150)
    finally:
        env.close()


def test_a_whole_game(url: str) -> None:
    env = RemoteAECEnv(url)
    try:
        env.reset(seed=42)
        assert env.agent_selection == "player_0"
        rng = np.random.default_rng(0)
        seen, turns = [], 0
        for agent in env.agent_iter(2000):
            observation, _reward, terminated, truncated, _info = env.last()
            if terminated or truncated:
                env.step(None)
                continue
            seen.append(agent)
            mask = observation["action_mask"]
            assert mask.any() and mask.dtype == np.int8
            action = A_WIN if mask[A_WIN] else int(rng.choice(np.flatnonzero(mask)))
            env.step(action)
            turns += 1
        assert env.agents == []  # every agent was terminated and stepped out
        assert seen[:5] == ["player_0", "player_1", "player_2", "player_3", "player_0"]
        assert 0 < turns <= 84
    finally:
        env.close()


def test_winning_hands() -> None:
    counts = np.zeros(34, dtype=np.int64)
    for kind in (0, 1, 2, 9, 10, 11, 27, 27, 27, 20, 20, 20, 33, 33):  # 3 chows... + pair
        counts[kind] += 1
    assert is_winning(counts)
    counts[33] -= 1
    counts[32] += 1
    assert not is_winning(counts)
    honours = np.zeros(34, dtype=np.int64)
    honours[[7, 8, 9]] = 1  # 8-9 of characters and 1 of dots are no chow
    honours[[27, 28, 29]] = 3
    honours[30] = 2
    assert not is_winning(honours)


def test_a_win_is_zero_sum() -> None:
    env = MahjongEnv()
    record = mahjong_env.SCHEMA["AgentStep"].zeros()
    env.reset_into(1, record)
    env.hands[0] = 0
    for kind in WINNING:
        env.hands[0, kind] += 1
    env.step_into(A_WIN, record)
    assert record["terminated"] and record["agent"] == 0 and record["reward"] == 3.0
    assert list(env.scores) == [3, -1, -1, -1]
    assert not record["action_mask"].any()


def test_same_seed_same_game() -> None:
    a, b = MahjongEnv(), MahjongEnv()
    ra, rb = a.reset(7), b.reset(7)
    assert ra.tobytes() == rb.tobytes()
    for action in np.flatnonzero(ra["action_mask"])[:1]:
        assert a.step(int(action)).tobytes() == b.step(int(action)).tobytes()


def test_the_adapter_pays_a_win_zero_sum() -> None:
    url = unique_url("unix")
    with Server(RiggedMahjong, url, schema=mahjong_env.SCHEMA).start():
        env = RemoteAECEnv(url)
        try:
            env.reset(seed=0)
            observation, *_ = env.last()
            assert observation["action_mask"][A_WIN] == 1
            env.step(A_WIN)
            assert all(env.terminations.values())
            assert env.rewards == {
                "player_0": 3.0,
                "player_1": -1.0,
                "player_2": -1.0,
                "player_3": -1.0,
            }
            order = []
            while env.agents:
                agent = env.agent_selection
                _, reward, terminated, _, _ = env.last()
                assert terminated
                order.append((agent, reward))
                env.step(None)
            assert dict(order) == {
                "player_0": 3.0,
                "player_1": -1.0,
                "player_2": -1.0,
                "player_3": -1.0,
            }
        finally:
            env.close()
