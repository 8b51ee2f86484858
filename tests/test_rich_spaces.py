"""Richer spaces (issue 12 item 7): several observation fields as a Dict space, Box and
MultiDiscrete actions, checked by the env runtime of both languages over every backend, and the
setups a server cannot serve refused when it starts."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

from transport.codec import Schema
from transport.envs import env_schema
from transport.envs.rich_spaces import LockEnv, ReachEnv
from transport.errors import RemoteError, SchemaError
from transport.generated import dictbox, gridworld, multidiscrete, pac_env
from transport.gym import RemoteEnv, RemoteVectorEnv
from transport.runtime.core import ActionRule
from transport.schema.compiler import compile_schema
from transport.spaces import action_space_of, observation_space_of

from .servers import ROOT, ServerProcess, unique_unix_url, unique_url

SCHEMES = ["unix", "shm"]
"""One socket backend and shm: the actions and observations are the codec's and the runtime's
(the same code over every scheme; a socket backend moves opaque bodies). The other schemes
carry these layouts in tests/test_contract_spaces.py's and tests/test_contract.py's checks."""
LANGS = ["python", "node"]
ENVS: dict[str, type[ReachEnv] | type[LockEnv]] = {"reach": ReachEnv, "lock": LockEnv}
GOOD_ACTIONS: dict[str, list[Any]] = {
    "reach": [np.array([0.5, -0.25], np.float32), np.array([-1.0, 1.0], np.float32)],
    "lock": [np.array([1, 2, 3]), np.array([2, 0, 4])],
}
BAD_ACTIONS: dict[str, list[tuple[Any, str]]] = {
    "reach": [
        (np.array([np.nan, 0.0], np.float32), "action [NaN, 0] is not inside"),
        (np.array([np.inf, 0.0], np.float32), "and finite"),
        (np.array([1.5, 0.0], np.float32), "action [1.5, 0] is not inside [-1, -1]..[1, 1]"),
    ],
    "lock": [(np.array([3, 0, 0]), "action [3, 0, 0] is not inside [0, 0, 0]..[2, 3, 4]")],
}

# -- the schema language -------------------------------------------------------------------------

BASE = """
[schema]
name = "t"
version = 1
layout = "natural"
[env]
[structs.StepResult]
fields = [
  {{ name = "a", type = "f32[3]", role = "observation"{obs} }},
  {{ name = "reward", type = "f64", role = "reward" }},
  {{ name = "terminated", type = "bool", role = "terminated" }},
]
[structs.StepRequest]
fields = [{{ name = "act", type = "{act}", role = "action"{act_attrs} }}]
"""


def compiled(obs: str = "", act: str = "u8", act_attrs: str = "") -> Schema:
    return Schema(compile_schema(BASE.format(obs=obs, act=act, act_attrs=act_attrs), "t.toml"))


def test_optional_attributes_absent_keep_every_fingerprint() -> None:
    # seed 000 Appendix A's schema (the envelope's RESET_SEEDS_REQ changed it from b7769b26a19d4aac)
    assert pac_env.FINGERPRINT_HEX == "7f1be4e3b718a454"
    assert "low" not in str(gridworld.IR) and "allow_nonfinite" not in str(gridworld.IR)


def test_dictbox_ir_has_two_observations_and_a_bounded_box_action() -> None:
    result = dictbox.SCHEMA.ir.structs["StepResult"]
    assert [f.name for f in result.roles("observation")] == ["grid", "vec"]
    move = dictbox.SCHEMA.ir.structs["StepRequest"].field("move")
    assert (move.bound("low"), move.bound("high")) == ((-1.0, -1.0), (1.0, 1.0))
    multi = dictbox.SCHEMA.ir.structs["StepMultiRequest"].fields[0]
    assert (multi.type, multi.dims) == ("f32[8,2]", (8, 2))  # seats x the action's shape


@pytest.mark.parametrize(
    ("obs", "act", "act_attrs", "message"),
    [
        ("", "u8[3]", "", "(MultiDiscrete) needs high"),
        ("", "u8", ", high = 4", "Discrete action (one integer) takes its range"),
        ("", "f32[2]", ", low = 1.0, high = 0.0", "low 1.0 > high 0.0 (element 0)"),
        ("", "f32[2]", ", low = [0.0]", "low has 1 values; the field has 2 elements"),
        ("", "f32[2]", ", high = inf", "high must be finite"),
        ("", "u8[2]", ", high = [2, 300]", "high 300 does not fit u8"),
        ("", "u8[2]", ", high = [2, 2.5]", "of an integer field must be integers"),
        ("", "u8[2]", ", high = 2, allow_nonfinite = true", "allow_nonfinite applies to a float"),
        ("", "bool[2]", "", "array action must be of"),
        ("", "f32", "", "the action must be one 8-32 bit integer"),
    ],
)
def test_bad_action_declarations_fail_with_one_line(
    obs: str, act: str, act_attrs: str, message: str
) -> None:
    with pytest.raises(SchemaError, match=r"t\.toml: struct StepRequest, field act: ") as info:
        compiled(obs, act, act_attrs)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_bounds_only_on_observation_and_action_fields() -> None:
    text = BASE.format(obs="", act="u8", act_attrs="").replace(
        'role = "reward" }', 'role = "reward", low = 0.0 }'
    )
    with pytest.raises(SchemaError, match="field reward: low applies to an integer or float"):
        compile_schema(text, "t.toml")


def test_only_the_observation_role_may_repeat() -> None:
    text = BASE.format(obs="", act="u8", act_attrs="").replace(
        '{ name = "reward", type = "f64", role = "reward" },',
        '{ name = "reward", type = "f64", role = "reward" },\n'
        '  { name = "b", type = "f32[2]", role = "observation" },\n'
        '  { name = "again", type = "f64", role = "reward" },',
    )
    with pytest.raises(SchemaError, match="field again: role 'reward' is already taken"):
        compile_schema(text, "t.toml")


# -- spaces from the schema ----------------------------------------------------------------------


def test_spaces_of_dictbox_and_multidiscrete() -> None:
    obs = observation_space_of(dictbox.SCHEMA)
    assert isinstance(obs, spaces.Dict) and list(obs.spaces) == ["grid", "vec"]
    assert obs["grid"] == spaces.Box(0.0, 1.0, (2, 5, 5), np.float32)
    assert obs["vec"] == spaces.Box(0.0, 1.0, (4,), np.float32)
    assert action_space_of(dictbox.SCHEMA, 2) == spaces.Box(-1.0, 1.0, (2,), np.float32)
    assert action_space_of(multidiscrete.SCHEMA, 3) == spaces.MultiDiscrete([3, 4, 5])
    assert observation_space_of(multidiscrete.SCHEMA) == spaces.Box(0.0, 1.0, (6,), np.float32)


def test_one_observation_field_stays_a_box_of_its_shape() -> None:
    box = observation_space_of(gridworld.SCHEMA, (0.0, 1.0))
    assert box == spaces.Box(0.0, 1.0, (2, 5, 5), np.float32)
    assert action_space_of(gridworld.SCHEMA, 4) == spaces.Discrete(4)
    assert observation_space_of(pac_env.SCHEMA).shape == (612,)


def test_box_rule_refuses_nonfinite_unless_allowed() -> None:
    schema = compiled(act="f32[2]", act_attrs=", low = -1.0, high = 1.0")
    rule = ActionRule(schema.ir.structs["StepRequest"].field("act"))
    actions = np.array([[0, 0], [np.nan, 0], [0, -np.inf], [1.0, 1.01]], np.float32)
    assert rule.bad(actions, 0).tolist() == [False, True, True, True]
    loose = compiled(act="f32[2]", act_attrs=", allow_nonfinite = true")
    rule = ActionRule(loose.ir.structs["StepRequest"].field("act"))
    assert not rule.bad(actions, 0).any()


@pytest.mark.parametrize(
    "act, attrs",
    [
        ("f32[2]", ", low = -1.0, high = 1.0"),
        ("f64[2]", ", low = -1.0"),
        ("f32[2]", ""),
        ("f32[2]", ", high = 0.5, allow_nonfinite = true"),
        ("f32[2]", ", low = -1.0, high = 1.0, allow_nonfinite = true"),
        ("i16[2]", ", low = 0, high = 3"),
        ("f32[2]", ", low = -0.4, high = 0.4"),  # 0.4f > 0.4: the f32 batch compares in f64
        ("f32[2]", ", low = [-1.0, 0.0], high = [1.0, 0.5]"),  # per-element bounds
        ("f64[2,2]", ", low = -1.0, high = 1.0"),
        ("f64[2]", ", high = 1.0"),
    ],
)
@pytest.mark.parametrize("layout", ["packed", "slots", "fortran"])
def test_flat_action_screen_agrees_with_the_per_env_rule(act: str, attrs: str, layout: str) -> None:
    # the runtime's fast screen (accepts_all) passes a batch only when bad() refuses none, and
    # fails one bad() refuses (or, allow_nonfinite, one with a NaN: bad() decides); "slots":
    # the batch is a strided view of wider rows, as a server's view of its shm slots (the C
    # screen reads both); "fortran": rows not contiguous (NumPy's min and max read it)
    field = compiled(act=act, act_attrs=attrs).ir.structs["StepRequest"].field("act")
    rule = ActionRule(field)
    dtype = np.float32 if act.startswith("f32") else np.float64 if act[0] == "f" else np.int16
    f32_edge = float(np.float32(0.4))
    special = [0.0, 0.4, f32_edge, -f32_edge, 0.5, 0.50001, 1.0, 1.01, -1.0, -1.01, 3.0, 4.0]
    special += [-np.inf, np.inf, np.nan]
    shape = (3, *field.dims)
    rng = np.random.default_rng(0)
    for draw in range(400):
        if dtype == np.int16:
            picks = rng.integers(-1, 5, shape)
        elif draw % 2:
            picks = rng.choice(special, size=shape)
        else:  # in bounds but for one or two values: each special value alone decides
            picks = np.zeros(shape)
            picks.flat[rng.integers(0, picks.size, 2)] = rng.choice(special, size=2)
        batch = np.asarray(picks, dtype=dtype)
        if layout == "slots":
            rows = np.zeros((3, batch[0].nbytes + 24), dtype=np.uint8)
            view = rows[:, 8 : 8 + batch[0].nbytes].view(dtype).reshape(shape)
            view[...] = batch
            batch = view
        elif layout == "fortran":
            batch = np.asfortranarray(batch)
        refused = bool(rule.bad(batch, 0).any())
        if rule.accepts_all(batch):
            assert not refused, batch
        elif not np.isnan(batch.astype(np.float64)).any():  # allowed NaN: left to bad()
            assert refused, batch


# -- end to end: both server languages, every backend --------------------------------------------


def local_trace(name: str, seed: int) -> list[dict[str, Any]]:
    """The reference env's results in this process (the servers must send the same values)."""
    env = ENVS[name]()
    results = [env.reset(seed)] + [env.step(a) for a in GOOD_ACTIONS[name]]
    return [dict(r) for r in results]


