"""Episode ends through the adapters match gymnasium's and SB3's own wrappers, step by step.

Regression (issue 15, item 1): with a schema whose result has a ``done`` role (terminated or
truncated) and a ``truncated`` field, a time-limit end came back as ``terminated=True,
truncated=True`` (gymnasium) and ``TimeLimit.truncated=False`` (SB3), so trainers did not
bootstrap. The rules: done = terminated or truncated; terminated = done and not truncated.
A schema with ``terminated`` and ``truncated`` roles (no ``done``) ends an episode on either:
the server's auto-reset must see a truncation too.

The same env runs locally (gymnasium ``SyncVectorEnv``, SB3 ``DummyVecEnv``) and behind a
real server (Unix socket), and every step of both is compared.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import transport
from transport.codec import Schema
from transport.generated import tetris
from transport.gym import RemoteEnv, RemoteVectorEnv
from transport.runtime.env import Spaces
from transport.schema.compiler import compile_schema

NUM_ENVS = 3
STEPS = 60
MAX_STEPS = 5  # the time limit: most episodes end truncated
OBS_N, ACT_N = 214, 40
TETRIS_TOML = Path(__file__).resolve().parents[1] / "schema" / "tetris.toml"


def terminated_schema() -> Schema:
    """tetris with ``terminated`` + ``truncated`` roles instead of ``done`` + ``truncated``."""
    text = TETRIS_TOML.read_text()
    done = '{ name = "done",        type = "u8",       offset = 900, role = "done" }'
    assert done in text
    text = text.replace(done, done.replace('role = "done"', 'role = "terminated"'))
    return Schema(compile_schema(text, "tetris_terminated.toml"))


SCHEMAS = {"done": tetris.SCHEMA, "terminated": terminated_schema()}


class TimeLimitWalk:
    """A seeded walk whose episodes terminate by chance or are truncated at MAX_STEPS.

    ``done_field``: what the result's ``done`` byte means: "done" (terminated or truncated, the
    tetris schema's role) or "terminated" (terminated only).
    """

    def __init__(self, done_field: str = "done") -> None:
        self.done_field = done_field
        self.rng = np.random.default_rng(0)
        self.t = 0
        self.total = 0
        self.terminated = False
        self.truncated = False

    def spaces(self) -> Spaces:
        return Spaces(OBS_N, ACT_N)

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.terminated = self.truncated = False
        return self._result(0.0)

    def step(self, action: int) -> dict[str, Any]:
        self.t += 1
        self.total += 1
        self.terminated = bool(self.rng.random() < 0.12)
        self.truncated = not self.terminated and self.t >= MAX_STEPS
        return self._result(float(action % 7) + 0.5)

    def _result(self, reward: float) -> dict[str, Any]:
        obs = np.zeros(OBS_N, dtype=np.float32)
        obs[0] = self.t
        obs[1] = self.rng.random()  # where the RNG stream is
        done = self.terminated or (self.truncated and self.done_field == "done")
        return {
            "observation": obs,
            "action_mask": np.ones(ACT_N, dtype=np.uint8),
            "reward": reward,
            "done": int(done),
            "truncated": int(self.truncated),
            "lines": self.t % 4,
            "piece": self.t % 7,
            "total_lines": self.total,
            "pieces": self.t,
        }


class LocalWalk(gymnasium.Env[np.ndarray, np.int64]):
    """The same walk as a plain gymnasium env: the reference the adapters must match."""

    def __init__(self) -> None:
        self.walk = TimeLimitWalk()
        self.observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (OBS_N,), np.float32)
        self.action_space = gymnasium.spaces.Discrete(ACT_N)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        result = self.walk.reset(seed)
        return result["observation"], self._info(result)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        result = self.walk.step(int(action))
        walk = self.walk
        obs, info = result["observation"], self._info(result)
        return obs, float(result["reward"]), walk.terminated, walk.truncated, info

    @staticmethod
    def _info(result: dict[str, Any]) -> dict[str, Any]:
        return {name: result[name] for name in ("lines", "piece", "total_lines", "pieces")}


@pytest.fixture(scope="module", params=["done", "terminated"])
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A real server (Unix socket, in this process) of NUM_ENVS walks under either schema."""
    kind = str(request.param)
    path = f"/tmp/transport-test-ends-{uuid.uuid4().hex[:10]}.sock"
    server = transport.Server(
        lambda: TimeLimitWalk(kind), f"unix://{path}", schema=SCHEMAS[kind], num_envs=NUM_ENVS
    ).start()
    try:
        yield f"unix://{path}?{kind}"
    finally:
        server.close()


def split(url: str) -> tuple[str, Schema]:
    address, _, kind = url.partition("?")
    return address, SCHEMAS[kind]


