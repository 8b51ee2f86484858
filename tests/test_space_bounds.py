"""Bounds of the adapters' spaces for fields that declare none (transport.spaces; docs/adapters.md,
"Spaces"): a float field is (-inf, inf), an integer field its dtype's range, a bool False..True.

The defect: +-inf was cast to the integer dtype (``RuntimeWarning: invalid value encountered in
cast``), so an image ``u8[3,16,16]`` got ``Box(0, 0)`` and ``i16[3]`` ``Box(0, 0)``: spaces that
contain none of the env's real observations."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("gymnasium")

from gymnasium import spaces

import transport
from transport.codec import Schema
from transport.gym import RemoteEnv, RemoteVectorEnv
from transport.runtime.env import Spaces
from transport.schema.compiler import compile_schema
from transport.spaces import action_space_of, observation_space_of

from .servers import unique_url

UNBOUNDED = (-np.inf, np.inf)
"""What the gym adapters pass as ``observation_bounds`` when none is given (transport.gym)."""
INTEGERS = ["u8", "u16", "u32", "u64", "i8", "i16", "i32", "i64"]
DTYPES: dict[str, type[np.integer[Any]]] = {
    "u8": np.uint8,
    "u16": np.uint16,
    "u32": np.uint32,
    "u64": np.uint64,
}
DTYPES |= {"i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64}

TEXT = """
[schema]
name = "spacebounds"
version = 1
layout = "natural"
[env]
[structs.StepResult]
fields = [
{observations}
  {{ name = "reward",     type = "f64",  role = "reward" }},
  {{ name = "terminated", type = "bool", role = "terminated" }},
]
[structs.StepRequest]
fields = [{{ name = "act", type = "{act}", role = "action"{act_attrs} }}]
"""


def schema_of(observations: list[str], act: str = "u8", act_attrs: str = "") -> Schema:
    """A schema whose result struct has these observation fields (``name: type[, attrs]``)."""
    lines = []
    for spec in observations:
        name, _, rest = spec.partition(": ")
        type_, _, attrs = rest.partition(", ")
        extra = f", {attrs}" if attrs else ""
        lines.append(f'  {{ name = "{name}", type = "{type_}", role = "observation"{extra} }},')
    text = TEXT.format(observations="\n".join(lines), act=act, act_attrs=act_attrs)
    return Schema(compile_schema(text, "spacebounds.toml"))


def space_of(schema: Schema, bounds: tuple[float, float] | None) -> spaces.Space[Any]:
    """The observation space, a cast warning an error (what the tester saw printed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        return observation_space_of(schema, bounds)


@pytest.mark.parametrize("bounds", [UNBOUNDED, None], ids=["adapter-default", "none"])
@pytest.mark.parametrize("type_", INTEGERS)
def test_an_integer_field_without_bounds_spans_its_dtype(
    type_: str, bounds: tuple[float, float] | None
) -> None:
    space = space_of(schema_of([f"obs: {type_}[3]"]), bounds)
    info = np.iinfo(DTYPES[type_])
    assert isinstance(space, spaces.Box) and space.dtype == np.dtype(DTYPES[type_])
    assert space.low.tolist() == [int(info.min)] * 3
    assert space.high.tolist() == [int(info.max)] * 3
    assert space.contains(np.array([info.min, 0, info.max], dtype=DTYPES[type_]))


def test_float_and_bool_fields_without_bounds_keep_theirs() -> None:
    space = space_of(schema_of(["f: f32[2]", "g: f64", "b: bool[2]"]), UNBOUNDED)
    assert isinstance(space, spaces.Dict)
    assert space["f"] == spaces.Box(-np.inf, np.inf, (2,), np.float32)
    assert space["g"] == spaces.Box(-np.inf, np.inf, (1,), np.float64)
    flags = space["b"]  # False..True (inf cast to bool would be True..True)
    assert isinstance(flags, spaces.Box) and flags.dtype == np.dtype(np.bool_)
    assert flags.low.tolist() == [False, False] and flags.high.tolist() == [True, True]


def test_the_image_dict_of_the_report() -> None:
    # /tmp/explore2/boxdict.toml: an image u8[3,16,16] beside a float vector, no bounds
    space = space_of(schema_of(["image: u8[3,16,16]", "vec: f32[5]", "t: i16[3]"]), UNBOUNDED)
    assert isinstance(space, spaces.Dict)
    assert space["image"] == spaces.Box(0, 255, (3, 16, 16), np.uint8)
    assert space["vec"] == spaces.Box(-np.inf, np.inf, (5,), np.float32)
    assert space["t"] == spaces.Box(-32768, 32767, (3,), np.int16)


def test_given_bounds_on_an_integer_field_stay_inside_its_dtype() -> None:
    # observation_bounds (or a reference env's known bounds) apply to every unbounded field:
    # on an integer one they are clipped to its range and rounded inward, never wrapped
    space = space_of(schema_of(["a: u8[2]", "b: i16", "c: f32"]), (-1.5, 300.5))
    assert isinstance(space, spaces.Dict)
    assert space["a"] == spaces.Box(0, 255, (2,), np.uint8)
    assert space["b"] == spaces.Box(-1, 300, (1,), np.int16)
    assert space["c"] == spaces.Box(-1.5, 300.5, (1,), np.float32)


def test_declared_64_bit_bounds_are_exact() -> None:
    top, bottom = 2**63 - 1, -(2**63)
    schema = schema_of(
        [f"big: i64[2], low = {bottom}, high = {top}", f"huge: u64, high = {2**64 - 1}"]
    )
    space = space_of(schema, UNBOUNDED)
    assert isinstance(space, spaces.Dict)
    big, huge = space["big"], space["huge"]
    assert isinstance(big, spaces.Box) and isinstance(huge, spaces.Box)
    assert big.low.tolist() == [bottom] * 2 and big.high.tolist() == [top] * 2
    assert huge.low.tolist() == [0] and huge.high.tolist() == [2**64 - 1]
    # a declared bound inside the range stays as declared
    narrow = space_of(schema_of(["x: u8[3], low = [1, 2, 3], high = 200"]), UNBOUNDED)
    assert narrow == spaces.Box(np.array([1, 2, 3]), 200, (3,), np.uint8)


def test_integer_array_actions_are_multi_discrete_from_their_bounds() -> None:
    # an integer array action needs high (the compiler refuses it without: never +-inf cast);
    # low defaults to 0; the largest u32 high is exact
    schema = schema_of(["o: f32[2]"], "u32[2]", ", high = [3, 4294967295]")
    assert action_space_of(schema, 2) == spaces.MultiDiscrete([4, 2**32], dtype=np.int64)
    box = schema_of(["o: f32[2]"], "f32[2]")
    assert action_space_of(box, 2) == spaces.Box(-np.inf, np.inf, (2,), np.float32)


# -- end to end: a server, RemoteVectorEnv and RemoteEnv -------------------------------------------

IMAGE = np.arange(3 * 16 * 16, dtype=np.uint8).reshape(3, 16, 16) | np.uint8(0x80)
"""Values up to 255: outside the old Box(0, 0)."""
SMALL = np.array([-300, 0, 32767], dtype=np.int16)


class ImageEnv:
    """An env of the report's shape: an image, a float vector and an i16 vector."""

    def __init__(self) -> None:
        self.t = 0

    def spaces(self) -> Spaces:
        return Spaces(5, 3)

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        self.t = 0
        return self._result()

    def step(self, action: int) -> dict[str, Any]:
        self.t += 1
        return self._result()

    def _result(self) -> dict[str, Any]:
        return {
            "image": IMAGE,
            "vec": np.full(5, 0.5, np.float32),
            "t": SMALL,
            "reward": 1.0,
            "terminated": self.t >= 3,
        }


@pytest.fixture(scope="module")
def image_schema() -> Schema:
    return schema_of(["image: u8[3,16,16]", "vec: f32[5]", "t: i16[3]"])


@pytest.fixture(scope="module")
def image_url(image_schema: Schema) -> Iterator[str]:
    with transport.Server(
        ImageEnv, unique_url("unix"), schema=image_schema, num_envs=2
    ).start() as server:
        yield server.bound_url


def test_remote_vector_env_spaces_contain_real_observations(
    image_url: str, image_schema: Schema
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        env = RemoteVectorEnv(image_url, schema=image_schema)
    try:
        single = env.single_observation_space
        assert isinstance(single, spaces.Dict)
        assert single["image"] == spaces.Box(0, 255, (3, 16, 16), np.uint8)
        assert single["t"] == spaces.Box(-32768, 32767, (3,), np.int16)
        obs, _ = env.reset(seed=0)
        for i in range(2):
            assert single.contains({k: obs[k][i] for k in obs}), i
        assert env.observation_space.contains(obs)
        obs, *_ = env.step(np.array([0, 1]))
        assert env.observation_space.contains(obs)
    finally:
        env.close()


def test_remote_env_space_contains_real_observations(image_schema: Schema) -> None:
    with transport.Server(ImageEnv, unique_url("unix"), schema=image_schema).start() as server:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            env = RemoteEnv(server.bound_url, schema=image_schema)
        try:
            obs, _ = env.reset(seed=0)
            assert env.observation_space.contains(obs)
            assert np.array_equal(obs["image"], IMAGE) and np.array_equal(obs["t"], SMALL)
        finally:
            env.close()
