"""shm:// for every schema: the region layout comes from the schema's IR (``shm`` section).

tetris, mahjong and a user schema compiled from a TOML string run over shm:// from the Python
server and give byte for byte the traces they give over unix://; STEP_MULTI (an env with
``step_batch``, and an 8-env server) and OBSERVE work on shm too.
"""

from __future__ import annotations

import random
import re
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import transport.api as api
from transport.backends.shm import ShmChannel
from transport.backends.shm.region import ShmLayout
from transport.client import Client
from transport.codec import Schema
from transport.errors import RemoteError
from transport.generated import mahjong_env, pac_env, tetris
from transport.protocol import ErrorCode
from transport.runtime.env import Spaces
from transport.schema.compiler import compile_schema

from .servers import ServerProcess, unique_unix_url
from .test_observe import Counter
from .test_step_batch import SEATS, SelfPlayEcho

TETRIS_TOML = Path(__file__).resolve().parents[1] / "schema" / "tetris.toml"
MODES = ["disabled", "next_step", "same_step"]


def shm_url(num_envs: int) -> str:
    return f"shm://test-schemas-{uuid.uuid4().hex[:12]}?num_envs={num_envs}"


def user_schema() -> Schema:
    """A schema of a user's own: 50 observations, 4 actions (action 3 masked), an f64 field."""
    text = TETRIS_TOML.read_text().replace('name = "tetris"', 'name = "grid_walk"')
    result = """[structs.StepResult]
size = 224
fields = [
  { name = "observation", type = "f32[50]", offset = 0,   role = "observation" },
  { name = "action_mask", type = "u8[4]",   offset = 200, role = "action_mask" },
  { name = "value",       type = "f64",     offset = 208 },
  { name = "reward",      type = "f32",     offset = 216, role = "reward" },
  { name = "done",        type = "u8",      offset = 220, role = "done" },
]
"""
    text, count = re.subn(r"\[structs\.StepResult\].*?\n\]\n", result, text, flags=re.S)
    assert count == 1
    text = text.replace(
        "[structs.StepMultiResult]\nsize = 7296", "[structs.StepMultiResult]\nsize = 1792"
    )
    return Schema(compile_schema(text, "grid_walk.toml"))


USER = user_schema()


class Walk:
    """A seeded walk for any result layout: observation[0] = t, observation[1] = the RNG's
    position; episodes end by chance (done, and truncated at 5 steps where the schema has it)."""

    def __init__(self, schema: Schema) -> None:
        self.codec = schema["StepResult"]
        self.names = {f.name for f in self.codec.ir.fields}
        self.obs_n = self.codec.ir.field("observation").count
        self.act_n = self.codec.ir.field("action_mask").count
        self.rng = np.random.default_rng(0)
        self.t = 0

    def spaces(self) -> Spaces:
        return Spaces(self.obs_n, self.act_n)

    def reset(self, seed: int | None = None) -> np.ndarray:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        return self._result(0.0, False)

    def step(self, action: int) -> np.ndarray:
        self.t += 1
        return self._result(float(action) + 0.5, bool(self.rng.random() < 0.15) or self.t >= 5)

    def _result(self, reward: float, done: bool) -> np.ndarray:
        record = self.codec.zeros()
        record["observation"][0] = self.t
        record["observation"][1] = self.rng.random()
        record["action_mask"] = 1
        record["action_mask"][self.act_n - 1] = 0
        record["reward"] = reward
        record["done"] = int(done)
        if "truncated" in self.names:
            record["truncated"] = int(self.t >= 5)
        if "value" in self.names:
            record["value"] = self.t * 0.25 + 1e-12
        return record


def legal(result: Any, rng: random.Random) -> list[int]:
    masks = np.atleast_2d(result.action_mask)
    return [rng.choice(np.flatnonzero(mask).tolist()) for mask in masks]


def values(view: Any) -> bytes:
    """A result's field values as bytes (a copy of strided records leaves padding undefined)."""
    return b"".join(np.ascontiguousarray(view[name]).tobytes() for name in view.keys())


def trace(client: Client, steps: int = 40) -> list[bytes]:
    """Reset seeded, then random legal steps: every result (and SAME_STEP final) as bytes."""
    rng = random.Random(3)
    env = client.schema.ir.env
    assert env is not None
    end_names = [f.name for f in client.schema[env.result].ir.episode_end_fields()]
    result = client.reset(seed=11)
    out = [values(result)]
    for _ in range(steps):
        actions = legal(result, rng)
        ends = [np.atleast_1d(result[name]) for name in end_names]
        if client.autoreset.name == "DISABLED" and any(end.any() for end in ends):
            result = client.reset()
        else:
            result = client.step(actions[0] if client.num_envs == 1 else actions)
        out.append(values(result))
        out.extend(f"{i}:".encode() + values(final) for i, final in client.finals)
    return out


