"""Serving a gymnasium env without a schema (issue 23 item 1): the derived schema, its exact
spaces on the client, and trajectories equal to gymnasium's own SyncVectorEnv."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import transport
from transport.codec import Schema
from transport.errors import SchemaError
from transport.gym import RemoteVectorEnv
from transport.gym_schema import schema_of_spaces, schema_toml
from transport.gym_serve import gym_schema, gym_schema_toml
from transport.protocol import schema_from_ir_text, schema_ir_text
from transport.schema import compile_schema
from transport.spaces import action_space_of, observation_space_of

from .servers import ROOT, ServerProcess, unique_url

RICH_ID = "tests.test_gym_serve:TransportRich-v0"
TEXT_ID = "tests.test_gym_serve:TransportText-v0"


class RichEnv(gymnasium.Env[dict[str, Any], np.ndarray]):
    """Every carried leaf kind in a nested Dict / Tuple, a MultiBinary action, seeded dynamics."""

    observation_space = spaces.Dict(
        {
            "image": spaces.Box(0, 255, (4, 5, 3), np.uint8),
            "flags": spaces.MultiBinary(5),
            "dials": spaces.MultiDiscrete([3, 4], start=[0, -1]),
            "pos": spaces.Box(np.array([-1.0, -np.inf]), np.array([np.inf, 2.5]), (2,), np.float64),
            "inner": spaces.Dict({"room-id": spaces.Discrete(3, start=1)}),
            "pair": spaces.Tuple((spaces.Discrete(2), spaces.Box(0.0, 1.0, (), np.float32))),
        }
    )
    action_space = spaces.MultiBinary(3)

    def __init__(self) -> None:
        self.t = 0

    def _obs(self) -> dict[str, Any]:
        return self.observation_space.sample()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        self.t = 0
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        assert action.dtype == np.int8 and action.shape == (3,)
        self.t += 1
        reward = float(action.sum()) + float(self.np_random.random())
        return self._obs(), reward, bool(self.np_random.random() < 0.1), self.t >= 12, {}


class TextEnv(gymnasium.Env[Any, Any]):
    observation_space: Any = spaces.Dict({"note": spaces.Text(8)})
    action_space: Any = spaces.Discrete(2)


gymnasium.register(id="TransportRich-v0", entry_point=RichEnv)  # type: ignore[arg-type]
gymnasium.register(id="TransportText-v0", entry_point=TextEnv)  # type: ignore[arg-type]


def _equal(a: Any, b: Any) -> bool:
    """Same structure, dtype and values (observations of any carried space)."""
    if isinstance(b, tuple):
        return isinstance(a, tuple) and len(a) == len(b) and all(map(_equal, a, b))
    if isinstance(b, dict):
        return isinstance(a, dict) and list(a) == list(b) and all(_equal(a[k], b[k]) for k in b)
    if b is None:
        return a is None
    return bool(np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(a, b))


# -- the derived schema ------------------------------------------------------------------------


def test_same_spaces_give_the_same_schema_and_fingerprint() -> None:
    make = RichEnv.observation_space, RichEnv.action_space
    again = spaces.Dict(dict(reversed(list(RichEnv.observation_space.spaces.items()))))
    first = schema_of_spaces(*make)
    assert schema_toml(*make) == schema_toml(again, spaces.MultiBinary(3))
    assert schema_of_spaces(again, spaces.MultiBinary(3)).fingerprint == first.fingerprint
    # what only the carried description says still changes the fingerprint
    assert (
        schema_of_spaces(spaces.Discrete(3, start=1), spaces.Discrete(2)).fingerprint
        != schema_of_spaces(spaces.Discrete(3), spaces.Discrete(2)).fingerprint
    )
    assert (
        schema_of_spaces(spaces.Box(0, 1, (2,), np.int8), spaces.Discrete(2)).fingerprint
        != schema_of_spaces(spaces.MultiBinary(2), spaces.Discrete(2)).fingerprint
    )


def test_two_envs_with_the_same_spaces_announce_their_own_names() -> None:
    # the fingerprint leaves the name out: a process serving one env and then another with the
    # same spaces (two Atari games) announced the first one's IR, name included, for both (the
    # space-matrix contract check discover_schema failed after the real-env tests' Pong)
    box, action = spaces.Box(0, 255, (4, 8), np.uint8), spaces.Discrete(6)
    pong, breakout = (
        schema_of_spaces(box, action, "pong"),
        schema_of_spaces(box, action, "breakout"),
    )
    assert pong.fingerprint == breakout.fingerprint
    for schema in (pong, breakout, pong):
        found = schema_from_ir_text(schema_ir_text(schema), schema.fingerprint, peer="test")
        assert (found.name, found.fingerprint) == (schema.name, schema.fingerprint)


@pytest.mark.parametrize(
    "env_id",
    [
        "CartPole-v1",
        "Pendulum-v1",
        "MountainCarContinuous-v0",
        "Acrobot-v1",
        "FrozenLake-v1",
        "Blackjack-v1",
        RICH_ID,
    ],
)
def test_the_schema_rebuilds_the_exact_spaces(env_id: str) -> None:
    env = gymnasium.make(env_id)
    schema = gym_schema(env_id)
    observation = observation_space_of(schema)
    n = env.action_space.n if isinstance(env.action_space, spaces.Discrete) else 0
    action = action_space_of(schema, int(n))
    assert observation == env.observation_space
    assert action == env.action_space
    env.close()


def test_a_schema_that_says_it_all_has_no_description() -> None:
    text = gym_schema_toml("Pendulum-v1")
    assert "GymSpaces" not in text
    assert 'type = "f32[3]", role = "observation", low = [-1.0, -1.0, -8.0]' in text
    assert "GymSpaces" in gym_schema_toml("CartPole-v1")  # -inf on two elements only


def test_from_gym_prints_a_schema_with_the_same_fingerprint() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "transport.tools.schema_cli", "from-gym", "CartPole-v1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    compiled = Schema(compile_schema(done.stdout, "cartpole.toml"))
    assert compiled.fingerprint == gym_schema("CartPole-v1").fingerprint
    assert compiled.name == "CartPole_v1"


def test_from_gym_json_is_the_ir_inspect_prints_of_its_toml(tmp_path: Path) -> None:
    """README: every tool has --json; from-gym's is the IR (what the Node server loads)."""

    def schema_cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "transport.tools.schema_cli", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    toml = tmp_path / "pendulum.toml"
    toml.write_text(schema_cli("from-gym", "Pendulum-v1"))
    as_json = schema_cli("from-gym", "Pendulum-v1", "--json")
    assert as_json == schema_cli("inspect", str(toml), "--json")
    assert json.loads(as_json)["fingerprint"] == f"{gym_schema('Pendulum-v1').fingerprint:016x}"


