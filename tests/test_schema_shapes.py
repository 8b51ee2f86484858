"""Multi-dimensional arrays (``f32[2,5,5]``): the IR keeps the shape, NumPy views have it, and
values are accepted nested or flat (row-major); error paths name the flat element index."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from transport.codec import Schema
from transport.errors import ArrayLengthError, InvalidBoolError, SchemaError, ValueRangeError
from transport.generated import gridworld
from transport.schema import compile_schema, ir_from_json, load_schema

ROOT = Path(__file__).resolve().parents[1]
STEP = gridworld.StepResult


def values(**changes: object) -> dict[str, object]:
    out: dict[str, object] = {
        "observation": np.arange(50, dtype=np.float32).reshape(2, 5, 5),
        "reward": -0.5,
        "terminated": False,
        "truncated": True,
        "action_mask": [True, False, True, True],
        "walls": [[i == j for j in range(5)] for i in range(5)],
        "visits": np.arange(25, dtype=np.uint16).reshape(5, 5),
        "position": [1, 4],
    }
    out.update(changes)
    return out


def test_the_ir_records_a_shape_only_for_more_than_one_dimension() -> None:
    ir = load_schema(ROOT / "schema" / "gridworld.toml")
    obs = ir.structs["StepResult"].field("observation")
    assert (obs.type, obs.count, obs.size, obs.shape, obs.dims) == (
        "f32[2,5,5]",
        50,
        200,
        (2, 5, 5),
        (2, 5, 5),
    )
    assert obs.to_json()["shape"] == [2, 5, 5]
    mask = ir.structs["StepResult"].field("action_mask")
    assert mask.shape is None and mask.dims == (4,) and "shape" not in mask.to_json()
    back = ir_from_json(json.loads(json.dumps(ir.to_json())))
    assert back.structs["StepResult"].field("visits").shape == (5, 5)
    assert back.fingerprint == ir.fingerprint
    # spaces in the brackets are normalised away; a 1-D array is written as before
    text = '[schema]\nname = "t"\n[structs.S]\nfields = [{ name = "x", type = "u8[ 3 , 2 ]" }]\n'
    assert compile_schema(text).structs["S"].field("x").type == "u8[3,2]"


def test_one_dimensional_fingerprints_do_not_change() -> None:
    one = '[schema]\nname = "t"\n[structs.S]\nfields = [{ name = "x", type = "f32[4]" }]\n'
    assert compile_schema(one).structs["S"].to_json()["fields"][0] == {
        "name": "x",
        "type": "f32[4]",
        "offset": 0,
        "size": 16,
        "count": 4,
    }


def test_views_have_the_shape_batched_too() -> None:
    buf = bytearray(STEP.size * 3)
    assert STEP.view(buf)["observation"].shape == (2, 5, 5)
    batch = STEP.view(buf, 0, 3)
    assert batch["observation"].shape == (3, 2, 5, 5)
    assert batch["visits"].shape == (3, 5, 5)
    batch["observation"][1, 1, 2, 3] = 7.0  # zero copy: the bytes themselves
    at = STEP.size + STEP.ir.field("observation").offset + 4 * (25 + 2 * 5 + 3)
    assert np.frombuffer(buf, np.float32, 1, at)[0] == 7.0


def test_nested_arrays_and_flat_elements_encode_alike() -> None:
    shaped = STEP.encode(values())
    nested = STEP.encode(
        values(
            observation=np.arange(50.0).reshape(2, 5, 5).tolist(),
            visits=[list(range(5 * r, 5 * r + 5)) for r in range(5)],
        )
    )
    flat = STEP.encode(values(observation=list(range(50)), visits=np.arange(25)))
    assert shaped == nested == flat
    decoded = STEP.decode(shaped)
    assert decoded["observation"].shape == (2, 5, 5)
    assert decoded["observation"][1, 2, 3] == 25 + 2 * 5 + 3
    assert decoded["walls"].shape == (5, 5) and decoded["walls"][3, 3]


@pytest.mark.parametrize(
    ("changes", "error", "path"),
    [
        ({"observation": np.zeros((5, 2, 5))}, ArrayLengthError, "observation"),
        ({"visits": [[0] * 5] * 4}, ArrayLengthError, "visits"),
        ({"visits": [[0] * 5] * 4 + [[0] * 4]}, ArrayLengthError, "visits"),
        ({"observation": list(range(49))}, ArrayLengthError, "observation"),
        ({"visits": [[0] * 5] * 4 + [[0, 0, 70000, 0, 0]]}, ValueRangeError, "visits[22]"),
    ],
)
def test_wrong_values_name_the_field_or_the_flat_element(
    changes: dict[str, object], error: type[Exception], path: str
) -> None:
    with pytest.raises(error) as info:
        STEP.encode(values(**changes))
    assert info.value.field == path  # type: ignore[attr-defined]


def test_strict_decode_names_the_flat_element() -> None:
    data = bytearray(STEP.encode(values()))
    data[STEP.ir.field("walls").offset + 13] = 2
    with pytest.raises(InvalidBoolError) as info:
        STEP.decode(data)
    assert info.value.field == "walls[13]"


def test_arrays_of_structs_stay_one_dimensional() -> None:
    text = (
        '[schema]\nname = "t"\n[structs.A]\nfields = [{ name = "x", type = "u8" }]\n'
        '[structs.B]\nfields = [{ name = "a", type = "A[2,2]" }]\n'
    )
    with pytest.raises(SchemaError, match="struct B, field a: 'A\\[2,2\\]': an array of structs"):
        compile_schema(text)
    bad = '[schema]\nname = "t"\n[structs.S]\nfields = [{ name = "x", type = "u8[2,0]" }]\n'
    with pytest.raises(SchemaError, match="array count must be at least 1, not 0"):
        compile_schema(bad)


def test_generated_module_and_runtime_schema_agree() -> None:
    runtime = Schema(load_schema(ROOT / "schema" / "gridworld.toml"))
    assert runtime.fingerprint == gridworld.FINGERPRINT
    assert runtime["StepResult"].dtype == STEP.dtype
    assert gridworld.SCHEMA.ir.shm is not None
    assert gridworld.SHM_RESULT_OFFSETS["observation"] == 128
