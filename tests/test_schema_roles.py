"""The types each result role takes (docs/schema.md, "Roles"): a reward is one float or integer,
an episode flag (done, terminated, truncated) one bool or integer, an action mask a bool or
integer array. The compiler refuses any other type with one line naming the file, the struct,
the field, the role and the types it takes.

The defect: ``role = "terminated"`` on an ``f32`` compiled, and a Node env returning
``terminated: 0.5`` then ended its episode (/tmp/explore2/sch/roletypes.toml)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import transport
from transport.codec import Schema
from transport.errors import SchemaError
from transport.runtime.env import Spaces
from transport.schema.compiler import compile_schema, load_schema

from .servers import unique_url

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schema"

TEXT = """
[schema]
name = "roles"
version = 1
[enums.Flag]
type = "u8"
values = {{ NO = 0, YES = 1 }}
[env]
[structs.StepResult]
fields = [
  {{ name = "observation", type = "f32[4]", role = "observation" }},
  {{ name = "reward",      type = "{reward}", role = "reward" }},
  {{ name = "terminated",  type = "{terminated}", role = "terminated" }},
  {{ name = "truncated",   type = "{truncated}", role = "truncated" }},
  {{ name = "mask",        type = "{mask}", role = "action_mask" }},
]
[structs.StepRequest]
fields = [{{ name = "action", type = "u8", role = "action" }}]
"""
GOOD = {"reward": "f64", "terminated": "bool", "truncated": "bool", "mask": "bool[3]"}
FLAGS = "one bool or integer flag (bool, u8, u16, u32, u64, i8, i16, i32, i64)"
NUMBER = "one float or integer (f32, f64, u8, u16, u32, u64, i8, i16, i32, i64)"
MASK = (
    "a bool or integer array, one flag per action "
    "(bool[N], or an array of u8, u16, u32, u64, i8, i16, i32, i64)"
)


def text_of(**types: str) -> str:
    return TEXT.format(**(GOOD | types))


def compiled(**types: str) -> Schema:
    return Schema(compile_schema(text_of(**types), "roles.toml"))


REFUSED = [
    ("terminated", "f32", "terminated", FLAGS),  # the report's
    ("terminated", "f64", "terminated", FLAGS),
    ("truncated", "f32", "truncated", FLAGS),
    ("terminated", "bool[2]", "terminated", FLAGS),
    ("truncated", "u8[1]", "truncated", FLAGS),
    ("terminated", "Flag", "terminated", FLAGS),
    ("reward", "bool", "reward", NUMBER),
    ("reward", "f32[2]", "reward", NUMBER),
    ("reward", "Flag", "reward", NUMBER),
    ("mask", "f32[3]", "action_mask", MASK),
    ("mask", "u8", "action_mask", MASK),
    ("mask", "bool", "action_mask", MASK),
]


@pytest.mark.parametrize(
    ("field", "type_", "role", "takes"), REFUSED, ids=[f"{r[2]}-{r[1]}" for r in REFUSED]
)
def test_a_role_on_a_type_it_does_not_take_is_refused(
    field: str, type_: str, role: str, takes: str
) -> None:
    with pytest.raises(SchemaError) as info:
        compiled(**{field: type_})
    assert str(info.value) == (
        f"roles.toml: struct StepResult, field {field}: role {role!r} takes {takes}, not {type_}"
    )
    assert (info.value.file, info.value.struct, info.value.field) == (
        "roles.toml",
        "StepResult",
        field,
    )


def test_done_on_a_float_is_refused() -> None:
    text = text_of().replace(
        '{ name = "truncated",   type = "bool", role = "truncated" },',
        '{ name = "truncated",   type = "bool", role = "truncated" },\n'
        '  { name = "done", type = "f32", role = "done" },',
    )
    with pytest.raises(SchemaError, match=re.escape(f"field done: role 'done' takes {FLAGS}")):
        compile_schema(text, "roles.toml")


def test_the_reported_schema_file_is_refused(tmp_path: Path) -> None:
    # /tmp/explore2/sch/roletypes.toml, as the tester wrote it
    path = tmp_path / "roletypes.toml"
    path.write_text(
        '[schema]\nname = "bad"\nversion = 1\n[env]\n[structs.StepResult]\nfields = [\n'
        '  { name = "observation", type = "f32[4]", role = "observation" },\n'
        '  { name = "reward", type = "i32", role = "reward" },\n'
        '  { name = "terminated", type = "f32", role = "terminated" },\n]\n'
        '[structs.StepRequest]\nfields = [{ name = "action", type = "u8", role = "action" }]\n'
    )
    with pytest.raises(SchemaError) as info:
        load_schema(path)
    assert str(info.value) == (
        f"{path}: struct StepResult, field terminated: role 'terminated' takes {FLAGS}, not f32"
    )


# -- what the roles keep taking ------------------------------------------------------------------


@pytest.mark.parametrize(
    "types",
    [
        {"reward": "f32"},
        {"reward": "i32"},  # an integer reward: the adapters read it as a float
        {"reward": "u8"},
        {"reward": "i64"},
        {"terminated": "u8", "truncated": "u8"},  # seed 000's flag bytes
        {"terminated": "i32", "truncated": "u16"},
        {"mask": "u8[3]"},
        {"mask": "bool[2,3]"},
        {"mask": "i32[3]"},
    ],
)
def test_the_types_the_docs_allow_still_compile(types: dict[str, str]) -> None:
    compiled(**types)


def test_every_project_schema_compiles() -> None:
    for path in sorted(SCHEMA_DIR.glob("*.toml")):
        load_schema(path)


class IntegerRewardEnv:
    """Rewards -7 * action on an i32 field; terminated (a u8 flag) on the second step."""

    def __init__(self) -> None:
        self.t = 0

    def spaces(self) -> Spaces:
        return Spaces(4, 3)

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        self.t = 0
        return self._result(0)

    def step(self, action: int) -> dict[str, Any]:
        self.t += 1
        return self._result(-7 * int(action))

    def _result(self, reward: int) -> dict[str, Any]:
        return {
            "observation": np.full(4, self.t, np.float32),
            "reward": reward,
            "terminated": self.t >= 2,
            "truncated": False,
            "mask": np.ones(3, np.bool_),
        }


def test_an_integer_reward_and_flag_work_end_to_end() -> None:
    pytest.importorskip("gymnasium")
    from transport.gym import RemoteVectorEnv

    schema = compiled(reward="i32", terminated="u8")
    with transport.Server(
        IntegerRewardEnv, unique_url("unix"), schema=schema, num_envs=2
    ).start() as server:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            env = RemoteVectorEnv(server.bound_url, schema=schema)
        try:
            env.reset(seed=0)
            _, reward, terminated, truncated, _ = env.step(np.array([1, 2]))
            assert reward.tolist() == [-7.0, -14.0] and reward.dtype == np.float64
            assert terminated.tolist() == [False, False]
            _, reward, terminated, truncated, _ = env.step(np.array([0, 1]))
            assert reward.tolist() == [0.0, -7.0]
            assert terminated.tolist() == [True, True] and truncated.tolist() == [False, False]
        finally:
            env.close()
