"""Invalid inputs derived from the IR, each with the error code and field path both sides owe.

For every struct: short buffers; for every integer field an out-of-range value above and below
(64-bit bounds included, sent as integral float64 where msgpack has no integer for them), a
non-integral number, a string and a bool; f32 magnitudes beyond the largest finite f32; wrong
value kinds for floats, bools, enums, arrays and nested structs; array lengths one short, one
long and empty; every missing field and an unknown one (top level and nested); undeclared enum
values on encode and on strict decode; bool bytes other than 0/1; non-canonical NaNs (payload,
negative, signalling); and inputs with two errors, where the first in byte order must win.

The expected ``code`` and ``field`` come from docs/conformance.md applied to the IR, not from
either codec, so the runner can tell which side is wrong when the two disagree.
"""

from __future__ import annotations

import struct as _struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from transport.codec import Schema
from transport.conformance.golden import case_values
from transport.conformance.layout import Key, Leaf, enum_values, int_range
from transport.conformance.strategies import F32_MAX
from transport.schema.ir import FLAG_ROLES, SchemaIR, StructIR

_REMOVE = object()
_BIG_F32 = float.fromhex("0x1.fffffe0000001p+127")  # just above the largest finite f32
_NAN_F32 = (0x7FC00001, 0xFFC00000, 0x7F800001)
_NAN_F64 = (0x7FF8000000000001, 0xFFF8000000000000, 0x7FF0000000000001)
_INT_FMT = {1: "B", 2: "H", 4: "I", 8: "Q"}


@dataclass(frozen=True)
class InvalidCase:
    name: str
    op: str  # "encode" (payload: a wire value) | "decode" (payload: bytes, strict)
    payload: Any
    code: str
    field: str


def _replace(value: Any, keys: tuple[Key, ...], new: Any) -> Any:
    """A copy of ``value`` with the element at ``keys`` replaced (or removed: ``_REMOVE``)."""
    if not keys:
        return new
    head, rest = keys[0], keys[1:]
    if isinstance(value, dict):
        out_d = dict(value)
        if not rest and new is _REMOVE:
            del out_d[head]
        elif not rest:
            out_d[head] = new
        else:
            out_d[head] = _replace(value[head], rest, new)
        return out_d
    out_l = list(value)
    out_l[head] = _replace(value[head], rest, new)  # type: ignore[index]
    return out_l


def _chosen_leaves(schema: SchemaIR, struct: StructIR) -> list[Leaf]:
    """Every leaf field once: in an array of structs, inside its last element."""
    out: list[Leaf] = []

    def walk(s: StructIR, prefix: str, keys: tuple[Key, ...], base: int) -> None:
        for f in s.fields:
            path, fkeys = prefix + f.name, (*keys, f.name)
            if f.kind != "struct":
                out.append(Leaf(path, fkeys, f, base + f.offset))
            elif f.is_array:
                i = f.count - 1
                walk(
                    schema.structs[f.elem],
                    f"{path}[{i}].",
                    (*fkeys, i),
                    base + f.offset + i * f.elem_size,
                )
            else:
                walk(schema.structs[f.elem], path + ".", fkeys, base + f.offset)

    walk(struct, "", (), 0)
    return out


def _struct_fields(
    schema: SchemaIR, struct: StructIR
) -> Iterator[tuple[str, tuple[Key, ...], StructIR]]:
    """Every (nested) struct value: ``("", (), top)``, then ``("results[7]", keys, sub)``."""
    yield "", (), struct

    def walk(
        s: StructIR, prefix: str, keys: tuple[Key, ...]
    ) -> Iterator[tuple[str, tuple[Key, ...], StructIR]]:
        for f in s.fields:
            if f.kind != "struct":
                continue
            sub = schema.structs[f.elem]
            if f.is_array:
                i = f.count - 1
                p, k = f"{prefix}{f.name}[{i}]", (*keys, f.name, i)
            else:
                p, k = prefix + f.name, (*keys, f.name)
            yield p, k, sub
            yield from walk(sub, p + ".", k)

    yield from walk(struct, "", ())


def _element_keys(leaf: Leaf, index: int) -> tuple[Key, ...]:
    return (*leaf.keys, index) if leaf.field.is_array else leaf.keys


