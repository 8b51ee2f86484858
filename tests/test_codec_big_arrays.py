"""Schemas with big arrays are built in time proportional to their fields, not their elements:
a u8[1000,1000,3] observation took ~30-55 s in ``load_schema`` (the padding map was marked one
element at a time), so ``transport-serve`` of a big-image schema took 38 s to start; a gym Box
of 1M elements took 14 s to describe (its uniform bounds written, parsed and compared element
by element). The padding offsets are still the bytes no field covers, nested struct arrays
included."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import transport
from transport.codec import _padding_offsets
from transport.schema.ir import SchemaIR, StructIR

IMAGE = """
[schema]
name = "bigimg"
version = 1
[structs.StepResult]
fields = [
  {{ name = "frame", type = "u8[{shape}]", role = "observation" }},
  {{ name = "reward", type = "f32", role = "reward" }},
  {{ name = "terminated", type = "bool", role = "terminated" }},
  {{ name = "truncated", type = "bool", role = "truncated" }},
]
[structs.StepRequest]
fields = [{{ name = "action", type = "u8", role = "action" }}]
[env]
"""

NESTED = """
[schema]
name = "nested"
version = 1
layout = "natural"
[structs.Cell]
fields = [{ name = "kind", type = "u8" }, { name = "value", type = "f64" }]
[structs.Row]
fields = [{ name = "tag", type = "u16" }, { name = "cells", type = "Cell[3]" }]
[structs.Board]
fields = [
  { name = "flag", type = "bool" },
  { name = "rows", type = "Row[4]" },
  { name = "n", type = "u32" },
]
"""


def _load_seconds(tmp_path: Path, shape: str) -> float:
    path = tmp_path / f"img_{shape.replace(',', 'x')}.toml"
    path.write_text(IMAGE.format(shape=shape))
    start = time.perf_counter()
    transport.load_schema(path)
    return time.perf_counter() - start


def test_a_big_array_costs_what_a_small_one_does(tmp_path: Path) -> None:
    """A ratio, not a time: 3M elements against 3 (the old marking: ~10^4 x)."""
    small = min(_load_seconds(tmp_path, "1,1,3") for _ in range(3))
    big = _load_seconds(tmp_path, "1000,1000,3")
    assert big < 50 * small + 0.5, (big, small)


def _per_element(schema: SchemaIR, struct: StructIR) -> np.ndarray:
    """The padding offsets by the definition: every element of every field marked alone."""
    used = np.zeros(struct.size, dtype=bool)

    def mark(s: StructIR, base: int) -> None:
        for f in s.fields:
            for i in range(f.count):
                start = base + f.offset + i * f.elem_size
                if f.kind == "struct":
                    mark(schema.structs[f.elem], start)
                else:
                    used[start : start + f.elem_size] = True

    mark(struct, 0)
    return np.flatnonzero(~used)


def test_padding_offsets_are_the_bytes_no_field_covers(tmp_path: Path) -> None:
    path = tmp_path / "nested.toml"
    path.write_text(NESTED)
    ir = transport.load_schema(path).ir
    schemas = [ir, *(transport.load_schema(p).ir for p in sorted(Path("schema").glob("*.toml")))]
    compared = 0
    for schema in schemas:
        for struct in schema.structs.values():
            got = _padding_offsets(schema, struct)
            want = _per_element(schema, struct)
            assert np.array_equal(np.array([], int) if got is None else got, want), struct.name
            compared += 1
    assert compared > 50
    board = ir.structs["Board"]
    assert _padding_offsets(ir, board) is not None  # natural alignment leaves holes


def test_a_big_gym_box_is_described_as_fast_as_a_small_one() -> None:
    """``from-gym`` / ``serve_gym`` of a Box(0, 255, (1000, 1000)): its bounds are one value
    each, not a million-element list parsed and compared one element at a time (14 s, 530 MB;
    10M elements did not finish in 2 minutes). A ratio, not a time."""
    import gymnasium

    from transport.gym_schema import schema_of_spaces
    from transport.spaces import observation_space_of

    def seconds(shape: tuple[int, ...]) -> float:
        box = gymnasium.spaces.Box(0, 255, shape, np.uint8)
        start = time.perf_counter()
        schema = schema_of_spaces(box, gymnasium.spaces.Discrete(3))
        space = observation_space_of(schema)
        assert space.shape == shape and int(space.high.max()) == 255
        return time.perf_counter() - start

    small = min(seconds((1, 1)) for _ in range(3))
    big = seconds((1000, 1000))
    assert big < 50 * small + 0.5, (big, small)
