"""Hypothesis strategies derived from the layout IR, and a fast seeded batch generator.

``element_strategy`` is the value space of one scalar element: integers over the full range of
their type (64-bit included), ``floats(width=32)`` / ``floats(width=64)`` with NaN, +-0.0,
+-inf and subnormals, ``booleans()``, and ``sampled_from`` the declared values of an enum.

Drawing a 612-element float array one element at a time through Hypothesis costs milliseconds
per message, so arrays are drawn the way ``hypothesis.extra.numpy.arrays(..., fill=...)`` draws
them, only cheaper: Hypothesis draws a seed, a density and a short list of elements from
``element_strategy``; NumPy expands them into the full array (uniform over the full range or
realistic magnitudes, per message), then sprinkles the drawn elements and the type's edge values
(min, max, 0, NaN, +-0.0, +-inf, the smallest subnormal, the largest finite value) over it.

``batch_strategy`` draws a whole batch of messages column-wise (one draw set per field for the
batch), which is what makes 2,000 ``StepMultiResult`` messages take a fraction of a second;
``generate`` runs it under ``@seed`` with the generate phase only and no database, so a seed
replays exactly.
"""

from __future__ import annotations

import math
import sys
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from transport.conformance.layout import enum_values, int_range
from transport.schema.ir import FieldIR, SchemaIR, StructIR

_NUMPY = {
    "u8": np.uint8,
    "u16": np.uint16,
    "u32": np.uint32,
    "u64": np.uint64,
    "i8": np.int8,
    "i16": np.int16,
    "i32": np.int32,
    "i64": np.int64,
    "f32": np.float32,
    "f64": np.float64,
}
F32_MAX = float(np.finfo(np.float32).max)
F32_TINY = float(np.finfo(np.float32).smallest_subnormal)
F32_MIN_NORMAL = float(np.finfo(np.float32).tiny)
F64_MAX = sys.float_info.max
F64_TINY = 5e-324
F64_MIN_NORMAL = sys.float_info.min
BATCH = 100
"""Messages per Hypothesis example in ``generate``."""


def element_strategy(schema: SchemaIR, field: FieldIR) -> SearchStrategy[Any]:
    """All valid values of one scalar element of ``field`` (not a struct field)."""
    if field.kind == "bool":
        return st.booleans()
    if field.kind == "enum":
        return st.sampled_from(enum_values(schema, field))
    if field.kind == "float":
        if field.elem == "f32":
            return st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)
        return st.floats(width=64, allow_nan=True, allow_infinity=True, allow_subnormal=True)
    lo, hi = int_range(schema, field)
    return st.integers(lo, hi)


def edge_values(schema: SchemaIR, field: FieldIR) -> list[Any]:
    """The edge values of a scalar field's type, which every generated batch mixes in."""
    if field.kind == "bool":
        return [False, True]
    if field.kind == "enum":
        return enum_values(schema, field)
    if field.kind == "float":
        big, tiny, normal = (
            (F32_MAX, F32_TINY, F32_MIN_NORMAL)
            if field.elem == "f32"
            else (F64_MAX, F64_TINY, F64_MIN_NORMAL)
        )
        return [math.nan, 0.0, -0.0, math.inf, -math.inf, tiny, -tiny, normal, big, -big, 1.0, -1.0]
    lo, hi = int_range(schema, field)
    return sorted({v for v in (lo, lo + 1, -1, 0, 1, hi - 1, hi) if lo <= v <= hi})


@dataclass(frozen=True)
class _Column:
    """A leaf field with the array dimensions above it: ``results[*].observation[*]``."""

    keys: tuple[str, ...]  # field names from the top struct down
    dims: tuple[int, ...]  # counts of the struct arrays on the way, then the leaf's own count
    field: FieldIR


def _columns(schema: SchemaIR, struct: StructIR) -> list[_Column]:
    out: list[_Column] = []

    def walk(s: StructIR, keys: tuple[str, ...], dims: tuple[int, ...]) -> None:
        for f in s.fields:
            k = (*keys, f.name)
            d = (*dims, f.count) if f.is_array else dims
            if f.kind == "struct":
                walk(schema.structs[f.elem], k, d)
            else:
                out.append(_Column(k, d, f))

    walk(struct, (), ())
    return out