def _bad_encode_values(schema: SchemaIR, leaf: Leaf) -> list[tuple[str, Any, str, int]]:
    """``(label, value, code, element index)`` of invalid values for one leaf's elements."""
    f = leaf.field
    last = f.count - 1
    out: list[tuple[str, Any, str, int]] = []
    if f.kind == "int":
        lo, hi = int_range(schema, f)
        above: Any = hi + 1 if hi + 1 < 2**64 else float(2**64)
        below: Any = lo - 1 if lo - 1 >= -(2**63) else float(-(2**63) - 2048)
        out += [
            ("max+1", above, "out_of_range", last),
            ("min-1", below, "out_of_range", 0),
            ("non-integral 0.5", 0.5, "wrong_type", last),
            ("string", "1", "wrong_type", 0),
            ("nil", None, "wrong_type", last),
        ]
        if f.role not in FLAG_ROLES:  # a flag role's integer takes a bool (docs/schema.md)
            out.append(("bool", True, "wrong_type", last))
    elif f.kind == "enum":
        declared = set(enum_values(schema, f))
        lo, hi = int_range(schema, f)
        undeclared = next(v for v in range(lo, hi + 1) if v not in declared)
        beyond: Any = hi + 1 if hi + 1 < 2**64 else float(2**64)  # msgpack holds no 2**64
        out += [
            ("undeclared value", undeclared, "invalid_enum", last),
            ("beyond its integer type", beyond, "invalid_enum", 0),
            ("string", "A", "wrong_type", last),
            ("bool", False, "wrong_type", 0),
        ]
    elif f.kind == "float":
        if f.elem == "f32":
            out += [
                ("1e39 in f32", 1e39, "out_of_range", last),
                ("-1e39 in f32", -1e39, "out_of_range", 0),
                ("just above the f32 maximum", _BIG_F32, "out_of_range", last),
            ]
            assert _BIG_F32 > F32_MAX
        out += [
            ("string", "x", "wrong_type", last),
            ("bool", True, "wrong_type", 0),
            ("nil", None, "wrong_type", last),
        ]
    else:  # bool
        out += [
            ("integer 1", 1, "wrong_type", last),
            ("integer 0", 0, "wrong_type", 0),
            ("string", "true", "wrong_type", last),
            ("nil", None, "wrong_type", 0),
        ]
    return out


def _strict_patterns(schema: SchemaIR, leaf: Leaf) -> list[tuple[str, bytes, str]]:
    """Byte patterns strict decoding must reject in one element of a leaf."""
    f = leaf.field
    if f.kind == "bool":
        return [
            ("bool byte 2", b"\x02", "invalid_bool"),
            ("bool byte 255", b"\xff", "invalid_bool"),
        ]
    if f.kind == "enum":
        base = schema.enums[f.elem].type
        declared = set(enum_values(schema, f))
        lo, hi = int_range(schema, f)
        bad = next(v for v in range(lo, hi + 1) if v not in declared)
        fmt = "<" + (
            _INT_FMT[f.elem_size].lower() if base.startswith("i") else _INT_FMT[f.elem_size]
        )
        return [(f"undeclared enum value {bad}", _struct.pack(fmt, bad), "invalid_enum")]
    if f.kind == "float":
        if f.elem == "f32":
            return [(f"NaN bits {b:08x}", _struct.pack("<I", b), "non_canonical") for b in _NAN_F32]
        return [(f"NaN bits {b:016x}", _struct.pack("<Q", b), "non_canonical") for b in _NAN_F64]
    return []


def _patch(data: bytes, offset: int, chunk: bytes) -> bytes:
    return data[:offset] + chunk + data[offset + len(chunk) :]


