"""Misuses of ``serve_gym`` / ``gym_server`` / ``transport-serve --gym`` that a tester found
(2026-11-27): each is refused, or answered, with a message that says what happened.

- A factory that returns one gymnasium env made beforehand (``lambda: env``, or new wrappers
  around it) is refused, as ``transport.Server`` refuses such a factory: every env of a
  connection would step the same env.
- An observation that lacks a Dict key is the wrapped "does not fit its observation_space"
  env error, not a bare ``KeyError`` from the in-place path.
- A spaces' description too long for the schema names the leaf that makes it long.
- ``transport-serve 'shm://NAME?num_envs=2' --num-envs 4`` is a start refusal: exit 2.
- The episode collector gives a Discrete observation the adapters' shape (no trailing axis).
"""

from __future__ import annotations

import os
import pickle
import select
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

import transport
from transport.errors import EnvError, SchemaError
from transport.gym import RemoteVectorEnv
from transport.gym_schema import schema_of_spaces
from transport.gym_serve import gym_factory, gym_server

from .servers import ROOT, unique_url

SHARED_ID = "tests.test_gym_serve_misuse:TransportShared-v0"
SHARED_CARTPOLE: list[Any] = []


def _shared_cartpole() -> Any:
    """A registered entry point that hands out one env made once (the misuse)."""
    if not SHARED_CARTPOLE:
        SHARED_CARTPOLE.append(gymnasium.make("CartPole-v1").unwrapped)
    return SHARED_CARTPOLE[0]


gymnasium.register(id="TransportShared-v0", entry_point=_shared_cartpole)


def _no_leftovers(url: str) -> None:
    path = Path(url.removeprefix("unix://"))
    if url.startswith("unix://") and path.exists():
        path.unlink()


# -- 1. a factory that returns one env ----------------------------------------------------------


@pytest.mark.parametrize("wrapped", [False, True], ids=["same-object", "new-wrappers"])
def test_a_factory_returning_one_env_made_beforehand_is_refused(wrapped: bool) -> None:
    env = gymnasium.make("CartPole-v1")
    factory = (lambda: gymnasium.wrappers.TimeLimit(env, 50)) if wrapped else (lambda: env)
    url = unique_url("unix")
    try:
        with pytest.raises(ValueError) as caught:
            with gym_server(factory, url, num_envs=2).start() as server:
                # before the fix: served, both envs stepping the one CartPole
                RemoteVectorEnv(server.bound_url).close()
        text = str(caught.value)
        assert "the env factory" in text and "<lambda>" in text
        assert "returned an env object it had returned before (CartPoleEnv" in text
        assert "a factory must make a new env on every call" in text
        assert ("inside new wrappers" in text) == wrapped
    finally:
        env.close()
        _no_leftovers(url)


def test_a_good_factory_still_serves_and_pickles() -> None:
    """The refusal keeps nothing alive and travels to worker processes as a fresh factory."""
    factory = gym_factory("CartPole-v1")
    copy = pickle.loads(pickle.dumps(factory))
    assert copy is not factory and copy.source == "CartPole-v1"
    first, second = copy(), copy()
    try:
        assert first.env.unwrapped is not second.env.unwrapped
    finally:
        first.close()
        second.close()
    url = unique_url("unix")
    with gym_server(lambda: gymnasium.make("CartPole-v1"), url, num_envs=2).start() as server:
        envs = RemoteVectorEnv(server.bound_url)
        try:
            obs, _ = envs.reset(seed=0)
            assert not np.array_equal(obs[0], obs[1])  # two envs, two seeds
        finally:
            envs.close()
    # a refused factory is refused each time, with the same words
    shared = gymnasium.make("CartPole-v1")
    bad = gym_factory(lambda: shared)
    try:
        bad().env  # noqa: B018  # the first one is new
        for _ in range(2):
            with pytest.raises(ValueError, match="returned an env object it had returned before"):
                bad()
    finally:
        shared.close()


def _serve_cli(*args: str) -> tuple[int | None, str]:
    """transport-serve ARGS: (its exit status, stderr), or (None, "ready ...") when it served
    (then it is stopped)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "transport.tools.serve_cli", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return proc.returncode, proc.stderr.read()
            ready, _, _ = select.select([proc.stdout], [], [], 0.2)
            if ready:
                line = proc.stdout.readline()
                if line.startswith("ready "):
                    return None, line
        raise AssertionError("transport-serve neither served nor exited within 90 s")
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_transport_serve_gym_refuses_an_entry_point_returning_one_env() -> None:
    url = unique_url("unix")
    try:
        code, text = _serve_cli(url, "--gym", SHARED_ID, "--num-envs", "2")
    finally:
        _no_leftovers(url)
    assert code == 2, text
    assert text.count("\n") == 1 and "Traceback" not in text, text
    assert "returned an env object it had returned before (CartPoleEnv" in text


# -- 2. an observation that does not fit -------------------------------------------------------


class DictMissing(gymnasium.Env[dict[str, Any], int]):
    """Its step's Dict observation lacks key "b"."""

    observation_space = spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Discrete(3)})
    action_space = spaces.Discrete(3)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        return {"a": 0, "b": 1}, {}

    def step(self, action: int) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        return {"a": 1}, 0.0, False, False, {}