def actions_for(step: int) -> np.ndarray:
    return (np.arange(NUM_ENVS) * 3 + step) % ACT_N


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_vector_env_matches_sync_vector_env(url: str, mode: AutoresetMode) -> None:
    address, schema = split(url)
    remote = RemoteVectorEnv(address, NUM_ENVS, schema=schema, autoreset_mode=mode)
    local = SyncVectorEnv([LocalWalk for _ in range(NUM_ENVS)], autoreset_mode=mode)
    try:
        obs_r, _ = remote.reset(seed=11)
        obs_l, _ = local.reset(seed=11)
        assert np.array_equal(obs_r, obs_l)
        truncations = 0
        for k in range(STEPS):
            actions = actions_for(k)
            obs_r, rew_r, term_r, trunc_r, info_r = remote.step(actions)
            obs_l, rew_l, term_l, trunc_l, info_l = local.step(actions)
            where = f"step {k}"
            assert np.array_equal(term_r, term_l), where
            assert np.array_equal(trunc_r, trunc_l), where
            assert np.array_equal(rew_r, rew_l), where
            assert np.array_equal(obs_r, obs_l), where
            for name in ("lines", "piece", "total_lines", "pieces"):
                assert np.array_equal(info_r[name], info_l[name]), (where, name)
            if mode == AutoresetMode.SAME_STEP:
                assert ("final_obs" in info_r) == ("final_obs" in info_l), where
                if "final_obs" in info_l:  # gymnasium's format: objects, None where none ended
                    ended = info_l["_final_obs"]
                    assert np.array_equal(info_r["_final_obs"], ended), where
                    assert info_r["final_obs"].dtype == info_l["final_obs"].dtype == object
                    for got, want in zip(info_r["final_obs"], info_l["final_obs"], strict=True):
                        assert (got is None) == (want is None), where
                        assert want is None or np.array_equal(got, want), where
                    for name in ("lines", "pieces"):
                        want_info = info_l["final_info"]
                        assert np.array_equal(info_r["final_info"][name], want_info[name])
                        assert np.array_equal(
                            info_r["final_info"]["_" + name], want_info["_" + name]
                        )
            truncations += int(trunc_l.sum())
        assert truncations >= NUM_ENVS  # the time limit was exercised
    finally:
        remote.close()
        local.close()


def test_remote_env_matches_the_local_env(url: str) -> None:
    _, schema = split(url)
    kind = url.partition("?")[2]
    path = f"/tmp/transport-test-ends-{uuid.uuid4().hex[:10]}.sock"
    server = transport.Server(lambda: TimeLimitWalk(kind), f"unix://{path}", schema=schema)
    server.start()  # RemoteEnv needs a 1-env server
    try:
        remote = RemoteEnv(f"unix://{path}", schema=schema)
        local = LocalWalk()
        try:
            assert np.array_equal(remote.reset(seed=3)[0], local.reset(seed=3)[0])
            truncations = 0
            for k in range(STEPS):
                got = remote.step(k % ACT_N)
                want = local.step(k % ACT_N)
                assert np.array_equal(got[0], want[0]) and got[1:4] == want[1:4], f"step {k}"
                assert got[4] == want[4]
                if got[2] or got[3]:
                    truncations += int(got[3])
                    assert np.array_equal(remote.reset()[0], local.reset()[0])
            assert truncations >= 2
        finally:
            remote.close()
    finally:
        server.close()


def test_sb3_vec_env_matches_dummy_vec_env(url: str) -> None:
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import DummyVecEnv

    from transport.sb3 import RemoteVecEnv

    address, schema = split(url)
    remote = RemoteVecEnv(address, NUM_ENVS, schema=schema)
    local = DummyVecEnv([LocalWalk for _ in range(NUM_ENVS)])
    try:
        remote.seed(5)
        local.seed(5)
        assert np.array_equal(remote.reset(), local.reset())
        time_limits = 0
        for k in range(STEPS):
            actions = actions_for(k)
            obs_r, rew_r, done_r, infos_r = remote.step(actions)
            obs_l, rew_l, done_l, infos_l = local.step(actions)
            where = f"step {k}"
            assert np.array_equal(done_r, done_l), where
            assert np.array_equal(rew_r, rew_l), where
            assert np.array_equal(obs_r, obs_l), where
            for i in np.flatnonzero(done_l):
                want = infos_l[i]
                got = infos_r[i]
                assert got["TimeLimit.truncated"] == want["TimeLimit.truncated"], (where, i)
                assert np.array_equal(got["terminal_observation"], want["terminal_observation"])
                time_limits += int(want["TimeLimit.truncated"])
        assert time_limits >= NUM_ENVS
    finally:
        remote.close()
        local.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_vector_env_over_connect_many_matches_sync_vector_env(mode: AutoresetMode) -> None:
    """connect_many(autoreset=...) drives several servers as one vector env (issue 15, item 7):
    global env ids, seeds seed + i across servers, finals under global ids."""
    wire = "next_step" if mode == AutoresetMode.NEXT_STEP else "same_step"
    urls = [f"unix:///tmp/transport-test-many-{uuid.uuid4().hex[:10]}.sock" for _ in range(2)]
    servers = [
        transport.Server(TimeLimitWalk, url, schema=tetris.SCHEMA, num_envs=n).start()
        for url, n in zip(urls, (1, 2), strict=True)
    ]
    try:
        many = transport.connect_many(urls, tetris.SCHEMA, autoreset=wire)
        remote = RemoteVectorEnv(client=many, autoreset_mode=mode)  # type: ignore[arg-type]
        local = SyncVectorEnv([LocalWalk for _ in range(NUM_ENVS)], autoreset_mode=mode)
        try:
            assert np.array_equal(remote.reset(seed=11)[0], local.reset(seed=11)[0])
            for k in range(STEPS):
                got = remote.step(actions_for(k))
                want = local.step(actions_for(k))
                for a, b in zip(got[:4], want[:4], strict=True):
                    assert np.array_equal(a, b), f"step {k}"
                if "final_obs" in want[4]:
                    for g, w in zip(got[4]["final_obs"], want[4]["final_obs"], strict=True):
                        assert (g is None) == (w is None) and (w is None or np.array_equal(g, w))
        finally:
            remote.close()
            local.close()
    finally:
        for server in servers:
            server.close()