def same_result(observation: Any, reward: float, expected: dict[str, Any]) -> None:
    if isinstance(observation, dict):
        for key, value in observation.items():
            np.testing.assert_array_equal(value, np.asarray(expected[key], np.float32))
    else:
        np.testing.assert_array_equal(observation, expected["observation"])
    assert reward == pytest.approx(expected["reward"], abs=0.0)


Served = Callable[[str, str, str], ServerProcess]


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    """One server per (scheme, language, env) for the module: the Python client's session, then
    the Node client's (each starts with a seeded reset; over shm each is a lease of its own)."""
    started: dict[tuple[str, str, str], ServerProcess] = {}
    with contextlib.ExitStack() as stack:

        def get(scheme: str, lang: str, env: str) -> ServerProcess:
            key = (scheme, lang, env)
            if key not in started:
                server = ServerProcess(unique_url(scheme), env=env, lang=lang)
                started[key] = stack.enter_context(server)
            return started[key]

        yield get


@pytest.mark.parametrize("env", sorted(ENVS))
@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_served_env_passes_check_env_and_checks_actions(
    scheme: str, lang: str, env: str, served: Served
) -> None:
    remote = RemoteEnv(served(scheme, lang, env).url, schema=env_schema(env))
    try:
        assert remote.observation_space == observation_space_of(env_schema(env))
        check_env(remote, skip_render_check=True)
        expected = local_trace(env, 11)
        observation, _ = remote.reset(seed=11)
        same_result(observation, 0.0, expected[0])
        for action, want in zip(GOOD_ACTIONS[env], expected[1:], strict=True):
            observation, reward, *_ = remote.step(action)
            same_result(observation, float(reward), want)
        for action, text in BAD_ACTIONS[env]:
            with pytest.raises(RemoteError, match="INVALID_ACTION") as info:
                remote.step(action)
            assert text in str(info.value)
        remote.step(GOOD_ACTIONS[env][0])  # the session still serves
    finally:
        remote.close()


