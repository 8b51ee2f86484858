"""Real envs nobody here wrote, on every path (issue 23 item 2): CartPole, MuJoCo Hopper (Box
observation, Box actions), Atari Pong as trainers use it (AtariPreprocessing 84x84 grey +
FrameStackObservation(4): a (4, 84, 84) uint8 image), served without a schema and compared,
step by step and bit for bit, with gymnasium's own ``SyncVectorEnv`` on the same seeds in every
auto-reset mode (next_step, same_step, disabled).

The matrix covers each path at least once rather than the full product (CI time), every
comparison in all three auto-reset modes unless said:

- CartPole x every backend (unix, zmq+ipc, http, shm), served in this process: the backends;
- Hopper over unix in process; over shm with 2 worker processes from the command line
  (``transport-serve shm://... --gym Hopper-v5 --gym-kwargs JSON --workers 2``), lock-step and,
  on the same connection, asynchronous batches (``RemoteAsyncVectorEnv``: recv 2 of 4; next_step
  and same_step, the modes async batches have);
- Pong over shm in process; over zmq+ipc from the command line by a registered id (the wrapped
  env: ``--gym tests.test_real_envs:TransportPongStack-v0``; same_step only: an ALE reset with a
  seed reloads the ROM, the costliest part of these tests);
- the episode collector on Hopper with a Dict observation (every field kept; each episode equal
  to a gymnasium env on the collector's seed replaying the recorded actions);
- PettingZoo's tic-tac-toe served by ``transport.pettingzoo.aec_server``, played by
  ``RemoteAECEnv`` (and PettingZoo's ``api_test``) and by ``RemoteAECTables`` (4 tables,
  same-step restarts), equal to the env in process turn by turn.

Ray lives in tests/test_real_envs_ray.py (one test: a Ray start is slow). Episodes are cut
short with ``max_episode_steps`` so every trajectory crosses several auto-resets (terminated and
truncated ends both). A family is skipped, with the reason, only where its package cannot be
imported.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import transport
from transport.api import Server
from transport.gym import RemoteAsyncVectorEnv, RemoteVectorEnv
from transport.gym_serve import gym_server

from .servers import ServerProcess, unique_url

SEED = 11
MODES = {"next_step": AutoresetMode.NEXT_STEP, "same_step": AutoresetMode.SAME_STEP}
ALL_MODES = [*MODES, "disabled"]

HOPPER_KWARGS = {"max_episode_steps": 25}
CARTPOLE_KWARGS = {"max_episode_steps": 30}
PONG_ID = "tests.test_real_envs:TransportPongStack-v0"


def _missing(*modules: str) -> str | None:
    gone = [m for m in modules if importlib.util.find_spec(m) is None]
    return f"not installed: {', '.join(gone)} (pip install 'transport[gym]')" if gone else None


MUJOCO_MISSING = _missing("mujoco")
ATARI_MISSING = _missing("ale_py", "cv2")
needs_mujoco = pytest.mark.skipif(MUJOCO_MISSING is not None, reason=str(MUJOCO_MISSING))
needs_atari = pytest.mark.skipif(ATARI_MISSING is not None, reason=str(ATARI_MISSING))


# -- the envs (module level: picklable for worker processes) ------------------------------------


def cartpole() -> gymnasium.Env[Any, Any]:
    return gymnasium.make("CartPole-v1", **CARTPOLE_KWARGS)


def hopper() -> gymnasium.Env[Any, Any]:
    return gymnasium.make("Hopper-v5", **HOPPER_KWARGS)


def pong_stack() -> gymnasium.Env[Any, Any]:
    """Pong as Atari trainers see it: 4 frames of 84x84 grey, 4 frames a step, sticky actions
    (v5's default), a short time limit (60 frames: 15 steps) so episodes end."""
    import ale_py
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gymnasium.register_envs(ale_py)
    env = gymnasium.make("ALE/Pong-v5", frameskip=1, max_episode_steps=60)
    return FrameStackObservation(AtariPreprocessing(env, frame_skip=4, screen_size=84), 4)


HOPPER_DICT = spaces.Dict(
    {
        "position": spaces.Box(-np.inf, np.inf, (5,), np.float64),
        "velocity": spaces.Box(-np.inf, np.inf, (6,), np.float64),
    }
)


def hopper_dict() -> gymnasium.Env[Any, Any]:
    """Hopper with a Dict observation (its 5 positions and 6 velocities as two fields)."""
    from gymnasium.wrappers import TransformObservation

    return TransformObservation(
        hopper(), lambda o: {"position": o[:5], "velocity": o[5:]}, HOPPER_DICT
    )


if ATARI_MISSING is None:
    gymnasium.register(id="TransportPongStack-v0", entry_point=pong_stack)  # type: ignore[arg-type]


# -- servers: one per (env, url scheme, workers) for the module ---------------------------------


class Servers:
    """Servers shared by the tests of the module (in process, or ``transport-serve`` processes
    from the command line), stopped at its end."""

    def __init__(self) -> None:
        self.started: dict[tuple[str, str, int], Server] = {}
        self.processes: dict[tuple[str, ...], ServerProcess] = {}

    def get(self, make: Callable[[], Any], scheme: str, num_envs: int, workers: int = 0) -> str:
        """A ``transport.gym_serve.gym_server`` of a factory, started in this process."""
        key = (make.__name__, scheme, workers)
        if key not in self.started:
            self.started[key] = gym_server(
                make, unique_url(scheme), num_envs=num_envs, workers=workers
            ).start()
        return self.started[key].bound_url

    def cli(self, env_id: str, scheme: str, num_envs: int, *extra: str) -> str:
        """``transport-serve URL --gym ID [EXTRA...]`` in a process of its own."""
        key = (env_id, scheme, *extra)
        if key not in self.processes:
            self.processes[key] = ServerProcess(
                unique_url(scheme),
                num_envs=num_envs,
                extra=["--gym", env_id, *extra],
                ready_timeout=120,
            )
        return self.processes[key].url

    def close(self) -> None:
        for server in self.started.values():
            server.close()
        for process in self.processes.values():
            process.__exit__(None, None, None)


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    holder = Servers()
    try:
        yield holder
    finally:
        holder.close()


# -- comparing with gymnasium's SyncVectorEnv ----------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """Same structure, dtype and values (observations of any carried space)."""
    if isinstance(b, dict):
        return isinstance(a, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in b)
    return bool(np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(a, b))


def compare_vector(url: str, make: Callable[[], Any], mode: str, steps: int, n: int) -> None:
    """``RemoteVectorEnv(url)`` against ``SyncVectorEnv([make] * n)``: spaces, every step's
    observations, rewards, end flags and (same_step) final observations; auto-resets seen."""
    if mode == "disabled":
        compare_disabled(url, make, steps, n)
        return
    remote = RemoteVectorEnv(url, autoreset_mode=MODES[mode], timeout=60)
    try:
        compare_lockstep(remote, make, mode, steps)
    finally:
        remote.close()


def compare_lockstep(
    remote: RemoteVectorEnv, make: Callable[[], Any], mode: str, steps: int
) -> None:
    """``remote`` (connected in ``mode``) step by step against a SyncVectorEnv of as many envs."""
    n = remote.num_envs
    local = SyncVectorEnv([make] * n, autoreset_mode=MODES[mode])
    try:
        assert remote.single_observation_space == local.single_observation_space
        assert remote.single_action_space == local.single_action_space
        got, want = remote.reset(seed=SEED)[0], local.reset(seed=SEED)[0]
        assert same(got, want)
        local.action_space.seed(SEED)
        ends = finals = 0
        for t in range(steps):
            actions = local.action_space.sample()
            r, g = remote.step(actions), local.step(actions)
            for k, what in enumerate(("obs", "rewards", "terminated", "truncated")):
                assert same(r[k], g[k]), (mode, t, what, r[k], g[k])
            if "final_obs" in g[4]:
                assert np.array_equal(r[4]["_final_obs"], g[4]["_final_obs"]), t
                for i in np.flatnonzero(g[4]["_final_obs"]):
                    finals += 1
                    assert same(r[4]["final_obs"][i], g[4]["final_obs"][i]), (t, i)
            else:
                assert "final_obs" not in r[4], t
            ends += int(np.count_nonzero(g[2] | g[3]))
        assert ends > 0, "no episode ended: the auto-reset was not exercised"
        assert mode != "same_step" or finals == ends
    finally:
        local.close()


def compare_disabled(url: str, make: Callable[[], Any], steps: int, n: int) -> None:
    """autoreset disabled: the trainer resets every env when one ends (the first reset seeded,
    the later ones not: each env's own random stream goes on), as a SyncVectorEnv does."""
    local = SyncVectorEnv([make] * n, autoreset_mode=AutoresetMode.DISABLED)
    with transport.connect(url, autoreset="disabled", timeout=60) as client:
        try:
            assert same(client.reset(seed=SEED)["observation"], local.reset(seed=SEED)[0])
            local.action_space.seed(SEED)
            resets = 0
            for t in range(steps):
                actions = local.action_space.sample()
                view = client.step(actions)
                obs, rewards, terminated, truncated, _ = local.step(actions)
                assert same(view["observation"], obs), t
                assert np.array_equal(view["reward"], rewards), t
                assert np.array_equal(view["terminated"], terminated), t
                assert np.array_equal(view["truncated"], truncated), t
                if np.any(terminated | truncated):
                    resets += 1
                    assert same(client.reset()["observation"], local.reset()[0]), t
            assert resets > 0
        finally:
            local.close()


# -- CartPole over every backend ------------------------------------------------------------------


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize("scheme", ["unix", "zmq+ipc", "http", "shm"])
def test_cartpole_on_every_backend(servers: Servers, scheme: str, mode: str) -> None:
    url = servers.get(cartpole, scheme, num_envs=4)
    compare_vector(url, cartpole, mode, steps=60, n=4)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_cartpole_in_the_shm_column_layout(servers: Servers, mode: str) -> None:
    """``transport-serve ... --gym CartPole-v1 --shm-layout columns``: the region is laid out in
    columns (the client's observation is one contiguous block) and every step still equals
    SyncVectorEnv's."""
    kwargs = ("--gym-kwargs", json.dumps(CARTPOLE_KWARGS))
    url = servers.cli("CartPole-v1", "shm", 4, *kwargs, "--shm-layout", "columns")
    with transport.connect(url, timeout=60) as client:
        assert client.channel.layout.columns  # type: ignore[attr-defined]
        assert client.reset(seed=SEED)["observation"].flags.c_contiguous
    compare_vector(url, cartpole, mode, steps=60, n=4)


def test_gym_vector_env_writes_the_shm_columns() -> None:
    """``GymVectorEnv(..., shm_layout="columns")`` over shm:// writes the region's columns (the
    server copies nothing) and steps as gymnasium's own SyncVectorEnv does."""
    from transport.backends.shm.region import ColumnRecords
    from transport.envs.vector_gym import GymVectorEnv

    def vector() -> GymVectorEnv:
        return GymVectorEnv(SyncVectorEnv([cartpole] * 4), shm_layout="columns")

    server = Server(vector, unique_url("shm"), schema=vector().SCHEMA, num_envs=4).start()
    try:
        listener: Any = server.listener
        assert isinstance(listener.results, ColumnRecords) and listener._columns == []
        remote = RemoteVectorEnv(server.bound_url, autoreset_mode=MODES["next_step"], timeout=60)
        try:
            compare_lockstep(remote, cartpole, "next_step", steps=60)
        finally:
            remote.close()
    finally:
        server.close()


# -- MuJoCo: Box observation, Box actions ---------------------------------------------------------

HOPPER_CLI = ("--gym-kwargs", json.dumps(HOPPER_KWARGS), "--workers", "2")


@needs_mujoco
@pytest.mark.parametrize("mode", ALL_MODES)
def test_hopper_over_a_socket(servers: Servers, mode: str) -> None:
    url = servers.get(hopper, "unix", num_envs=4)
    compare_vector(url, hopper, mode, steps=50, n=4)


@needs_mujoco
@pytest.mark.parametrize("mode", ALL_MODES)
def test_hopper_over_shm_with_workers_lockstep_and_async(servers: Servers, mode: str) -> None:
    """``transport-serve shm://... --gym Hopper-v5 --gym-kwargs JSON --workers 2``: lock-step
    steps, then asynchronous batches on the same connection (a worker pool per connection)."""
    url = servers.cli("Hopper-v5", "shm", 4, *HOPPER_CLI)
    if mode == "disabled":
        compare_disabled(url, hopper, steps=50, n=4)
        return
    remote = RemoteAsyncVectorEnv(url, batch_size=2, autoreset_mode=MODES[mode], timeout=60)
    try:
        compare_lockstep(remote, hopper, mode, steps=50)
        compare_async(remote, hopper, mode, steps=120)
    finally:
        remote.close()


def compare_async(
    remote: RemoteAsyncVectorEnv, make: Callable[[], Any], mode: str, steps: int
) -> None:
    """``send`` / ``recv(batch_size)``: whichever envs come back first, each env's trajectory
    equals a gymnasium env on its seed (SEED + i) given the same actions."""
    n, batch = remote.num_envs, remote.batch_size
    assert batch < n
    locals_ = [SyncVectorEnv([make], autoreset_mode=MODES[mode]) for _ in range(n)]
    try:
        expected: dict[int, tuple[Any, ...]] = {}
        for i, env in enumerate(locals_):
            obs, _ = env.reset(seed=SEED + i)
            expected[i] = (obs[0], 0.0, False, False, None)
        space = locals_[0].single_action_space
        space.seed(SEED)
        remote.async_reset(SEED)
        done = ends = 0
        while done < steps:
            obs, rewards, terminated, truncated, infos = remote.recv()
            ids = infos["env_id"]
            assert 1 <= len(ids) <= batch
            for k, i in enumerate(ids.tolist()):
                want = expected.pop(i)  # each env comes back once per send
                assert same(obs[k], want[0]), (i, done)
                assert (rewards[k], terminated[k], truncated[k]) == want[1:4], (i, done)
                if want[4] is not None:
                    ends += 1
                    assert same(infos["final_obs"][k], want[4]), (i, done)
            actions = np.stack([space.sample() for _ in ids])
            for k, i in enumerate(ids.tolist()):
                o, r, te, tr, info = locals_[i].step(actions[k : k + 1])
                final = info["final_obs"][0] if info.get("_final_obs", [False])[0] else None
                expected[i] = (o[0], float(r[0]), bool(te[0]), bool(tr[0]), final)
                done += 1
                ends += int(mode == "next_step" and (te[0] or tr[0]))
            remote.send(actions, ids)
        while expected:  # the last sends' results: every env idle again
            for i in remote.recv()[4]["env_id"].tolist():
                expected.pop(i)
        assert ends > 0
    finally:
        for env in locals_:
            env.close()


# -- Atari: frame-stacked 84x84 images ------------------------------------------------------------


@needs_atari
@pytest.mark.parametrize("mode", ALL_MODES)
def test_pong_frame_stack_over_shm(servers: Servers, mode: str) -> None:
    url = servers.get(pong_stack, "shm", num_envs=2)
    compare_vector(url, pong_stack, mode, steps=30, n=2)


@needs_atari
def test_pong_by_a_registered_id_from_the_command_line(servers: Servers) -> None:
    """A wrapped env served by id: ``--gym tests.test_real_envs:TransportPongStack-v0``
    (gymnasium imports the module, which registers the id), over a socket backend."""
    url = servers.cli(PONG_ID, "zmq+ipc", 2)
    compare_vector(url, pong_stack, "same_step", steps=30, n=2)


# -- the episode collector: every Dict field kept ------------------------------------------------


@needs_mujoco
def test_collector_keeps_every_field_of_a_real_dict_env(servers: Servers) -> None:
    url = servers.get(hopper_dict, "shm", num_envs=2)
    rng = np.random.default_rng(SEED)

    def policy(obs: dict[str, np.ndarray], env_ids: np.ndarray) -> np.ndarray:
        assert list(obs) == ["position", "velocity"]
        assert obs["position"].shape == (len(env_ids), 5)
        return rng.uniform(-1, 1, (len(env_ids), 3)).astype(np.float32)

    with transport.connect(url, autoreset="next_step", timeout=60) as client:
        batch = transport.request_episodes(client, 2, policy, max_len=30, seed=SEED)
    assert isinstance(batch.observations, dict) and list(batch.observations) == [
        "position",
        "velocity",
    ]
    assert batch.observations["velocity"].shape == (2, int(batch.lengths.max()), 6)
    assert list(batch.final_observations) == ["position", "velocity"]
    for b in range(2):
        env = hopper_dict()
        try:
            seed = int(batch.seeds[b])
            assert seed >= SEED, batch.seeds
            obs, _ = env.reset(seed=seed)
            for t in range(int(batch.lengths[b])):
                assert same({k: v[b, t] for k, v in batch.observations.items()}, obs), (b, t)
                obs, reward, terminated, _, _ = env.step(batch.actions[b, t])
                assert reward == batch.rewards[b, t], (b, t)
            assert bool(batch.terminated[b].any()) == terminated
            assert same({k: v[b] for k, v in batch.final_observations.items()}, obs), b
        finally:
            env.close()


# -- PettingZoo: a real turn-based game ----------------------------------------------------------

PETTINGZOO_MISSING = _missing("pettingzoo")


def tictactoe() -> Any:
    from pettingzoo.classic import tictactoe_v3

    return tictactoe_v3.env()


def play_alongside(remote: Any, local: Any, game: int, rng: np.random.Generator) -> None:
    """One game of random legal moves on a served AEC env and the same env in this process
    (seeded ``game``): the same agent, observation, mask and reward every live turn, the same
    final rewards."""
    remote.reset(seed=game)
    local.reset(seed=game)
    while True:
        got, want = remote.last(), local.last()
        if want[2] or want[3]:
            assert got[2] or got[3], game
            break
        assert remote.agent_selection == local.agent_selection, game
        assert same(got[0]["observation"], want[0]["observation"]), game
        assert np.array_equal(got[0]["action_mask"], want[0]["action_mask"]), game
        assert got[1:4] == want[1:4], game
        move = int(rng.choice(np.flatnonzero(want[0]["action_mask"])))
        remote.step(move)
        local.step(move)
    assert remote.rewards == local.rewards, game


@pytest.mark.skipif(PETTINGZOO_MISSING is not None, reason=str(PETTINGZOO_MISSING))
def test_pettingzoo_tictactoe_served_equals_the_env_in_process(servers: Servers) -> None:
    """``transport.pettingzoo.aec_server`` of PettingZoo's tic-tac-toe, played by
    ``RemoteAECEnv``: every live turn shows the same agent, observation, mask and reward as the
    env in this process given the same moves; each game ends with the same rewards and flags."""
    from transport.pettingzoo import RemoteAECEnv, aec_schema, aec_server

    key = ("tictactoe", "unix", 0)
    if key not in servers.started:
        servers.started[key] = aec_server(tictactoe, unique_url("unix"), name="tictactoe").start()
    remote = RemoteAECEnv(servers.started[key].bound_url, schema=aec_schema(tictactoe), timeout=60)
    local = tictactoe()
    rng = np.random.default_rng(SEED)
    try:
        assert remote.possible_agents == local.possible_agents
        for agent in local.possible_agents:
            assert remote.observation_space(agent) == local.observation_space(agent)
            assert remote.action_space(agent) == local.action_space(agent)
        outcomes = set()
        for game in range(6):
            play_alongside(remote, local, game, rng)
            assert remote.terminations == local.terminations, game
            assert remote.truncations == local.truncations, game
            outcomes.add(tuple(local.rewards.values()))
            for env in (remote, local):
                while env.agents:  # the dead steps PettingZoo asks of every agent
                    env.step(None)
        assert len(outcomes) > 1, outcomes  # wins (either side) and draws, not one result
        from pettingzoo.test import api_test

        api_test(remote, num_cycles=30)  # PettingZoo's own checks of an AEC env
    finally:
        remote.close()
        local.close()


def go() -> Any:
    from pettingzoo.classic import go_v5

    return go_v5.env(board_size=5, komi=0.5)


@pytest.mark.skipif(PETTINGZOO_MISSING is not None, reason=str(PETTINGZOO_MISSING))
def test_pettingzoo_go_with_bool_planes_served_equals_the_env_in_process() -> None:
    """Go's observation is a Box of bools (5 x 5 x 17 planes here): the schema carries it as a
    bool array (it was refused: 'dtype bool has no schema type'), the client's space is
    Box(False, True) as the env's (a bool field without bounds read as True..True), and every
    turn equals the env in this process given the same moves."""
    from transport.pettingzoo import RemoteAECEnv, aec_schema, aec_server

    server = aec_server(go, unique_url("shm"), name="go").start()
    remote = RemoteAECEnv(server.bound_url, schema=aec_schema(go), timeout=60)
    local = go()
    rng = np.random.default_rng(SEED)
    try:
        for agent in local.possible_agents:
            assert remote.observation_space(agent) == local.observation_space(agent)
        for game in range(2):
            play_alongside(remote, local, game, rng)
            for env in (remote, local):
                while env.agents:
                    env.step(None)
    finally:
        remote.close()
        local.close()
        server.close()


@pytest.mark.skipif(PETTINGZOO_MISSING is not None, reason=str(PETTINGZOO_MISSING))
def test_pettingzoo_tictactoe_tables_equal_the_envs_in_process() -> None:
    """4 tables of tic-tac-toe on one connection (``RemoteAECTables``, same-step restarts):
    each table shows what a local env shows given the same moves (agent, observation, mask),
    and each finished game pays the local env's final rewards."""
    from transport.pettingzoo import RemoteAECTables, aec_schema, aec_server

    n = 4
    with aec_server(tictactoe, unique_url("unix"), num_envs=n, name="tictactoe").start() as server:
        tables = RemoteAECTables(server.bound_url, schema=aec_schema(tictactoe), timeout=60)
        local = [tictactoe() for _ in range(n)]
        rng = np.random.default_rng(SEED)
        try:
            shown = tables.reset(seed=SEED)
            for i, env in enumerate(local):
                env.reset(seed=SEED + i)
            games = 0
            for _ in range(40):
                moves = np.zeros(n, dtype=np.int64)
                for i, env in enumerate(local):
                    seen = env.observe(env.agent_selection)
                    assert tables.possible_agents[shown.agent[i]] == env.agent_selection, i
                    assert same(shown.observation[i], seen["observation"]), i
                    assert np.array_equal(shown.action_mask[i], seen["action_mask"]), i
                    moves[i] = rng.choice(np.flatnonzero(seen["action_mask"]))
                shown = tables.step(moves)
                for i, env in enumerate(local):
                    env.step(int(moves[i]))
                    ended = all(env.terminations.values()) or all(env.truncations.values())
                    assert bool(shown.terminated[i] | shown.truncated[i]) == ended, i
                    if ended:
                        games += 1
                        want = [env.rewards[a] for a in tables.possible_agents]
                        assert shown.rewards[i].tolist() == want, (i, want)
                        env.reset()  # the server restarted the table (reset without a seed)
            assert games >= n
        finally:
            tables.close()
            for env in local:
                env.close()


# -- bad input: typed, clear errors ---------------------------------------------------------------


def test_an_env_instance_or_a_bad_id_is_a_typed_error_saying_what_to_pass() -> None:
    """``serve_gym`` makes each env of the server itself: an env instance (not a factory) is
    an AdapterError saying to pass an id or a factory, not "object is not callable"; an id
    gymnasium cannot make is an AdapterError naming the id, gymnasium's error its cause."""
    from transport.errors import AdapterError

    url = unique_url("unix")
    instance = cartpole()
    try:
        with pytest.raises(AdapterError, match=r"an env id or a zero-argument factory.*lambda"):
            gym_server(instance, url)  # type: ignore[arg-type]
    finally:
        instance.close()
    with pytest.raises(AdapterError, match=r"NoSuchEnv-v0.*doesn't exist") as caught:
        gym_server("NoSuchEnv-v0", url)
    assert isinstance(caught.value.__cause__, gymnasium.error.Error)
    with pytest.raises(AdapterError, match=r"CartPole-v1.*\{'bogus': 1\}.*bogus"):
        gym_server("CartPole-v1", url, gym_kwargs={"bogus": 1})


@needs_atari
def test_an_atari_id_is_served_without_importing_ale_py_first() -> None:
    """``--gym ALE/Pong-v5`` (and ``from-gym``) as a gymnasium user types it: gymnasium knows
    the ALE namespace only once ale_py is imported (``gymnasium.register_envs(ale_py)``), so a
    fresh process must import it for the id, not answer "Namespace ALE not found"."""
    import subprocess
    import sys

    from .servers import ROOT

    done = subprocess.run(
        [sys.executable, "-m", "transport.tools.schema_cli", "from-gym", "ALE/Pong-v5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert 'type = "u8[210,160,3]", role = "observation"' in done.stdout