class TupleShort(gymnasium.Env[tuple[Any, ...], int]):
    """Its step's Tuple observation has one item of two."""

    observation_space = spaces.Tuple((spaces.Discrete(2), spaces.Box(0, 1, (2,), np.float32)))
    action_space = spaces.Discrete(3)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        super().reset(seed=seed)
        return (0, np.zeros(2, np.float32)), {}

    def step(self, action: int) -> tuple[tuple[Any, ...], float, bool, bool, dict[str, Any]]:
        return (1,), 0.0, False, False, {}


@pytest.mark.parametrize("env_class", [DictMissing, TupleShort])
def test_an_observation_missing_a_leaf_is_the_wrapped_env_error(env_class: Any) -> None:
    url = unique_url("unix")
    with gym_server(env_class, url, num_envs=2).start() as server:
        envs = RemoteVectorEnv(server.bound_url)
        try:
            envs.reset(seed=0)
            with pytest.raises(EnvError) as caught:
                envs.step(np.array([0, 1]))
            message = str(caught.value).split("--- server traceback")[0]
            assert "returned an observation that does not fit its observation_space" in message
            assert caught.value.env_id == 0
            envs.reset(seed=0)  # the server goes on
        finally:
            envs.close()


# -- 3. a description too long -----------------------------------------------------------------


def test_a_too_long_description_names_the_leaf_and_the_remedy() -> None:
    low = np.r_[-np.inf, np.arange(30000.0)].astype(np.float32)
    big = spaces.Box(low, np.inf, dtype=np.float32)
    with pytest.raises(SchemaError) as caught:
        schema_of_spaces(spaces.Tuple((spaces.Discrete(2), big)), spaces.Discrete(2))
    text = str(caught.value)
    assert "the spaces' description is too long" in text and "at most 65534" in text
    assert "observation_space[1], a Box of shape (30001,) and dtype float32" in text
    assert "its low differs between elements" in text
    assert "the same low and the same high on every element" in text
    many = spaces.MultiDiscrete(np.full(30000, 3))
    with pytest.raises(SchemaError, match=r"observation_space\['m'\], a MultiDiscrete of shape"):
        schema_of_spaces(spaces.Dict({"m": many, "d": spaces.Discrete(2)}), spaces.Discrete(2))


# -- 4. transport-serve: a num_envs mismatch is a start refusal ---------------------------------


@pytest.mark.parametrize("served", [["--gym", "CartPole-v1"], ["--env", "echo"]])
def test_transport_serve_num_envs_mismatch_exits_2(served: list[str]) -> None:
    name = f"test-{uuid.uuid4().hex[:12]}"
    url = f"shm://{name}?num_envs=2"
    done = subprocess.run(
        [sys.executable, "-m", "transport.tools.serve_cli", url, *served, "--num-envs", "4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert not os.path.exists(f"/dev/shm/transport-{name}")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"shm://{name}?num_envs=2 asks for 2 envs but --num-envs is 4" in done.stderr


# -- 5. the collector's shapes ------------------------------------------------------------------


def test_the_collector_gives_a_discrete_observation_the_adapters_shape() -> None:
    url = unique_url("unix")
    with gym_server("FrozenLake-v1", url, num_envs=2).start() as server:
        envs = RemoteVectorEnv(server.bound_url)
        try:
            want = envs.reset(seed=0)[0].shape[1:]  # () per env
        finally:
            envs.close()
        seen: list[tuple[int, ...]] = []

        def policy(obs: Any, env_ids: np.ndarray) -> np.ndarray:
            seen.append(obs.shape)
            return np.zeros(len(env_ids), np.int64)

        with transport.connect(server.bound_url, autoreset="next_step") as client:
            batch = transport.request_episodes(client, 3, policy, 8, seed=0)
    k = batch.mask.shape[1]
    assert want == ()
    assert seen[0] == (2,)
    assert batch.observations.shape == (3, k) and batch.observations.dtype == np.int64
    assert batch.final_observations.shape == (3,)


def test_the_collector_keeps_nested_leaves_by_field_name_with_their_shapes() -> None:
    """Dict and Tuple leaves: flat by field name, each the shape of its space."""
    url = unique_url("unix")
    with gym_server("tests.test_gym_serve:TransportRich-v0", url, num_envs=2).start() as server:
        with transport.connect(server.bound_url, autoreset="next_step") as client:

            def policy(obs: Any, env_ids: np.ndarray) -> np.ndarray:
                assert obs["pair_0"].shape == (len(env_ids),)  # a Discrete leaf
                assert obs["pair_1"].shape == (len(env_ids),)  # a Box of shape ()
                return np.zeros((len(env_ids), 3), np.int8)

            batch = transport.request_episodes(client, 2, policy, 12, seed=0)
    obs = batch.observations
    k = batch.mask.shape[1]
    assert isinstance(obs, dict)
    shapes = {name: rows.shape for name, rows in obs.items()}
    assert shapes["image"] == (2, k, 4, 5, 3) and shapes["flags"] == (2, k, 5)
    assert shapes["dials"] == (2, k, 2) and shapes["pos"] == (2, k, 2)
    assert shapes["pair_0"] == (2, k) and shapes["pair_1"] == (2, k)
    assert list(obs) == list(batch.final_observations)  # type: ignore[arg-type]
