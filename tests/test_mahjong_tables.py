"""Many mahjong tables on one connection (issue 14 item 4, seed 003): ``RemoteAECTables``.

Real servers (``transport-serve URL --env mahjong --num-envs 8``, Python and Node) over unix,
zmq+ipc, shm and http. Each table must play exactly the game a local ``MahjongEnv`` plays with
the same seed and actions, across its auto-resets, and pay each seat what the game's scores
say; the Node twin (node_bridge/src/envs/mahjong.ts) must give the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("pettingzoo")

import transport.api as api
from transport.api import Server
from transport.envs.mahjong import A_WIN, MahjongEnv
from transport.errors import AdapterError, RemoteError, TransportError
from transport.generated import mahjong_env, pac_env
from transport.pettingzoo import RemoteAECEnv, RemoteAECTables, TablesStep

from .servers import ServerProcess, unique_url
from .test_pettingzoo_adapter import RiggedMahjong

TABLES = 8


@pytest.fixture(
    scope="module",
    params=[
        ("unix", "python"),
        ("shm", "python"),
        ("http", "python"),
        ("unix", "node"),
        ("shm", "node"),
        ("zmq+ipc", "node"),
    ],  # both languages over a socket backend and shm, every scheme once
    ids=lambda param: "-".join(param),
)
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    scheme, lang = request.param
    with ServerProcess(unique_url(scheme), env="mahjong", num_envs=TABLES, lang=lang) as server:
        yield server.url


def random_actions(step: TablesStep, rng: np.random.Generator) -> list[int]:
    """A legal action per table, taking a win when one is offered."""
    return [
        A_WIN if mask[A_WIN] else int(rng.choice(np.flatnonzero(mask))) for mask in step.action_mask
    ]


def test_eight_tables_play_the_local_games_and_restart_alone(url: str) -> None:
    """Every table plays the local game of its seed (seed + i), restarts on its own when its
    game ends (the others go on), and pays each seat its change of score."""
    local = [MahjongEnv() for _ in range(TABLES)]
    records = [mahjong_env.SCHEMA["AgentStep"].zeros() for _ in range(TABLES)]
    with RemoteAECTables(url) as tables:
        assert tables.num_tables == TABLES and tables.possible_agents[0] == "player_0"
        step = tables.reset(seed=11)
        for i, env in enumerate(local):
            env.reset_into(11 + i, records[i])
        rng = np.random.default_rng(1)
        ended_alone = 0
        games = 0
        for _ in range(300):
            for i in range(TABLES):
                assert step.agent[i] == records[i]["agent"]
                assert np.array_equal(step.observation[i], records[i]["observation"])
                assert np.array_equal(step.action_mask[i], records[i]["action_mask"])
            actions = random_actions(step, rng)
            step = tables.step(actions)
            for i, env in enumerate(local):
                before = env.scores.copy()
                env.step_into(actions[i], records[i])
                if records[i]["terminated"]:
                    assert step.terminated[i] and not step.truncated[i]
                    assert step.rewards[i].tolist() == (env.scores - before).tolist()
                    assert step.final_agent[i] == records[i]["agent"]
                    assert step.infos[i]["final_info"]["episode_id"] == env.episode
                    env.reset_into(None, records[i])  # the server's auto-reset: unseeded
                    assert step.infos[i]["turn"] == 0  # the next game, already dealt
                    games += 1
                else:
                    assert not step.terminated[i] and not step.rewards[i].any()
                    assert step.final_agent[i] == -1 and "final_info" not in step.infos[i]
            if step.terminated.any() and not step.terminated.all():
                ended_alone += 1
        assert games >= TABLES and ended_alone > 0


def test_random_play_wins_and_scores() -> None:
    """A short random-play run on 8 tables: games end in wins that pay +3 / -1 (zero-sum)."""
    with (
        ServerProcess(unique_url("unix"), env="mahjong", num_envs=TABLES) as server,
        RemoteAECTables(server.url, copy=False) as tables,
    ):
        rng = np.random.default_rng(0)
        step = tables.reset(seed=0)
        games = wins = 0
        totals = np.zeros(tables.num_seats)
        for _ in range(1000):
            step = tables.step(random_actions(step, rng))
            games += int(step.terminated.sum())
            won = step.rewards.max(axis=1) > 0
            wins += int(won.sum())
            for row in step.rewards[won]:
                assert sorted(row.tolist()) == [-1.0, -1.0, -1.0, 3.0]
            totals += step.rewards.sum(axis=0)
            assert not np.signbit(step.rewards[~won]).any()  # a draw pays 0, not -0.0
        assert games > 50 and wins > 0
        assert totals.sum() == 0.0


def test_a_win_at_some_tables_restarts_only_those() -> None:
    """East holds a winning hand at every table: the even tables win, the odd ones discard."""
    url = unique_url("unix")
    with (
        Server(RiggedMahjong, url, schema=mahjong_env.SCHEMA, num_envs=4).start(),
        RemoteAECTables(url) as tables,
    ):
        step = tables.reset(seed=3)
        assert (step.agent == 0).all() and step.action_mask[:, A_WIN].all()
        discard = int(np.flatnonzero(step.action_mask[1, :34])[0])
        step = tables.step([A_WIN, discard, A_WIN, discard])
        assert step.terminated.tolist() == [True, False, True, False]
        assert step.rewards.tolist() == [
            [3.0, -1.0, -1.0, -1.0],
            [0.0] * 4,
            [3.0, -1.0, -1.0, -1.0],
            [0.0] * 4,
        ]
        assert step.final_agent.tolist() == [0, -1, 0, -1]
        assert step.infos[0]["final_info"]["hand_value"] == 3.0
        # the winners' tables were dealt again (East to act), the others play on
        assert step.agent[0] == 0 and step.agent[2] == 0 and step.infos[0]["turn"] == 0
        assert step.infos[1]["turn"] == 1 and step.infos[3]["turn"] == 1


def test_bad_input_is_a_clear_error() -> None:
    with (
        ServerProcess(unique_url("unix"), env="mahjong", num_envs=2) as server,
        RemoteAECTables(server.url) as tables,
    ):
        step = tables.reset(seed=0)
        with pytest.raises(ValueError, match="expected 2 actions"):
            tables.step([0])
        illegal = int(np.flatnonzero(step.action_mask[0] == 0)[0])
        legal = int(np.flatnonzero(step.action_mask[1])[0])
        with pytest.raises(RemoteError, match="mask"):
            tables.step([illegal, legal])
        with pytest.raises(AdapterError, match=r"serves 2 env.*num_tables=2"):
            RemoteAECTables(server.url, num_tables=8)
        with pytest.raises(AdapterError, match="RemoteAECTables"):
            RemoteAECEnv(server.url)  # one table per connection: it names the tables wrapper


def test_a_schema_without_seats_is_refused() -> None:
    with ServerProcess(unique_url("unix"), env="echo", num_envs=2) as server:
        with pytest.raises(AdapterError, match="enum field 'agent'"):
            RemoteAECTables(server.url, schema=pac_env.SCHEMA)


@pytest.mark.parametrize("scheme", ["http", "zmq+tcp"])  # a killed server leaves no file here
def test_a_dead_server_is_an_error_not_a_hang(scheme: str) -> None:
    server = ServerProcess(unique_url(scheme), env="mahjong", num_envs=TABLES)
    try:
        with RemoteAECTables(server.url, timeout=2.0) as tables:
            step = tables.reset(seed=0)
            server.kill()
            with pytest.raises(TransportError):
                tables.step(random_actions(step, np.random.default_rng(0)))
    finally:
        server.kill()


def test_a_table_plays_what_the_aec_adapter_plays() -> None:
    """Table 0 of the tables wrapper and ``RemoteAECEnv`` (which passes pettingzoo's api_test,
    tests/test_pettingzoo_adapter.py) see the same turns, masks and final rewards, and deal the
    same next game after an unseeded reset."""
    with (
        ServerProcess(unique_url("unix"), env="mahjong") as one,
        ServerProcess(unique_url("zmq+ipc"), env="mahjong", num_envs=2) as two,
    ):
        aec = RemoteAECEnv(one.url)
        try:
            with RemoteAECTables(two.url) as tables:
                step = tables.reset(seed=5)
                aec.reset(seed=5)
                rng = np.random.default_rng(2)
                for _ in range(2000):
                    seat = tables.possible_agents[int(step.agent[0])]
                    assert aec.agent_selection == seat
                    observation = aec.observe(seat)
                    assert np.array_equal(observation["observation"], step.observation[0])
                    assert np.array_equal(observation["action_mask"], step.action_mask[0])
                    actions = random_actions(step, rng)
                    step = tables.step(actions)
                    aec.step(actions[0])
                    if step.terminated[0]:
                        break
                assert step.terminated[0] and all(aec.terminations.values())
                assert [aec.rewards[a] for a in aec.possible_agents] == step.rewards[0].tolist()
                while aec.agents:
                    aec.step(None)
                aec.reset()  # unseeded: the server's env deals its next game, as auto-reset does
                seat = tables.possible_agents[int(step.agent[0])]
                assert aec.agent_selection == seat
                assert np.array_equal(aec.observe(seat)["observation"], step.observation[0])
        finally:
            aec.close()


def trace(url: str, steps: int) -> list[bytes]:
    """Every result record (and every final result) of ``steps`` random steps of 4 tables."""
    records: list[bytes] = []
    with api.connect(url, mahjong_env.SCHEMA, timeout=10, autoreset="same_step") as client:
        rng = np.random.default_rng(4)
        view = client.reset(seed=21)
        records.append(view.record.tobytes())
        for _ in range(steps):
            actions = [int(rng.choice(np.flatnonzero(mask))) for mask in view.action_mask]
            view = client.step(actions)
            records.append(view.record.tobytes())
            records += [final.record.tobytes() for _, final in client.finals]
    return records


def test_python_and_node_tables_give_identical_bytes() -> None:
    """The Node twin deals and plays the same games: every record identical, finals included."""
    traces = {}
    for lang in ("python", "node"):
        with ServerProcess(unique_url("unix"), env="mahjong", num_envs=4, lang=lang) as server:
            traces[lang] = trace(server.url, 600)
    assert len(traces["python"]) > 601  # some games ended: their final results are in the trace
    assert traces["python"] == traces["node"]


def test_one_table_has_the_same_shapes() -> None:
    """A 1-env server: every array still has one leading table axis, after reset and step."""
    with (
        ServerProcess(unique_url("unix"), env="mahjong") as server,
        RemoteAECTables(server.url) as tables,
    ):
        for _ in range(2):
            step = tables.reset(seed=0)
            assert step.observation.shape == (1, 290) and step.action_mask.shape == (1, 104)
            step = tables.step([int(np.flatnonzero(step.action_mask[0])[0])])
            assert step.observation.shape == (1, 290) and step.action_mask.shape == (1, 104)
            assert step.agent.shape == (1,) and step.rewards.shape == (1, 4)