@pytest.mark.parametrize("lang", LANGS)
def test_vector_env_batches_dict_observations_and_names_the_bad_env(lang: str) -> None:
    with ServerProcess(unique_url("unix"), env="reach", lang=lang, num_envs=3) as server:
        venv = RemoteVectorEnv(server.url, 3, schema=dictbox.SCHEMA)
        try:
            observation, _ = venv.reset(seed=5)
            assert observation["grid"].shape == (3, 2, 5, 5) and observation["vec"].shape == (3, 4)
            batched = venv.observation_space
            assert isinstance(batched, spaces.Dict) and batched["grid"].shape == (3, 2, 5, 5)
            actions = np.zeros((3, 2), np.float32)
            observation, rewards, *_ = venv.step(actions)
            assert rewards.shape == (3,)
            actions[2, 1] = np.nan
            with pytest.raises(RemoteError, match=r"INVALID_ACTION.*env 2: action \[0, NaN\]"):
                venv.step(actions)
        finally:
            venv.close()


def test_ppo_learns_a_few_hundred_steps_on_the_dict_box_env() -> None:
    from stable_baselines3 import PPO

    from transport.sb3 import RemoteVecEnv

    with ServerProcess(unique_url("unix"), env="reach", num_envs=2) as server:
        venv = RemoteVecEnv(server.url, 2, schema=dictbox.SCHEMA)
        try:
            model = PPO("MultiInputPolicy", venv, n_steps=64, batch_size=32, n_epochs=1, seed=0)
            model.learn(total_timesteps=256)
            assert model.num_timesteps >= 256
        finally:
            venv.close()