def both_traces(schema: Schema, num_envs: int, mode: str) -> tuple[list[bytes], list[bytes]]:
    traces = []
    for url in (shm_url(num_envs), unique_unix_url()):
        with (
            api.Server(lambda: Walk(schema), url, schema=schema, num_envs=num_envs).start(),
            api.connect(url, schema, timeout=10, autoreset=mode) as client,
        ):
            traces.append(trace(client))
    return traces[0], traces[1]


@pytest.mark.parametrize("mode", MODES)
def test_tetris_over_shm_matches_unix(mode: str) -> None:
    shm, unix = both_traces(tetris.SCHEMA, 3, mode)
    assert shm == unix


@pytest.mark.parametrize("mode", MODES)
def test_user_schema_from_a_toml_string_over_shm_matches_unix(mode: str) -> None:
    shm, unix = both_traces(USER, 2, mode)
    assert shm == unix


def test_user_schema_results_are_views_of_the_derived_slots() -> None:
    layout = ShmLayout.of(USER)
    assert layout.slot_size % 64 == 0 and layout.obs_size == 50 and layout.act_size == 4
    url = shm_url(2)
    with (
        api.Server(lambda: Walk(USER), url, schema=USER, num_envs=2).start(),
        api.connect(url, USER, timeout=10) as client,
    ):
        assert isinstance(client.channel, ShmChannel)
        result = client.reset(seed=1)
        mapping = np.frombuffer(client.channel.region.map, dtype=np.uint8)
        assert result.observation.shape == (2, 50)
        assert result.observation.strides == (layout.slot_size, 4)
        assert np.shares_memory(result.value, mapping) and result.value.dtype == np.float64
        with pytest.raises(RemoteError) as info:
            client.step([3, 0])
        assert info.value.code == ErrorCode.MASKED_ACTION and "env 0" in info.value.text


def test_mahjong_over_shm_matches_unix_in_real_processes() -> None:
    traces = []
    for url in (shm_url(2), unique_unix_url()):
        with (
            ServerProcess(url, env="mahjong", num_envs=2) as proc,
            api.connect(proc.url, mahjong_env.SCHEMA, timeout=10) as client,
        ):
            traces.append(trace(client, steps=60))
    assert traces[0] == traces[1]


def test_step_multi_over_shm_steps_the_seats_of_one_env() -> None:
    url = shm_url(1)
    with api.Server(SelfPlayEcho(), url).start(), api.connect(url, timeout=10) as client:
        assert client.channel.region.num_slots == SEATS  # one slot per seat
        client.reset()
        result = client.step_multi(np.arange(SEATS) + 10)
        np.testing.assert_array_equal(result.observation[:, 0], np.arange(SEATS) + 10)
        np.testing.assert_array_equal(result.observation[:, 1], np.arange(SEATS))
        assert (result.life == 1).all()
        assert client.step(5).life == 2  # the plain step still works on slot 0
        with pytest.raises(RemoteError) as info:
            client.step_multi([1] * SEATS)  # turn 3 ends the game: the next one is refused
            client.step_multi([1] * SEATS)
        assert info.value.code == ErrorCode.NOT_RESET


def test_step_multi_over_shm_with_eight_envs() -> None:
    from transport.envs.echo import EchoEnv

    url = shm_url(SEATS)
    with (
        api.Server(EchoEnv, url, num_envs=SEATS).start(),
        api.connect(url, timeout=10) as client,
    ):
        client.reset()
        result = client.step_multi(np.arange(SEATS))
        np.testing.assert_array_equal(result.observation[:, 0], np.arange(SEATS))


def test_observe_over_shm() -> None:
    url = shm_url(2)
    with (
        api.Server(Counter, url, num_envs=2, env_name="counter").start(),
        api.connect(url, timeout=10) as client,
    ):
        client.reset()
        client.step([1, 2])
        result, infos = client.observe()
        np.testing.assert_array_equal(result.observation[:, 0], [1, 1])
        np.testing.assert_array_equal(result.observation[:, 1], [99, 99])
        assert infos == [{"count": 1, "name": "counter"}] * 2


def test_a_new_lease_reads_the_server_info_after_observe() -> None:
    url = shm_url(1)
    with api.Server(Counter, url, env_name="counter").start():
        with api.connect(url, timeout=10) as client:
            client.reset()
            client.observe()  # slot 0's info area held the env's info map
        with api.connect(url, timeout=10) as again:
            assert again.server_info["env"] == "counter"
            assert again.server_info["server"] == "python"


def test_schema_without_env_table_cannot_serve_shm() -> None:
    text = TETRIS_TOML.read_text()
    text = re.sub(r"\[env\].*?\n\n", "", text, flags=re.S)
    schema = Schema(compile_schema(text, "no_env.toml"))
    with pytest.raises(Exception, match=r"\[env\]"):
        ShmLayout.of(schema)
    assert pac_env.SCHEMA.ir.shm is not None