def test_a_text_space_is_a_one_line_error_naming_it() -> None:
    with pytest.raises(SchemaError, match=r"observation_space\['note'\]: Text space"):
        gym_schema(TEXT_ID)
    done = subprocess.run(
        [sys.executable, "-m", "transport.tools.schema_cli", "from-gym", TEXT_ID],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert "observation_space['note']: Text space" in done.stderr
    served = subprocess.run(
        [sys.executable, "-m", "transport.tools.serve_cli", unique_url("unix"), "--gym", TEXT_ID],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert served.returncode == 2 and served.stderr.count("\n") == 1, served.stderr
    assert "Text space" in served.stderr


def test_node_and_bad_kwargs_are_refused_in_one_line() -> None:
    serve = [sys.executable, "-m", "transport.tools.serve_cli"]
    for extra in (["--lang", "node"], ["--gym-kwargs", "[1]"], ["--gym-kwargs", "{"]):
        done = subprocess.run(
            [*serve, unique_url("unix"), "--gym", "CartPole-v1", *extra],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and done.stderr.count("\n") == 1, (extra, done.stderr)


# -- served: the same trajectory as gymnasium's SyncVectorEnv ------------------------------------

MODES = {"next_step": AutoresetMode.NEXT_STEP, "same_step": AutoresetMode.SAME_STEP}


def _compare(env_id: str, url: str, mode: str, steps: int, kwargs: dict[str, Any]) -> None:
    remote = RemoteVectorEnv(url, autoreset_mode=MODES[mode])
    local = SyncVectorEnv(
        [lambda: gymnasium.make(env_id, **kwargs) for _ in range(4)], autoreset_mode=MODES[mode]
    )
    try:
        assert remote.single_observation_space == local.single_observation_space
        assert remote.single_action_space == local.single_action_space
        assert remote.num_envs == 4
        got, want = remote.reset(seed=11)[0], local.reset(seed=11)[0]
        assert _equal(got, want), (got, want)
        local.action_space.seed(5)
        ends = 0
        for t in range(steps):
            actions = local.action_space.sample()
            r = remote.step(actions)
            g = local.step(actions)
            for k, what in enumerate(("obs", "rewards", "terminated", "truncated")):
                assert _equal(r[k], g[k]), (env_id, mode, t, what, r[k], g[k])
            if mode == "same_step" and "final_obs" in g[4]:
                ends += 1
                assert np.array_equal(r[4]["_final_obs"], g[4]["_final_obs"])
                for i in np.flatnonzero(g[4]["_final_obs"]):
                    assert _equal(r[4]["final_obs"][i], g[4]["final_obs"][i]), (t, i)
            ends += int(np.any(g[2] | g[3]))
        assert ends > 0, "no episode ended: the auto-reset was not exercised"
    finally:
        remote.close()
        local.close()


@pytest.mark.parametrize("backend", ["unix", "shm"])
@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_cartpole_served_equals_sync_vector_env(backend: str, mode: str) -> None:
    with ServerProcess(
        unique_url(backend), num_envs=4, extra=["--gym", "CartPole-v1"], ready_timeout=120
    ) as server:
        _compare("CartPole-v1", server.url, mode, 150, {})


def test_cartpole_in_worker_processes_equals_sync_vector_env() -> None:
    with ServerProcess(
        unique_url("unix"),
        num_envs=4,
        extra=["--gym", "CartPole-v1", "--workers", "2"],
        ready_timeout=120,
    ) as server:
        _compare("CartPole-v1", server.url, "same_step", 100, {})


@pytest.mark.parametrize(
    ("env_id", "mode", "steps", "kwargs"),
    [
        ("Pendulum-v1", "same_step", 210, {}),
        ("MountainCarContinuous-v0", "next_step", 60, {"max_episode_steps": 25}),
        ("Acrobot-v1", "same_step", 60, {"max_episode_steps": 20}),
        ("FrozenLake-v1", "next_step", 80, {}),
        ("Blackjack-v1", "same_step", 40, {}),
        (RICH_ID, "next_step", 40, {}),
        (RICH_ID, "same_step", 40, {}),
    ],
)
def test_shipped_and_rich_envs_served_equal_sync_vector_env(
    env_id: str, mode: str, steps: int, kwargs: dict[str, Any]
) -> None:
    import json

    extra = ["--gym", env_id] + (["--gym-kwargs", json.dumps(kwargs)] if kwargs else [])
    with ServerProcess(unique_url("unix"), num_envs=4, extra=extra, ready_timeout=120) as server:
        _compare(env_id, server.url, mode, steps, kwargs)


def test_disabled_mode_client_resets_equal_sync_vector_env() -> None:
    """autoreset disabled: the trainer resets (here every env, seeded, when one ends), as a
    SyncVectorEnv with AutoresetMode.DISABLED does."""
    with ServerProcess(
        unique_url("unix"), num_envs=4, extra=["--gym", "CartPole-v1"], ready_timeout=120
    ) as server:
        client = transport.connect(server.url, autoreset="disabled")
        local = SyncVectorEnv(
            [lambda: gymnasium.make("CartPole-v1") for _ in range(4)],
            autoreset_mode=AutoresetMode.DISABLED,
        )
        try:
            seeds: list[int | None] = [3, 4, 5, 6]
            view = client.reset(seeds)
            want, _ = local.reset(seed=seeds)
            assert np.array_equal(view["observation"], want)
            rng = np.random.default_rng(0)
            resets = 0
            for _ in range(120):
                actions = rng.integers(0, 2, 4)
                view = client.step(actions)
                obs, rewards, terminated, truncated, _ = local.step(actions)
                assert np.array_equal(view["observation"], obs)
                assert np.array_equal(view["reward"], rewards)
                assert np.array_equal(view["terminated"], terminated)
                assert np.array_equal(view["truncated"], truncated)
                if np.any(terminated | truncated):
                    resets += 1
                    seeds = [int(s or 0) + 10 for s in seeds]
                    view = client.reset(seeds)
                    assert np.array_equal(view["observation"], local.reset(seed=seeds)[0])
            assert resets > 0
        finally:
            client.close()
            local.close()


def test_serve_gym_in_a_script_and_a_factory(tmp_path: Any) -> None:
    """The library entry point with a factory (no id): spaces discovered, steps served."""
    from transport.gym_serve import gym_server

    url = unique_url("unix")
    with gym_server(RichEnv, url, num_envs=2).start() as server:
        remote = RemoteVectorEnv(server.bound_url)
        try:
            assert remote.single_observation_space == RichEnv.observation_space
            obs: Any = remote.reset(seed=1)[0]
            assert RichEnv.observation_space.contains({k: _first(v) for k, v in obs.items()})
            remote.step(np.ones((2, 3), dtype=np.int8))
        finally:
            remote.close()


def _first(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _first(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_first(v) for v in value)
    return value[0:1].reshape(value.shape[1:])


@pytest.mark.parametrize(
    ("observation", "action", "named"),
    [
        (spaces.Sequence(spaces.Discrete(3)), spaces.Discrete(2), r"observation_space: Sequence"),
        (
            spaces.Dict({"g": spaces.Graph(spaces.Box(0, 1, (2,)), None)}),
            spaces.Discrete(2),
            r"observation_space\['g'\]: Graph",
        ),
        (
            spaces.Tuple((spaces.Discrete(2), spaces.OneOf((spaces.Discrete(2),)))),
            spaces.Discrete(2),
            r"observation_space\[1\]: OneOf",
        ),
        (spaces.Box(0, 1, (2,), np.float16), spaces.Discrete(2), r"dtype float16"),
        (spaces.Discrete(2), spaces.Box(0, 1, (2,), bool), r"Box action of bools"),
        (spaces.Discrete(2), spaces.Dict({"a": spaces.Discrete(2)}), r"action_space: Dict"),
        (spaces.Discrete(2), spaces.Text(4), r"action_space: Text"),
    ],
)
def test_spaces_that_cannot_be_carried_are_named(observation: Any, action: Any, named: str) -> None:
    with pytest.raises(SchemaError, match=named) as caught:
        schema_toml(observation, action)
    assert "\n" not in str(caught.value)


def test_rgb_array_frames_come_through_info() -> None:
    kwargs = '{"render_mode": "rgb_array"}'
    extra = ["--gym", "CartPole-v1", "--gym-kwargs", kwargs]
    with ServerProcess(unique_url("unix"), num_envs=2, extra=extra, ready_timeout=120) as server:
        remote = RemoteVectorEnv(server.url, render_mode="rgb_array")
        local = gymnasium.make("CartPole-v1", render_mode="rgb_array")
        try:
            remote.reset(seed=3)
            local.reset(seed=4)  # env 1 of the remote: seed 3 + 1
            frames = remote.render()
            assert frames is not None and len(frames) == 2
            want: Any = local.render()
            assert frames[1].shape == want.shape and np.array_equal(frames[1], want)
        finally:
            remote.close()
            local.close()


def test_transport_serve_gym_serves_until_sigterm() -> None:
    """The library entry point ``transport.serve_gym`` in a process of its own."""
    import signal

    url = unique_url("unix")
    code = (
        "import sys, transport\n"
        "transport.serve_gym(sys.argv[1], sys.argv[2], num_envs=3,"
        " ready=lambda u: print('ready', u, flush=True))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "Acrobot-v1", url],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ready "), proc.stderr.read() if proc.stderr else line
        remote = RemoteVectorEnv(url)
        try:
            assert remote.num_envs == 3
            assert remote.single_observation_space == gymnasium.make("Acrobot-v1").observation_space
        finally:
            remote.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize(
    ("observation", "action"),
    [
        (spaces.Box(0, 1, (), np.float32), spaces.Box(-1, 1, (), np.float32)),
        (spaces.Box(-np.inf, np.inf, (2, 3), np.float64), spaces.Box(0, 5, (2,), np.int64)),
        (spaces.Discrete(5, start=-2), spaces.Discrete(4, start=3)),
        (spaces.MultiBinary([2, 3]), spaces.MultiDiscrete(np.array([[2, 3], [4, 5]]))),
        (spaces.Box(0, 255, (3, 4), np.uint8), spaces.Discrete(300)),
        # EnvPool's Jumanji envs (CVRP, BinPack): n a one-item tuple, unequal to MultiBinary(5)
        (spaces.Dict({"a": spaces.MultiBinary((5,))}), spaces.MultiBinary((3,))),
        (spaces.Dict({"a": spaces.MultiBinary(5)}), spaces.MultiBinary(3)),
        # a Box of bools (PettingZoo's Go planes): a bool array field
        (spaces.Box(0, 1, (2, 3), bool), spaces.Discrete(2)),
    ],
)
def test_edge_spaces_rebuild_exactly(observation: Any, action: Any) -> None:
    schema = schema_of_spaces(observation, action)
    n = int(action.n) if isinstance(action, spaces.Discrete) else 0
    assert observation_space_of(schema) == observation
    assert action_space_of(schema, n) == action


class ActionEnv(gymnasium.Env[Any, Any]):
    """Checks that every action it gets is inside its action space; reward: the action's sum."""

    def __init__(self, observation_space: Any, action_space: Any) -> None:
        import copy

        self.observation_space = copy.deepcopy(observation_space)  # its own sampling RNG
        self.action_space = copy.deepcopy(action_space)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        assert self.action_space.contains(action), action
        done = bool(self.np_random.random() < 0.2)
        return self.observation_space.sample(), float(np.sum(action)), done, False, {}


@pytest.mark.parametrize(
    ("observation", "action"),
    [
        (spaces.Discrete(5, start=-2), spaces.Discrete(4, start=3)),
        (
            spaces.MultiBinary([2, 3]),
            spaces.MultiDiscrete(np.array([[2, 3], [4, 5]]), start=np.array([[1, 0], [0, -2]])),
        ),
        (spaces.Box(0, 1, (), np.float32), spaces.Box(-1, 1, (), np.float32)),
        (spaces.Box(0, 255, (3, 4), np.uint8), spaces.Box(0, 5, (2,), np.int64)),
    ],
)
def test_served_actions_reach_the_env_as_its_own_values(observation: Any, action: Any) -> None:
    from transport.gym_serve import gym_server

    def make() -> ActionEnv:
        return ActionEnv(observation, action)

    with gym_server(make, unique_url("unix"), num_envs=3).start() as server:
        remote = RemoteVectorEnv(server.bound_url, autoreset_mode=AutoresetMode.SAME_STEP)
        local = SyncVectorEnv([make] * 3, autoreset_mode=AutoresetMode.SAME_STEP)
        try:
            assert remote.single_action_space == action
            assert _equal(remote.reset(seed=2)[0], local.reset(seed=2)[0])
            local.action_space.seed(1)
            for t in range(30):
                actions = local.action_space.sample()
                r, g = remote.step(actions), local.step(actions)
                for k in range(4):
                    assert _equal(r[k], g[k]), (t, k, r[k], g[k])
        finally:
            remote.close()
            local.close()