def test_ppo_takes_multidiscrete_actions() -> None:
    from stable_baselines3 import PPO

    from transport.sb3 import RemoteVecEnv

    with ServerProcess(unique_url("unix"), env="lock", lang="node", num_envs=2) as server:
        venv = RemoteVecEnv(server.url, 2, schema=multidiscrete.SCHEMA)
        try:
            model = PPO("MlpPolicy", venv, n_steps=32, batch_size=32, n_epochs=1, seed=0)
            model.learn(total_timesteps=64)
        finally:
            venv.close()


# -- setups a server cannot serve fail at start ----------------------------------------------------


# (worker pools carry array actions now: tests/test_pool_actions.py)


def test_node_server_refuses_an_action_type_it_cannot_carry_at_start(tmp_path: Path) -> None:
    """A hand-made IR (the compiler refuses it) with a bool[2] action: exit before ready."""
    import json

    from transport.generated import tetris
    from transport.schema.ir import ir_from_json

    data = tetris.SCHEMA.ir.to_json()
    data.pop("fingerprint")
    data["structs"]["StepRequest"]["size"] = 2
    data["structs"]["StepRequest"]["fields"][0].update(type="bool[2]", size=2, count=2)
    # the slot's copy of the request shrinks with it (the IR loader checks every size)
    next(f for f in data["structs"]["ShmSlot"]["fields"] if f["name"] == "request")["size"] = 2
    data["fingerprint"] = ir_from_json(data).fingerprint_hex
    path = tmp_path / "bool_action.json"
    path.write_text(json.dumps(data))
    url = unique_unix_url()
    command = [sys.executable, "-m", "transport.tools.serve_cli", url, "--env", "echo"]
    command += ["--lang", "node", "--schema", str(path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "ready" not in done.stdout
    assert "StepRequest" in done.stderr or "action" in done.stderr, done.stderr
    assert "bool" in done.stderr and not Path(url.removeprefix("unix://")).exists()


NODE_ARRAY_CLIENT = """
const { connect } = require(process.argv[1]);
const actions = JSON.parse(process.argv[3]);
const plain = (value) => Object.fromEntries(
  Object.entries(value).map(([k, v]) => [k, ArrayBuffer.isView(v) ? Array.from(v) : v]),
);
(async () => {
  const client = await connect(process.argv[2]);  // no schema: discovered in the handshake
  const out = { results: [plain(await client.reset(11n, { copy: true }))] };
  for (const action of actions.good) {
    out.results.push(plain(await client.step(action, { copy: true })));
  }
  try {
    await client.step(actions.bad);
    out.bad = "answered";
  } catch (error) {
    out.bad = `${error.name}: ${error.message}`;
  }
  out.after = plain(await client.step(actions.good[0], { copy: true })).reward;
  await client.close();
  process.stdout.write(JSON.stringify(out));
})().catch((error) => { process.stdout.write(JSON.stringify({ failed: String(error.stack) })); });
"""


@pytest.mark.parametrize("env", sorted(ENVS))
@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_node_client_sends_array_actions(scheme: str, lang: str, env: str, served: Served) -> None:
    """The Node client steps Box and MultiDiscrete envs (arrays of numbers) with the schema it
    discovered: the same values as the env run here; a bad action is INVALID_ACTION."""
    index = str(ROOT / "node_bridge" / "dist" / "index.js")
    actions = {
        "good": [a.tolist() for a in GOOD_ACTIONS[env]],
        "bad": BAD_ACTIONS[env][-1][0].tolist(),
    }
    done = subprocess.run(
        [
            "node",
            "-e",
            NODE_ARRAY_CLIENT,
            index,
            served(scheme, lang, env).url,
            json.dumps(actions),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    got = json.loads(done.stdout or "{}")
    assert "failed" not in got and done.returncode == 0, (got, done.stderr[-2000:])
    for result, expected in zip(got["results"], local_trace(env, 11), strict=True):
        keys = ("grid", "vec") if env == "reach" else ("observation",)
        observation = {  # TS views are flat, row-major
            k: np.asarray(result[k], np.float32).reshape(np.shape(expected[k])) for k in keys
        }
        same_result(
            observation if env == "reach" else observation["observation"],
            float(result["reward"]),
            expected,
        )
    assert got["bad"].startswith("RemoteError") and "INVALID_ACTION" in got["bad"], got["bad"]
    assert BAD_ACTIONS[env][-1][1] in got["bad"]
