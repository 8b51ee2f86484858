"""Worker pools carry every action kind the in-process runtime carries (issue 23): Box
(``f32[2]``, ``f32[1]``, a Dict observation), MultiDiscrete, lock-step and asynchronous
(send / recv), auto-reset finals, seeds and env errors byte for byte as in process, for both
server languages over the backends; and a real gymnasium env (Pendulum-v1, nobody here wrote it)
served with ``--workers 2`` steps exactly as gymnasium's own SyncVectorEnv on the same seeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import transport.api as api
from transport.codec import Schema
from transport.errors import EnvError
from transport.protocol import AutoReset
from transport.runtime.core import action_values
from transport.runtime.env import Spaces
from transport.runtime.pool import WorkerPool

from .servers import ServerProcess, unique_url

NUM_ENVS = 4
ROUNDS = {"reach": 55, "lock": 25}
"""Steps per trace: past the truncation (reach after 50 steps, lock after 20), so every env
auto-resets at least once (SAME_STEP finals, NEXT_STEP reset rows) and steps on after it."""
MODES = ["next_step", "same_step"]


def actions_for(env: str, rng: np.random.Generator, n: int) -> np.ndarray:
    """A batch of n actions shaped (n, *action_shape) in the action's dtype."""
    if env == "reach":
        # quarters: exact in f32, so every language and path sees the same values
        return (rng.integers(-4, 5, size=(n, 2)) / 4).astype(np.float32)
    return np.stack(
        [rng.integers(0, 3, n), rng.integers(0, 4, n), rng.integers(0, 5, n)], axis=1
    ).astype(np.uint8)


def row_bytes(results: Any, k: Any) -> bytes:
    """Every field of row ``k`` (observations, reward, terminated, truncated, ...) as bytes."""
    return b"".join(np.ascontiguousarray(results[name][k]).tobytes() for name in results)


def lockstep_trace(url: str, env: str, mode: str) -> list[bytes]:
    out: list[bytes] = []
    rng = np.random.default_rng(7)
    with api.connect(url, timeout=30, autoreset=mode) as client:
        result = client.reset(seed=11)
        out += [row_bytes(result, i) for i in range(NUM_ENVS)]
        for _ in range(ROUNDS[env]):
            result = client.step(actions_for(env, rng, NUM_ENVS))
            out += [row_bytes(result, i) for i in range(NUM_ENVS)]
            out += sorted(bytes([i]) + row_bytes(f, ()) for i, f in client.finals)
    return out


def async_trace(url: str, env: str, mode: str, batch: int) -> list[bytes]:
    """The lock-step schedule with send / recv(batch): rows put back in env order each round."""
    out: list[bytes] = []
    rng = np.random.default_rng(7)
    with api.connect(url, timeout=30, autoreset=mode) as client:
        client.async_reset(seed=11)
        for rnd in range(ROUNDS[env] + 1):
            rows: dict[int, bytes] = {}
            finals: list[bytes] = []
            while len(rows) < NUM_ENVS:
                got = client.recv(batch, copy=True)
                for k, i in enumerate(got.env_ids.tolist()):
                    assert i not in rows, f"env {i} came back twice"
                    rows[i] = row_bytes(got.results, k)
                finals += [bytes([i]) + row_bytes(f, ()) for i, f in got.finals]
            out += [rows[i] for i in range(NUM_ENVS)] + sorted(finals)
            if rnd == ROUNDS[env]:
                break
            client.send(actions_for(env, rng, NUM_ENVS), list(range(NUM_ENVS)))
    return out