def invalid_cases(schema: SchemaIR, codecs: Schema, struct: StructIR | str) -> list[InvalidCase]:
    s = schema.structs[struct] if isinstance(struct, str) else struct
    base = case_values(schema, s, "typical")
    data = codecs[s.name].encode(base)
    cases: list[InvalidCase] = []

    def enc(name: str, payload: Any, code: str, field: str) -> None:
        cases.append(InvalidCase(name, "encode", payload, code, field))

    def dec(name: str, payload: bytes, code: str, field: str) -> None:
        cases.append(InvalidCase(name, "decode", payload, code, field))

    # buffers and top-level kinds
    dec("empty buffer", b"", "buffer_size", "")
    dec(f"buffer of {s.size - 1} bytes", data[:-1], "buffer_size", "")
    enc("an integer instead of a mapping", 5, "wrong_type", "")
    enc("an array instead of a mapping", [], "wrong_type", "")
    enc("nil instead of a mapping", None, "wrong_type", "")

    # missing, unknown and wrongly-typed struct values, top level and nested
    for prefix, keys, sub in _struct_fields(schema, s):
        dot = prefix + "." if prefix else ""
        for f in sub.fields if not prefix else (sub.fields[0], sub.fields[-1]):
            enc(
                f"missing field {dot}{f.name}",
                _replace(base, (*keys, f.name), _REMOVE),
                "missing_field",
                dot + f.name,
            )
        enc(
            f"unknown field {dot}bogus",
            _replace(base, (*keys, "bogus"), 1),
            "unknown_field",
            dot + "bogus",
        )
        if prefix:
            enc(
                f"an integer instead of struct {prefix}",
                _replace(base, keys, 0),
                "wrong_type",
                prefix,
            )

    # array lengths and kinds: scalar arrays and arrays of structs
    for prefix, keys, sub in _struct_fields(schema, s):
        dot = prefix + "." if prefix else ""
        for f in sub.fields:
            if not f.is_array:
                continue
            fkeys = (*keys, f.name)
            items: Any = base
            for k in fkeys:
                items = items[k]
            path = dot + f.name
            enc(
                f"{path} with {f.count - 1} elements",
                _replace(base, fkeys, items[:-1]),
                "array_length",
                path,
            )
            enc(
                f"{path} with {f.count + 1} elements",
                _replace(base, fkeys, [*items, items[-1]]),
                "array_length",
                path,
            )
            enc(f"{path} empty", _replace(base, fkeys, []), "array_length", path)
            enc(
                f"{path} a number instead of an array", _replace(base, fkeys, 0), "wrong_type", path
            )

    # bad element values, per leaf
    chosen = _chosen_leaves(schema, s)
    for leaf in chosen:
        for label, value, code, index in _bad_encode_values(schema, leaf):
            path = leaf.element_path(index)
            enc(f"{path} {label}", _replace(base, _element_keys(leaf, index), value), code, path)

    # two errors in one value: the first in byte order wins
    firsts: list[tuple[int, str, tuple[Key, ...]]] = []
    for leaf in chosen:
        f = leaf.field
        if f.is_array and f.count >= 3:
            bad = _bad_encode_values(schema, leaf)[0][1]
            payload = _replace(base, _element_keys(leaf, f.count - 1), bad)
            payload = _replace(payload, _element_keys(leaf, 1), "two")
            enc(f"{leaf.path}: two bad elements", payload, "wrong_type", leaf.element_path(1))
        firsts.append((leaf.element_offset(0), leaf.element_path(0), _element_keys(leaf, 0)))
    if len(firsts) >= 2:
        firsts.sort()
        payload = base
        for _, _, keys in reversed(firsts):
            payload = _replace(payload, keys, "bad")
        enc("every field's first element a string", payload, "wrong_type", firsts[0][1])

    # strict decoding: bools, enums, NaNs
    strict: list[tuple[int, str, bytes]] = []
    for leaf in chosen:
        patterns = _strict_patterns(schema, leaf)
        f = leaf.field
        for label, chunk, code in patterns:
            index = f.count - 1
            dec(
                f"{leaf.element_path(index)} {label}",
                _patch(data, leaf.element_offset(index), chunk),
                code,
                leaf.element_path(index),
            )
        if patterns:
            label, chunk, code = patterns[0]
            strict.append((leaf.element_offset(f.count - 1), leaf.element_path(f.count - 1), chunk))
            if f.is_array and f.count >= 3:
                bad = _patch(data, leaf.element_offset(f.count - 1), chunk)
                bad = _patch(bad, leaf.element_offset(1), chunk)
                dec(f"{leaf.path}: two bad elements", bad, code, leaf.element_path(1))
    if len(strict) >= 2:
        strict.sort()
        bad = data
        for offset, _, chunk in strict:
            bad = _patch(bad, offset, chunk)
        first = strict[0][1]
        code = next(c.code for c in cases if c.op == "decode" and c.field == first)
        dec("every strict-checked field bad at once", bad, code, first)
    return cases
