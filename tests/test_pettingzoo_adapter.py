"""The PettingZoo AEC adapter against the mahjong server (seed 003), and the mahjong rules."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("pettingzoo")

from pettingzoo.test import api_test

from transport.api import Server
from transport.envs.mahjong import (
    A_PASS,
    A_PUNG,
    A_WIN,
    MahjongEnv,
    chow_action,
    chow_of,
    is_winning,
)
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


@pytest.fixture(
    scope="module",
    params=[
        (scheme, lang)
        for lang in ("python", "node")
        for scheme in ("unix", "http", "zmq+ipc", "zmq+tcp", "shm")
    ],
    ids=lambda param: "-".join(param),
)
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    scheme, lang = request.param
    with ServerProcess(unique_url(scheme), env="mahjong", lang=lang) as server:
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
        assert seen[0] == "player_0"  # East acts first; then discards, claims and draws
        assert 0 < turns <= 84 * 4  # at most 84 discards, each offered to up to 3 claimers
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


def greedy(mask: np.ndarray, observation: np.ndarray) -> int:
    """Win when it can, claim what it can, else discard its least connected tile."""
    if mask[A_WIN]:
        return A_WIN
    if mask[A_PASS]:
        claims = [a for a in np.flatnonzero(mask) if a != A_PASS]
        return int(claims[0]) if claims else A_PASS
    hand = np.rint(observation[:34] * 4).astype(int)

    def connected(kind: int) -> int:
        score = int(hand[kind]) * 3
        if kind < 27:
            for d in (-2, -1, 1, 2):
                if 0 <= kind % 9 + d <= 8:
                    score += int(hand[kind + d]) * (2 if abs(d) == 1 else 1)
        return score

    return min((int(a) for a in np.flatnonzero(mask[:34])), key=connected)


def play(policy: str, games: int) -> tuple[int, int]:
    """(hands won, total score change) over ``games`` seeded hands."""
    env = MahjongEnv()
    record = mahjong_env.SCHEMA["AgentStep"].zeros()
    rng = np.random.default_rng(0)
    wins = 0
    for game in range(games):
        env.reset_into(game, record)
        while not record["terminated"]:
            mask = record["action_mask"]
            if policy == "random":
                action = int(rng.choice(np.flatnonzero(mask)))
            else:
                action = greedy(mask, record["observation"])
            env.step_into(action, record)
        wins += int(record["reward"] > 0)
    assert int(env.scores.sum()) == 0  # zero-sum over every hand
    return wins, int(np.abs(env.scores).sum())


def test_wins_happen_and_score() -> None:
    """Regression (issue 14, item 4): 600 games of random or greedy play never won (no claims)."""
    random_wins, random_scores = play("random", 200)
    greedy_wins, _ = play("greedy", 200)
    assert random_wins >= 3 and random_scores > 0
    assert greedy_wins > 5 * random_wins  # a better player wins more: a game worth training on


def offer(env: MahjongEnv, record: np.ndarray, discarder: int, tile: int) -> None:
    """Make ``discarder`` the seat to act, holding ``tile``, and discard it."""
    env.current = discarder
    env.hands[discarder, tile] += 1
    env.step_into(tile, record)


def hand(*kinds: int) -> np.ndarray:
    counts = np.zeros(34, dtype=np.int64)
    for kind in kinds:
        counts[kind] += 1
    return counts


def test_a_discard_is_offered_to_the_claimers_in_priority_order() -> None:
    env = MahjongEnv()
    record = mahjong_env.SCHEMA["AgentStep"].zeros()
    env.reset_into(3, record)
    env.hands[1] = hand(1, 2, 12, 14, 16, 19, 21, 23, 25, 27, 29, 31, 33)  # chows a 0 (0-1-2)
    env.hands[2] = hand(0, 0, 9, 13, 17, 22, 24, 26, 28, 30, 31, 32, 33)  # pungs a 0
    env.hands[3] = hand(27, 27, 27, 28, 28, 28, 29, 29, 29, 9, 10, 11, 0)  # wins on a 0
    offer(env, record, 0, 0)
    order = [int(record["agent"])]
    assert record["action_mask"][A_WIN] and record["action_mask"][A_PASS]
    assert int(record["last_discard"]) == 0
    env.step_into(A_PASS, record)
    order.append(int(record["agent"]))
    assert record["action_mask"][A_PUNG] and not record["action_mask"][A_WIN]
    env.step_into(A_PASS, record)
    order.append(int(record["agent"]))
    assert record["action_mask"][chow_action(0, 0)] and not record["action_mask"][A_PUNG]
    assert order == [3, 2, 1]  # a win first, then the pung, then the next seat's chow
    env.step_into(chow_action(0, 0), record)
    assert int(record["agent"]) == 1 and int(record["last_discard"]) == -1
    assert list(np.flatnonzero(env.melded[1])) == [0, 1, 2]
    assert record["melds"][0]["kind"] == 0 and list(record["melds"][0]["tiles"][:3]) == [0, 1, 2]
    assert record["action_mask"][:34].any() and not record["action_mask"][A_PASS]  # discards


def test_a_pung_then_a_win_on_a_discard_is_zero_sum() -> None:
    env = MahjongEnv()
    record = mahjong_env.SCHEMA["AgentStep"].zeros()
    env.reset_into(4, record)
    env.hands[1] = hand(33)
    env.hands[2] = hand(5, 5, 9, 10, 11, 12, 13, 14, 20, 20, 20, 33, 30)
    env.hands[3] = hand(27, 27, 27, 28, 28, 28, 29, 29, 29, 15, 16, 17, 30)
    offer(env, record, 0, 5)
    assert int(record["agent"]) == 2 and record["action_mask"][A_PUNG]
    env.step_into(A_PUNG, record)
    assert env.melded[2, 5] == 3 and env.hands[2, 5] == 0 and int(env.hands[2].sum()) == 11
    assert int(record["agent"]) == 2 and record["action_mask"][30]
    env.step_into(30, record)  # seat 3 wins on this discard
    assert int(record["agent"]) == 3 and record["action_mask"][A_WIN]
    env.step_into(A_WIN, record)
    assert record["terminated"] and int(record["agent"]) == 3 and record["reward"] == 3.0
    assert list(env.scores) == [-1, -1, -1, 3]
    assert chow_of(chow_action(20, 2)) == (24, 2)  # sequence 20: bamboo 7-8-9, claimed the 9
