"""Golden vectors: named cases whose values and canonical bytes are committed to the repository.

Files, per struct and case, under ``conformance/golden/<schema>/``:

* ``<struct>.<case>.json``: the schema, struct, case, a description, the schema fingerprint and
  the values. Floats are JSON numbers except NaN, Infinity, -Infinity and -0.0, written as the
  strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` and ``"-0.0"``; 64-bit integers are plain
  JSON integers (read them with a bigint-aware parser in JavaScript).
* ``<struct>.<case>.bin``: the canonical encoding, exactly ``size`` bytes.
* ``<struct>.<case>.hex``: the same bytes annotated, one line per field element group:
  ``offset | bytes (hex) | field path | value``, padding included.

The cases together cover every field and the edge values: all zeros, the max and the min of every
integer type, NaN / +0.0 / -0.0 / +inf / -inf / the smallest subnormal / the largest finite value
/ typical values for floats, both bools, every enum value, and zeroed padding.

``transport-conformance --write-golden`` rewrites them from the Python encoder. Run it only for an
intentional schema change, and review the diff before committing it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from transport.codec import Schema
from transport.conformance.layout import Leaf, enum_values, int_range, leaves, padding_ranges
from transport.conformance.strategies import F32_MAX, F32_TINY, F64_MAX, F64_TINY
from transport.schema.ir import FieldIR, SchemaIR, StructIR

_JSON_TO_FLOAT = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf, "-0.0": -0.0}
_TYPICAL_FLOATS = [0.5, -1.25, 0.1, 3.14159265358979, -2.0e-3, 1234.5678, 6.02e23, -7.0]
_FLOAT_CASES: dict[str, str] = {
    "nan": "every float NaN (written as the canonical quiet NaN)",
    "neg_zero": "every float -0.0",
    "inf": "every float +infinity",
    "neg_inf": "every float -infinity",
    "subnormal": "every float the smallest positive subnormal",
}
_FLOAT_CASE_VALUES = {"nan": math.nan, "neg_zero": -0.0, "inf": math.inf, "neg_inf": -math.inf}
BYTES_PER_LINE = 16


@dataclass(frozen=True)
class GoldenCase:
    schema: str
    struct: str
    case: str
    description: str
    fingerprint: str
    # codec values (floats restored from their JSON strings); None when the file was written
    # for another layout (``fingerprint`` differs) and its values do not fit this one
    values: dict[str, Any] | None
    data: bytes  # the committed .bin
    hex_text: str  # the committed .hex
    path: Path  # the .json file

    @property
    def name(self) -> str:
        return f"{self.struct}.{self.case}"


# -- case values -------------------------------------------------------------------------------


def _round(field: FieldIR, value: float) -> float:
    if field.elem == "f32" and math.isfinite(value):
        return float(np.float32(value))
    return value


def _mixed_int(lo: int, hi: int, leaf_no: int, i: int) -> int:
    span = hi - lo + 1
    return lo + ((i + 1) * 0x9E3779B97F4A7C15 + (leaf_no + 1) * 0x632BE59BD9B4E019) % span


def _specials(field: FieldIR) -> list[float]:
    big, tiny = (F32_MAX, F32_TINY) if field.elem == "f32" else (F64_MAX, F64_TINY)
    return [
        math.nan,
        0.0,
        -0.0,
        math.inf,
        -math.inf,
        tiny,
        big,
        -big,
        -tiny,
        _round(field, 0.1),
        _round(field, -1.5),
    ]


def _value_for(schema: SchemaIR, case: str, field: FieldIR, leaf_no: int, i: int) -> Any:
    """Element ``i`` of leaf number ``leaf_no`` in the named case."""
    kind = field.kind
    if kind == "bool":
        if case == "max":
            return True
        if case in ("zeros", "min"):
            return False
        return (i + leaf_no) % 2 == 0
    if kind == "enum":
        values = enum_values(schema, field)
        if case == "zeros":
            return 0 if 0 in values else values[0]
        if case == "max":
            return values[-1]
        if case == "min":
            return values[0]
        if case.startswith("enum_"):
            return values[(int(case[5:]) + i) % len(values)]
        return values[(i + leaf_no) % len(values)]
    if kind == "float":
        big = F32_MAX if field.elem == "f32" else F64_MAX
        if case == "zeros":
            return 0.0
        if case == "max":
            return big
        if case == "min":
            return -big
        if case == "subnormal":
            return F32_TINY if field.elem == "f32" else F64_TINY
        if case in _FLOAT_CASE_VALUES:
            return _FLOAT_CASE_VALUES[case]
        if case == "mixed":
            specials = _specials(field)
            return specials[(i + leaf_no) % len(specials)]
        return _round(field, _TYPICAL_FLOATS[(i + leaf_no) % len(_TYPICAL_FLOATS)])
    lo, hi = int_range(schema, field)
    if case == "zeros":
        return 0 if lo <= 0 <= hi else lo
    if case == "max":
        return hi
    if case == "min":
        return lo
    if case == "mixed":
        return _mixed_int(lo, hi, leaf_no, i)
    small = (i * 7 + leaf_no * 3 + 1) % min(hi + 1, 100)
    return small if small >= lo else lo


LARGE_ELEMENTS = 16_384
"""A struct with more scalar elements than this (a frame) gets fewer golden cases and fewer
random messages (``runner.Runner.count_for``)."""


def case_names(schema: SchemaIR, struct: StructIR) -> dict[str, str]:
    """The cases of a struct and what each one covers."""
    all_leaves = leaves(schema, struct)
    out = {
        "zeros": "every field zero (enums: 0 or the smallest value), bools false, +0.0",
        "max": "every integer at its type's maximum, floats the largest finite value, bools true,"
        " enums their largest value",
        "min": "every integer at its type's minimum, floats the most negative finite value,"
        " bools false, enums their smallest value",
        "typical": "small, realistic values",
        "mixed": "integers spread over their full range, floats cycling through NaN, +-0.0,"
        " +-inf, subnormals, the largest finite values and typical values",
    }
    if sum(leaf.field.count for leaf in all_leaves) > LARGE_ELEMENTS:
        # a frame-sized struct (an image schema's): the extremes and "mixed" (every float
        # special, integers over their whole range); each case is megabytes of golden files
        out = {case: out[case] for case in ("zeros", "max", "mixed")}
    elif any(f.kind == "float" for f in struct.fields):  # nested-only: "mixed" covers them
        out.update(_FLOAT_CASES)
    widest = max(
        (len(enum_values(schema, leaf.field)) for leaf in all_leaves if leaf.field.kind == "enum"),
        default=0,
    )
    for k in range(widest):
        out[f"enum_{k}"] = f"enum fields take their declared value number {k} (cycling)"
    return out


def case_values(schema: SchemaIR, struct: StructIR | str, case: str) -> dict[str, Any]:
    """The values of a named case, as plain Python (lists for arrays)."""
    s = schema.structs[struct] if isinstance(struct, str) else struct
    counter = iter(range(1 << 30))

    def build(sub: StructIR) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in sub.fields:
            if f.kind == "struct":
                inner = schema.structs[f.elem]
                out[f.name] = [build(inner) for _ in range(f.count)] if f.is_array else build(inner)
                continue
            leaf_no = next(counter)
            items = [_value_for(schema, case, f, leaf_no, i) for i in range(f.count)]
            out[f.name] = items if f.is_array else items[0]
        return out

    return build(s)


# -- JSON --------------------------------------------------------------------------------------


def _map_floats(
    schema: SchemaIR, struct: StructIR, value: Any, fn: Callable[[FieldIR, Any], Any]
) -> Any:
    out: dict[str, Any] = {}
    for f in struct.fields:
        item = value[f.name]
        if f.kind == "struct":
            sub = schema.structs[f.elem]
            out[f.name] = (
                [_map_floats(schema, sub, v, fn) for v in item]
                if f.is_array
                else _map_floats(schema, sub, item, fn)
            )
        elif f.is_array:
            seq = item.tolist() if isinstance(item, np.ndarray) else list(item)
            out[f.name] = [fn(f, v) for v in seq]
        else:
            out[f.name] = fn(f, item.item() if isinstance(item, np.generic) else item)
    return out


def _float_to_json(field: FieldIR, value: Any) -> Any:
    if field.kind != "float":
        return value
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0 and math.copysign(1.0, value) < 0:
        return "-0.0"
    return value


def _float_from_json(field: FieldIR, value: Any) -> Any:
    if field.kind != "float":
        return value
    if isinstance(value, str):
        return _JSON_TO_FLOAT[value]
    return float(value)


def values_to_json(schema: SchemaIR, struct: StructIR | str, values: Any) -> Any:
    s = schema.structs[struct] if isinstance(struct, str) else struct
    return _map_floats(schema, s, values, _float_to_json)


def values_from_json(schema: SchemaIR, struct: StructIR | str, values: Any) -> Any:
    s = schema.structs[struct] if isinstance(struct, str) else struct
    return _map_floats(schema, s, values, _float_from_json)


def _dump(value: Any, indent: int = 0) -> str:
    """JSON with mappings one key a line and scalar lists on one line (readable diffs)."""
    pad = "  " * indent
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f"{pad}  {json.dumps(k)}: {_dump(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        items = [f"{pad}  {_dump(v, indent + 1)}" for v in value]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return json.dumps(value, separators=(", ", ": "), allow_nan=False)


# -- annotated hex -----------------------------------------------------------------------------


def format_value(schema: SchemaIR, field: FieldIR | None, value: Any) -> str:
    if field is None:
        return str(value)
    if field.kind == "bool":
        return "true" if value else "false"
    if field.kind == "enum":
        names = {v: k for k, v in schema.enums[field.elem].values.items()}
        return f"{names.get(int(value), '?')}({int(value)})"
    if field.kind == "float":
        v = float(value)
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return str(np.float32(v)) if field.elem == "f32" else repr(v)
    return str(int(value))


def _element_values(schema: SchemaIR, leaf: Leaf, data: bytes) -> list[Any]:
    f = leaf.field
    base = schema.enums[f.elem].type if f.kind == "enum" else f.elem
    dtype = {"bool": "<u1"}.get(base) or {
        "u8": "<u1",
        "u16": "<u2",
        "u32": "<u4",
        "u64": "<u8",
        "i8": "<i1",
        "i16": "<i2",
        "i32": "<i4",
        "i64": "<i8",
        "f32": "<f4",
        "f64": "<f8",
    }[base]
    arr = np.frombuffer(data, dtype=dtype, count=f.count, offset=leaf.offset)
    return [v for v in arr.tolist()]


def annotate(
    schema: SchemaIR,
    struct: StructIR | str,
    data: bytes,
    title: str = "",
    fingerprint: str | None = None,
) -> str:
    """The annotated hex of an encoding: ``offset | bytes | field path | value`` lines
    (``fingerprint``: the schema's, when the caller has it: computing it hashes the layout)."""
    s = schema.structs[struct] if isinstance(struct, str) else struct
    rows: list[tuple[int, int, str, str]] = []  # offset, length, path, value text
    for leaf in leaves(schema, s):
        f = leaf.field
        values = _element_values(schema, leaf, data)
        per_line = max(1, BYTES_PER_LINE // f.elem_size) if f.is_array else 1
        for start in range(0, f.count, per_line):
            stop = min(f.count, start + per_line)
            if not f.is_array:
                path = leaf.path
            elif stop - start == 1:
                path = f"{leaf.path}[{start}]"
            else:
                path = f"{leaf.path}[{start}..{stop - 1}]"
            chunk = values[start:stop]
            if f.kind == "int":  # plain ints from tolist(): str() is format_value's text
                text = " ".join(map(str, chunk))
            else:
                text = " ".join(format_value(schema, f, v) for v in chunk)
            rows.append((leaf.element_offset(start), (stop - start) * f.elem_size, path, text))
    for lo, hi in padding_ranges(schema, s):
        for start in range(lo, hi, BYTES_PER_LINE):
            stop = min(hi, start + BYTES_PER_LINE)
            zero = not any(data[start:stop])
            rows.append((start, stop - start, "(padding)", "0" if zero else "NOT ZERO"))
    rows.sort()
    fingerprint = fingerprint or schema.fingerprint_hex
    lines = [
        f"# {title}" if title else f"# {schema.name} {s.name}",
        f"# {s.size} bytes, little-endian; schema fingerprint {fingerprint}",
        "# offset | bytes (hex) | field path | value",
    ]
    width = len(str(s.size))
    for offset, length, path, text in rows:
        hexes = data[offset : offset + length].hex(" ")
        lines.append(f"{offset:>{width}} | {hexes:<{BYTES_PER_LINE * 3 - 1}} | {path} | {text}")
    return "\n".join(lines) + "\n"


# -- files -------------------------------------------------------------------------------------


def schema_dir(golden_root: Path, schema: SchemaIR) -> Path:
    return golden_root / schema.name


def write_golden(schema: SchemaIR, codecs: Schema, golden_root: Path) -> list[Path]:
    """(Re)write every case of every struct of a schema from the Python encoder."""
    out_dir = schema_dir(golden_root, schema)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.iterdir():
        if old.suffix in (".json", ".bin", ".hex") and old.is_file():
            old.unlink()
    written: list[Path] = []
    for struct in schema.structs.values():
        codec = codecs[struct.name]
        for case, description in case_names(schema, struct).items():
            values = case_values(schema, struct, case)
            data = codec.encode(values)
            stem = f"{struct.name}.{case}"
            doc = {
                "schema": schema.name,
                "struct": struct.name,
                "case": case,
                "description": description,
                "fingerprint": schema.fingerprint_hex,
                "size": struct.size,
                "values": values_to_json(schema, struct, values),
            }
            title = f"{schema.name} {struct.name} case {case}: {description}"
            (out_dir / f"{stem}.json").write_text(_dump(doc) + "\n", encoding="utf-8")
            (out_dir / f"{stem}.bin").write_bytes(data)
            (out_dir / f"{stem}.hex").write_text(annotate(schema, struct, data, title), "utf-8")
            written += [out_dir / f"{stem}.{ext}" for ext in ("json", "bin", "hex")]
    return written


def hex_title(case: GoldenCase) -> str:
    return f"{case.schema} {case.struct} case {case.case}: {case.description}"


def _stored_values(schema: SchemaIR, struct: str, doc: dict[str, Any]) -> dict[str, Any] | None:
    """A case file's values, or None when they were written for another layout and do not fit
    this one (a changed schema: the caller reports the fingerprint change, not a bad file)."""
    try:
        values: dict[str, Any] = values_from_json(schema, struct, doc["values"])
    except (KeyError, TypeError, ValueError):
        if "values" in doc and doc.get("fingerprint") not in (None, schema.fingerprint_hex):
            return None
        raise
    return values


def load_golden(schema: SchemaIR, golden_root: Path) -> list[GoldenCase]:
    """Every committed case of a schema (``ValueError`` names a malformed file)."""
    out_dir = schema_dir(golden_root, schema)
    cases: list[GoldenCase] = []
    if not out_dir.is_dir():
        return cases
    for path in sorted(out_dir.glob("*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            struct = doc["struct"]
            if struct not in schema.structs:
                raise ValueError(f"struct {struct!r} is not in schema {schema.name}")
            data = path.with_suffix(".bin").read_bytes()
            hex_path = path.with_suffix(".hex")
            hex_text = hex_path.read_text(encoding="utf-8") if hex_path.exists() else ""
            values = _stored_values(schema, struct, doc)
        except (OSError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from exc
        cases.append(
            GoldenCase(
                schema=doc.get("schema", schema.name),
                struct=struct,
                case=doc.get("case", path.stem.partition(".")[2]),
                description=doc.get("description", ""),
                fingerprint=doc.get("fingerprint", ""),
                values=values,
                data=data,
                hex_text=hex_text,
                path=path,
            )
        )
    order = {name: i for i, name in enumerate(schema.structs)}
    cases.sort(key=lambda c: (order[c.struct], c.case))
    return cases
