"""Walking a struct's layout: concrete field paths, byte offsets, padding, field-at-offset.

Everything here is derived from the IR alone, so the conformance runner can name the field that
owns a differing byte (``results[3].reward``) without trusting either codec.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from transport.schema.ir import INTEGER_RANGES, FieldIR, SchemaIR, StructIR

Key = str | int
"""One step into a value: a field name (mapping) or an index (list of structs)."""


@dataclass(frozen=True)
class Leaf:
    """A scalar or scalar-array field reached through nested structs, at concrete indices."""

    path: str  # "results[3].observation"
    keys: tuple[Key, ...]  # ("results", 3, "observation")
    field: FieldIR
    offset: int  # absolute byte offset of the first element

    def element_path(self, index: int) -> str:
        return f"{self.path}[{index}]" if self.field.is_array else self.path

    def element_offset(self, index: int) -> int:
        return self.offset + index * self.field.elem_size


def leaves(schema: SchemaIR, struct: StructIR | str) -> list[Leaf]:
    """Every scalar leaf, depth-first in declaration order, arrays of structs expanded."""
    top = schema.structs[struct] if isinstance(struct, str) else struct
    out: list[Leaf] = []

    def walk(s: StructIR, prefix: str, keys: tuple[Key, ...], base: int) -> None:
        for f in s.fields:
            path = prefix + f.name
            fkeys = (*keys, f.name)
            if f.kind != "struct":
                out.append(Leaf(path, fkeys, f, base + f.offset))
                continue
            sub = schema.structs[f.elem]
            if f.is_array:
                for i in range(f.count):
                    walk(sub, f"{path}[{i}].", (*fkeys, i), base + f.offset + i * f.elem_size)
            else:
                walk(sub, f"{path}.", fkeys, base + f.offset)

    walk(top, "", (), 0)
    return out


def padding_ranges(schema: SchemaIR, struct: StructIR | str) -> list[tuple[int, int]]:
    """``(start, end)`` byte ranges not covered by any field, in offset order."""
    top = schema.structs[struct] if isinstance(struct, str) else struct
    used = bytearray(top.size)
    for leaf in leaves(schema, top):
        used[leaf.offset : leaf.offset + leaf.field.size] = b"\x01" * leaf.field.size
    out: list[tuple[int, int]] = []
    start: int | None = None
    for i, flag in enumerate(used):
        if not flag and start is None:
            start = i
        elif flag and start is not None:
            out.append((start, i))
            start = None
    if start is not None:
        out.append((start, top.size))
    return out


def field_at(schema: SchemaIR, struct: StructIR | str, offset: int) -> str:
    """The field path owning byte ``offset``: ``results[3].reward``, or ``(padding)``."""
    s = schema.structs[struct] if isinstance(struct, str) else struct
    if not 0 <= offset < s.size:
        return "(beyond the struct)"
    prefix = ""
    while True:
        for f in s.fields:
            if f.offset <= offset < f.offset + f.size:
                index, rest = divmod(offset - f.offset, f.elem_size)
                name = f"{f.name}[{index}]" if f.is_array else f.name
                if f.kind != "struct":
                    return prefix + name
                prefix += name + "."
                s = schema.structs[f.elem]
                offset = rest
                break
        else:
            return prefix + "(padding)" if prefix else "(padding)"


def enum_values(schema: SchemaIR, field: FieldIR) -> list[int]:
    """Declared values of an enum field, sorted."""
    return sorted(schema.enums[field.elem].values.values())


def int_range(schema: SchemaIR, field: FieldIR) -> tuple[int, int]:
    """The range of an integer or enum field's underlying type."""
    base = schema.enums[field.elem].type if field.kind == "enum" else field.elem
    return INTEGER_RANGES[base]


def scalar_type(schema: SchemaIR, field: FieldIR) -> str:
    """The underlying scalar type name of a non-struct field (an enum's integer type)."""
    return schema.enums[field.elem].type if field.kind == "enum" else field.elem


def iter_elements(leaf: Leaf) -> Iterator[tuple[int, str, int]]:
    """``(index, path, offset)`` of every element of a leaf."""
    for i in range(leaf.field.count):
        yield i, leaf.element_path(i), leaf.element_offset(i)