@pytest.mark.parametrize("env", ["reach", "lock"])
@pytest.mark.parametrize("scheme", ["unix", "shm"])
@pytest.mark.parametrize("lang", ["python", "node"])
def test_pool_steps_array_actions_as_in_process(lang: str, scheme: str, env: str) -> None:
    """reach: a Box f32[2] action and a Dict observation (grid f32[2,5,5], vec f32[4]); lock: a
    MultiDiscrete u8[3] action. workers=2 gives the in-process bytes, lock-step and async. One
    socket backend and shm: the backends only move bytes (every backend: test_contract.py)."""
    expected: dict[str, list[bytes]] = {}
    with ServerProcess(unique_url(scheme), env=env, lang=lang, num_envs=NUM_ENVS) as local:
        for mode in MODES:
            expected[mode] = lockstep_trace(local.url, env, mode)
            assert async_trace(local.url, env, mode, NUM_ENVS) == expected[mode]
    # the trace has auto-resets: SAME_STEP finals (one at least per env), NEXT_STEP reset rows
    assert len(expected["same_step"]) >= len(expected["next_step"]) + NUM_ENVS
    with ServerProcess(
        unique_url(scheme), env=env, lang=lang, num_envs=NUM_ENVS, extra=["--workers", "2"]
    ) as pooled:
        for mode in MODES:
            assert lockstep_trace(pooled.url, env, mode) == expected[mode], mode
            assert async_trace(pooled.url, env, mode, NUM_ENVS // 2) == expected[mode], mode


@pytest.mark.parametrize("lang", ["python", "node"])
def test_pool_refuses_bad_box_actions_as_in_process(lang: str) -> None:
    """The action checks are the runtime's, before any env steps: the same INVALID_ACTION."""
    texts = []
    for extra in ([], ["--workers", "2"]):
        with (
            ServerProcess(unique_url("unix"), env="reach", lang=lang, num_envs=2, extra=extra) as s,
            api.connect(s.url, timeout=30) as client,
        ):
            client.reset(seed=1)
            bad = np.array([[0.5, 0.5], [np.nan, 0.0]], np.float32)
            with pytest.raises(Exception) as info:
                client.step(bad)
            texts.append(str(info.value))
            good = client.step(np.array([[0.5, 0.5], [0.25, 0.0]], np.float32), copy=True)
            texts.append(row_bytes(good, 0).hex() + row_bytes(good, 1).hex())
    assert "env 1: action [NaN, 0] is not inside" in texts[0]
    assert texts[:2] == texts[2:]


# -- a Box-action env that raises: recovery in worker processes as in process ---------------------

BOOM = 0.75  # move[0] == 0.75 raises


class ExplodingReach:
    """ReachEnv (dictbox) whose step raises for move[0] == 0.75."""

    def __init__(self) -> None:
        from transport.envs.rich_spaces import ReachEnv

        self.env = ReachEnv()

    def spaces(self) -> Spaces:
        return self.env.spaces()

    def reset(self, seed: int | None = None) -> Any:
        return self.env.reset(seed)

    def step(self, action: Any) -> Any:
        assert isinstance(action, np.ndarray) and action.dtype == np.float32, action
        assert action.shape == (2,), action.shape
        if float(action[0]) == BOOM:
            raise ValueError(f"boom at {action.tolist()}")
        return self.env.step(action)


@pytest.mark.parametrize("scheme", ["unix", "shm"])
def test_pool_env_errors_with_box_actions_as_in_process(scheme: str) -> None:
    """An env that raises on a Box action: the same ENV_ERROR text and the same rows after
    recovery (the env is reset) with workers=2 as in process, lock-step and async."""
    traces = []
    for extra in ([], ["--workers", "2"]):
        trace: list[str] = []
        with (
            ServerProcess(
                unique_url(scheme),
                env="tests.test_pool_actions:ExplodingReach",
                num_envs=NUM_ENVS,
                extra=["--schema", "schema/dictbox.toml", *extra],
            ) as s,
            api.connect(s.url, timeout=30, autoreset="same_step") as client,
        ):
            client.reset(seed=5)
            actions = np.full((NUM_ENVS, 2), 0.25, np.float32)
            for rnd in range(6):
                actions[2, 0] = BOOM if rnd == 3 else -0.25
                try:
                    result = client.step(actions.copy())
                    trace += [row_bytes(result, i).hex() for i in range(NUM_ENVS)]
                except EnvError as exc:
                    trace.append(f"{exc.env_id}: {str(exc).split(' [remote traceback')[0]}")
            client.async_reset(seed=9)
            got = client.recv(NUM_ENVS, copy=True)
            actions[2, 0] = BOOM
            client.send(actions.copy(), list(range(NUM_ENVS)))
            rows: dict[int, str] = {}
            while len(rows) < NUM_ENVS:
                try:
                    got = client.recv(1, copy=True)
                except EnvError as exc:
                    rows[2] = f"{exc.env_id}: {str(exc).splitlines()[0]}"
                    continue
                for k, i in enumerate(got.env_ids.tolist()):
                    rows[i] = row_bytes(got.results, k).hex()
            trace += [rows[i] for i in range(NUM_ENVS)]
        traces.append(trace)
    assert any("boom at [0.75" in line for line in traces[0]), traces[0]
    assert traces[1] == traces[0]


# -- WorkerPool directly: the actions reach the envs with their dtype and shape ------------------


PROBE_SCHEMA = """
[schema]
name = "probe"
version = 1
layout = "natural"
[env]
[structs.StepResult]
fields = [
  {{ name = "observation", type = "f64[16]", role = "observation" }},
  {{ name = "reward",      type = "f64",     role = "reward" }},
  {{ name = "terminated",  type = "bool",    role = "terminated" }},
]
[structs.StepRequest]
fields = [{{ name = "action", type = "{action}", role = "action"{attrs} }}]
"""


class ActionProbe:
    """Writes what its action is into its observation: [1 int / 2 ndarray, ndim, *shape,
    *values, dtype's itemsize]."""

    def spaces(self) -> Spaces:
        return Spaces(obs_n=16, act_n=92)

    def _result(self, values: list[float]) -> dict[str, Any]:
        obs = np.zeros(16, np.float64)
        obs[: len(values)] = values
        return {"observation": obs, "reward": 0.0, "terminated": False}

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        return self._result([])

    def step(self, action: Any) -> dict[str, Any]:
        kind = 1.0 if type(action) is int else 2.0 if isinstance(action, np.ndarray) else 3.0
        arr = np.asarray(action)
        size = float(arr.dtype.itemsize) if isinstance(action, np.ndarray) else 0.0
        return self._result([kind, float(arr.ndim), *arr.shape, *arr.astype(float).flat, size])


def probe_schema(action_type: str) -> Schema:
    from transport.schema.compiler import compile_schema

    attrs = ", high = 65535" if action_type.startswith("u16") else ""
    text = PROBE_SCHEMA.format(action=action_type, attrs=attrs)
    return Schema(compile_schema(text, "probe.toml"))


@pytest.mark.parametrize(
    ("action_type", "values"),
    [
        ("i32", np.array([3, 91], np.int32)),
        ("f64[2,3]", np.arange(12, dtype=np.float64).reshape(2, 2, 3) / 8),
        ("f32[1]", np.array([[0.5], [-1.5]], np.float32)),
        ("u16[4]", np.array([[1, 2, 3, 65535], [0, 9, 8, 7]], np.uint16)),
    ],
)
def test_worker_pool_hands_envs_the_in_process_action(action_type: str, values: np.ndarray) -> None:
    """A multi-dimensional Box action reaches a worker's env as an array of its shape and dtype
    (an int for Discrete): what ``action_values`` makes in process, lock-step and async."""
    schema = probe_schema(action_type)
    codec = schema["StepResult"]
    dest = np.zeros(2, dtype=codec.dtype)
    finals = np.zeros(2, dtype=codec.dtype)
    expected = [ActionProbe().step(a)["observation"] for a in action_values(values)]
    pool = WorkerPool(ActionProbe, schema, "StepResult", 2, 2, dest, finals)
    try:
        assert pool.reset([None, None]) == []
        ended, failures = pool.step(values, AutoReset.DISABLED)
        assert (ended, failures) == ([], [])
        for i in range(2):
            assert dest[i]["observation"].tobytes() == expected[i].tobytes()
        dest[:] = 0
        pool.submit([1, 0], [values[1].copy(), values[0].copy()], AutoReset.DISABLED)
        done = pool.poll(2)
        assert sorted(i for i, _, _ in done) == [0, 1] and all(e is None for _, _, e in done)
        for i in range(2):
            assert dest[i]["observation"].tobytes() == expected[i].tobytes()
    finally:
        pool.close()


# -- a real gymnasium env, nobody here wrote it -------------------------------------------------

PENDULUM_SCHEMA = """
[schema]
name = "pendulum"
version = 1
layout = "natural"

[env]

[structs.StepResult]
fields = [
  { name = "observation", type = "f32[3]", role = "observation" },
  { name = "reward",      type = "f64",    role = "reward" },
  { name = "terminated",  type = "bool",   role = "terminated" },
  { name = "truncated",   type = "bool",   role = "truncated" },
]

[structs.StepRequest]
fields = [{ name = "torque", type = "f32[1]", role = "action", low = -2.0, high = 2.0 }]
"""


class Pendulum:
    """gymnasium's Pendulum-v1 (TimeLimit 200) as a transport env."""

    def __init__(self) -> None:
        self.env = gym.make("Pendulum-v1")

    def spaces(self) -> Spaces:
        return Spaces(obs_n=3, act_n=1)  # act_n: the action's element count

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        obs, _ = self.env.reset(seed=seed)
        return {"observation": obs, "reward": 0.0, "terminated": False, "truncated": False}

    def step(self, action: Any) -> dict[str, Any]:
        obs, reward, terminated, truncated, _ = self.env.step(action)
        return {
            "observation": obs,
            "reward": float(reward),
            "terminated": terminated,
            "truncated": truncated,
        }

    def close(self) -> None:
        self.env.close()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scheme", ["unix", "shm"])
def test_gymnasium_pendulum_in_workers_equals_sync_vector_env(
    tmp_path: Path, scheme: str, mode: str
) -> None:
    """Pendulum-v1 served with --workers 2 (lock-step, then async) steps exactly as gymnasium's
    SyncVectorEnv with the same seeds (env i: seed + i), past the 200-step truncation."""
    schema_file = tmp_path / "pendulum.toml"
    schema_file.write_text(PENDULUM_SCHEMA)
    steps = 205
    rng = np.random.default_rng(3)
    plan = rng.uniform(-2.0, 2.0, size=(steps, NUM_ENVS, 1)).astype(np.float32)
    autoreset = gym.vector.AutoresetMode.NEXT_STEP
    if mode == "same_step":
        autoreset = gym.vector.AutoresetMode.SAME_STEP
    reference = gym.vector.SyncVectorEnv(
        [lambda: gym.make("Pendulum-v1") for _ in range(NUM_ENVS)], autoreset_mode=autoreset
    )
    obs, _ = reference.reset(seed=100)
    want: list[tuple[np.ndarray, Any]] = [(obs.copy(), None)]
    for t in range(steps):
        obs, reward, terminated, truncated, info = reference.step(plan[t])
        want.append((obs.copy(), (reward.copy(), terminated.copy(), truncated.copy(), info)))
    reference.close()
    assert want[201][1] is not None and want[200][1][2].all()  # truncated at 200

    with ServerProcess(
        unique_url(scheme),
        env="tests.test_pool_actions:Pendulum",
        num_envs=NUM_ENVS,
        extra=["--schema", str(schema_file), "--workers", "2"],
        ready_timeout=60,
    ) as server:
        with api.connect(server.url, timeout=30, autoreset=mode) as client:
            result = client.reset(seed=100)
            assert result.observation.tobytes() == want[0][0].tobytes()
            for t in range(steps):
                result = client.step(plan[t])
                check_step(t, mode, want[t + 1], result, dict(client.finals))
        with api.connect(server.url, timeout=30, autoreset=mode) as client:
            client.async_reset(seed=100)
            got = client.recv(NUM_ENVS, copy=True)
            order = np.argsort(got.env_ids)
            assert got.results.observation[order].tobytes() == want[0][0].tobytes()
            for t in range(steps):
                client.send(plan[t], list(range(NUM_ENVS)))
                rows: dict[int, Any] = {}
                finals: dict[int, Any] = {}
                while len(rows) < NUM_ENVS:
                    got = client.recv(1, copy=True)
                    for k, i in enumerate(got.env_ids.tolist()):
                        rows[i] = {name: got.results[name][k] for name in got.results}
                    finals.update(dict(got.finals))
                batch = {
                    name: np.stack([rows[i][name] for i in range(NUM_ENVS)]) for name in rows[0]
                }
                check_step(t, mode, want[t + 1], batch, finals)


def check_step(t: int, mode: str, want: Any, got: Any, finals: dict[int, Any]) -> None:
    """One step of the server against gymnasium's (obs, (reward, terminated, truncated, info))."""
    obs, (reward, terminated, truncated, info) = want
    assert np.asarray(got["observation"]).tobytes() == obs.tobytes(), t
    if mode == "next_step":
        assert np.asarray(got["reward"]).tobytes() == reward.tobytes(), t
        assert np.array_equal(np.asarray(got["truncated"], bool), truncated), t
        assert np.array_equal(np.asarray(got["terminated"], bool), terminated), t
        return
    ended = np.flatnonzero(terminated | truncated).tolist()
    assert sorted(finals) == ended, t
    for i in range(len(obs)):
        row = finals[i] if i in finals else None
        if row is None:
            assert float(np.asarray(got["reward"])[i]) == reward[i], t
            continue
        assert np.asarray(row["observation"]).tobytes() == info["final_obs"][i].tobytes(), t
        assert float(row["reward"]) == reward[i] and bool(row["truncated"]) == truncated[i], t