def _fill(
    schema: SchemaIR,
    field: FieldIR,
    shape: tuple[int, ...],
    seed: int,
    density: float,
    drawn: list[Any],
    stream: int = 0,
) -> np.ndarray:
    """Expand one column: ``shape[0]`` messages, the rest the field's array dimensions.

    ``stream`` keeps columns apart: Hypothesis starts from the simplest draws (seed 0 for every
    column), and without it two fields of one type would hold the same values.
    """
    rng = np.random.default_rng((seed, stream))
    rows = shape[0]
    n = math.prod(shape)
    per_row = n // rows if rows else 0
    mode = np.repeat(rng.integers(0, 3, rows), per_row)
    if field.kind == "bool":
        p = np.repeat(rng.random(rows), per_row)
        out: np.ndarray = rng.random(n) < p
    elif field.kind == "enum":
        values = np.array(enum_values(schema, field), dtype=np.int64)
        out = rng.choice(values, n)
    elif field.kind == "float":
        dtype = _NUMPY[field.elem]
        bits = np.uint32 if field.elem == "f32" else np.uint64
        info = np.iinfo(bits)
        raw = rng.integers(0, int(info.max), n, dtype=bits, endpoint=True).view(dtype)
        scale = 10.0 ** rng.integers(-6, 7, n)
        with np.errstate(over="ignore"):
            normal = (rng.standard_normal(n) * scale).astype(dtype)
            unit = rng.uniform(-1.0, 1.0, n).astype(dtype)
        out = np.where(mode == 0, raw, np.where(mode == 1, normal, unit))
    else:
        lo, hi = int_range(schema, field)
        dtype = _NUMPY[field.elem]
        full = rng.integers(lo, hi, n, dtype=dtype, endpoint=True)
        small = rng.integers(max(lo, -100), min(hi, 100), n, dtype=dtype, endpoint=True)
        near = rng.integers(max(lo, hi - 100), hi, n, dtype=dtype, endpoint=True)
        out = np.where(mode == 0, full, np.where(mode == 1, small, near))
    pool = edge_values(schema, field) + drawn
    if density > 0 and pool:
        mask = rng.random(n) < density
        picks = rng.integers(0, len(pool), int(mask.sum()))
        if field.kind == "float":
            values_arr = np.array(pool, dtype=np.float64).astype(out.dtype)
        elif field.kind == "bool":
            values_arr = np.array(pool, dtype=bool)
        else:
            values_arr = np.array(pool, dtype=out.dtype)
        out[mask] = values_arr[picks]
    return out.reshape(shape)


@st.composite
def _column(draw: st.DrawFn, schema: SchemaIR, column: _Column, rows: int) -> np.ndarray:
    seed = draw(st.integers(0, 2**64 - 1))
    density = draw(st.sampled_from([0.0, 0.01, 0.1, 0.5, 1.0]))
    drawn = draw(st.lists(element_strategy(schema, column.field), max_size=6))
    stream = zlib.crc32("/".join(column.keys).encode())
    return _fill(schema, column.field, (rows, *column.dims), seed, density, drawn, stream)


def _element(value: np.ndarray, field: FieldIR) -> Any:
    if value.ndim:
        return value.copy()
    item = value.item()
    if field.kind == "float":
        return float(item)
    if field.kind == "bool":
        return bool(item)
    return int(item)


def _assemble(
    schema: SchemaIR, struct: StructIR, columns: dict[tuple[str, ...], np.ndarray], row: int
) -> dict[str, Any]:
    def build(s: StructIR, keys: tuple[str, ...], index: tuple[int, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in s.fields:
            k = (*keys, f.name)
            if f.kind == "struct":
                sub = schema.structs[f.elem]
                if f.is_array:
                    out[f.name] = [build(sub, k, (*index, i)) for i in range(f.count)]
                else:
                    out[f.name] = build(sub, k, index)
            else:
                out[f.name] = _element(columns[k][(row, *index)], f)
        return out

    return build(struct, (), ())


def batch_strategy(
    schema: SchemaIR, struct: StructIR | str, size: int
) -> SearchStrategy[list[dict[str, Any]]]:
    """``size`` valid values of a struct, drawn column-wise (one draw set per leaf field)."""
    s = schema.structs[struct] if isinstance(struct, str) else struct
    cols = _columns(schema, s)
    parts = st.tuples(*[_column(schema, c, size) for c in cols])

    def build(arrays: tuple[np.ndarray, ...]) -> list[dict[str, Any]]:
        by_key = {c.keys: a for c, a in zip(cols, arrays, strict=True)}
        return [_assemble(schema, s, by_key, row) for row in range(size)]

    return parts.map(build)


def struct_strategy(schema: SchemaIR, struct: StructIR | str) -> SearchStrategy[dict[str, Any]]:
    """One valid value of a struct: mappings, NumPy arrays for scalar arrays, Python scalars."""
    return batch_strategy(schema, struct, 1).map(lambda batch: batch[0])


def generate(
    schema: SchemaIR, struct: StructIR | str, count: int, seed: int, batch: int = BATCH
) -> list[dict[str, Any]]:
    """``count`` values of a struct, reproducible from ``seed`` (Hypothesis generate phase)."""
    if count <= 0:
        return []
    size = min(batch, count)
    examples = -(-count // size)
    out: list[dict[str, Any]] = []

    @settings(
        database=None,
        max_examples=examples,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=False,
        print_blob=False,
    )
    @hypothesis_seed(seed)
    @given(batch_strategy(schema, struct, size))
    def collect(values: list[dict[str, Any]]) -> None:
        out.extend(values)

    collect()
    while out and len(out) < count:  # Hypothesis stopped early: replay what it gave
        out.extend(out[: count - len(out)])
    return out[:count]
