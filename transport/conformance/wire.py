"""The testee protocol's wire format and value conversions.

Frames are a ``u32`` little-endian length followed by that many bytes of msgpack encoding one
map. Values travel as msgpack: integers as integers (64-bit values included), floats as float64
(so ``-0.0``, infinities and NaN survive), bools as booleans, arrays as arrays (a
multi-dimensional array as its flat row-major elements, as TypeScript holds it), structs as
maps, enums as integers, byte strings as ``bin``.

``to_wire`` turns codec values (NumPy arrays, NumPy scalars) into plain Python values that
msgpack writes exactly as the protocol wants; ``from_wire`` undoes what JavaScript cannot tell
apart (an integral float64 in an integer field becomes an ``int``). ``first_difference`` compares
two values field by field, floats bit-exactly at the field's width (every NaN equals every NaN,
``-0.0`` differs from ``0.0``).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping
from itertools import chain
from typing import IO, Any

import msgpack
import numpy as np

from transport.schema.ir import FieldIR, SchemaIR, StructIR

_LEN = struct.Struct("<I")
_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")
_F64 = struct.Struct("<d")
_U64 = struct.Struct("<Q")
MAX_FRAME = 1 << 31
_F32_NAN_BITS = 0x7FC00000
_F64_NAN_BITS = 0x7FF8000000000000


class ProtocolError(Exception):
    """A frame that cannot be read: truncated, oversized or not msgpack."""


def pack(obj: Any) -> bytes:
    """msgpack bytes of ``obj``: ``bytes`` as bin, ``str`` as str, Python floats as float64."""
    data: bytes = msgpack.packb(obj, use_bin_type=True, use_single_float=False)
    return data


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def frame(obj: Any) -> bytes:
    body = pack(obj)
    return _LEN.pack(len(body)) + body


def write_frame(stream: IO[bytes], obj: Any) -> None:
    stream.write(frame(obj))
    stream.flush()


def _read_exact(stream: IO[bytes], n: int) -> bytes:
    chunks: list[bytes] = []
    got = 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(stream: IO[bytes]) -> Any | None:
    """The next frame's value, or ``None`` at a clean end of stream."""
    head = _read_exact(stream, 4)
    if not head:
        return None
    if len(head) < 4:
        raise ProtocolError(f"stream ended inside a frame header ({len(head)} of 4 bytes)")
    (length,) = _LEN.unpack(head)
    if length > MAX_FRAME:
        raise ProtocolError(f"frame length {length} exceeds {MAX_FRAME}")
    body = _read_exact(stream, length)
    if len(body) < length:
        raise ProtocolError(f"stream ended inside a frame ({len(body)} of {length} bytes)")
    try:
        return unpack(body)
    except Exception as exc:
        raise ProtocolError(f"frame is not msgpack: {exc}") from exc


# -- value conversions -------------------------------------------------------------------------


def _map_values(
    schema: SchemaIR,
    struct: StructIR,
    value: Any,
    leaf: Callable[[FieldIR, Any], Any],
    array: Callable[[FieldIR, Any], Any],
) -> Any:
    """Apply ``leaf`` to every scalar and ``array`` to every scalar array of a struct value;
    leave malformed parts (not a mapping, unknown keys, not a list) as they are."""
    if not isinstance(value, Mapping):
        return value
    out: dict[Any, Any] = {}
    fields = {f.name: f for f in struct.fields}
    for key, item in value.items():
        f = fields.get(key) if isinstance(key, str) else None
        if f is None:
            out[key] = item
        elif f.kind == "struct":
            sub = schema.structs[f.elem]
            if f.is_array and isinstance(item, list | tuple):
                out[key] = [_map_values(schema, sub, v, leaf, array) for v in item]
            else:
                out[key] = _map_values(schema, sub, item, leaf, array)
        elif f.is_array:
            out[key] = array(f, item)
        else:
            out[key] = leaf(f, item)
    return out


def _is_plain_number(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


def _leaf_to_wire(f: FieldIR, value: Any) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    if f.kind == "float" and _is_plain_number(value):
        return float(value)
    return value


def _array_to_wire(f: FieldIR, item: Any) -> Any:
    if isinstance(item, np.ndarray):
        if f.kind == "float" and item.dtype.kind in "iub":
            item = item.astype(np.float64)
        return item.reshape(-1).tolist() if f.shape is not None else item.tolist()
    if isinstance(item, list | tuple):
        flat = _flat(f, item)
        kinds = set(map(type, flat))
        if kinds <= ({float} if f.kind == "float" else {int, bool}):
            return list(flat)  # already plain: what _leaf_to_wire would give, element by element
        return [_leaf_to_wire(f, v) for v in flat]
    return item


_SEQUENCES: set[type] = {list, tuple}


def _flat(f: FieldIR, items: Any) -> Any:
    """A multi-dimensional field's nested lists (or array) -> flat row-major elements."""
    if f.shape is None:
        return items
    if isinstance(items, np.ndarray):
        return items.reshape(-1)
    if isinstance(items, list | tuple):  # nested lists: one C-level chain per dimension
        level = items
        for _ in range(len(f.shape) - 1):
            kinds = set(map(type, level))
            if not kinds or not kinds <= _SEQUENCES:
                break  # flat already (row-major elements), or irregular
            level = list(chain.from_iterable(level))
        if not any(issubclass(t, list | tuple | np.ndarray) for t in set(map(type, level))):
            return list(level)
    out: list[Any] = []  # irregular nesting: element by element, as deep as it goes
    stack = [items]
    while stack:
        item = stack.pop()
        if isinstance(item, list | tuple | np.ndarray):
            stack.extend(reversed(list(item)))
        else:
            out.append(item)
    return out


def _leaf_from_wire(f: FieldIR, value: Any) -> Any:
    if f.kind in ("int", "enum") and type(value) is float and value.is_integer():
        return int(value)
    return value


def _array_from_wire(f: FieldIR, item: Any) -> Any:
    if f.kind in ("int", "enum") and isinstance(item, list | tuple):
        if float not in set(map(type, item)):
            return list(item)  # no float to make an int of
        return [int(v) if type(v) is float and v.is_integer() else v for v in item]
    return item


def _array_to_codec(f: FieldIR, item: Any) -> Any:
    """A list of plain numbers -> a NumPy array (the codec checks those vectorised)."""
    item = _array_from_wire(f, item)
    if not isinstance(item, list) or not item:
        return item
    kinds = set(map(type, item))
    if f.kind == "float":
        if kinds <= {float}:
            return np.array(item, dtype=np.float64)
    elif f.kind == "int":
        if kinds <= {int}:
            arr = np.array(item) if -(2**63) <= min(item) and max(item) < 2**64 else None
            if arr is not None and arr.dtype.kind in "iu":
                return arr
    elif f.kind == "bool" and kinds <= {bool}:
        return np.array(item, dtype=bool)
    return item


def to_wire(schema: SchemaIR, struct: StructIR | str, values: Any) -> Any:
    """Codec values -> plain Python values for msgpack (floats always as ``float``)."""
    s = schema.structs[struct] if isinstance(struct, str) else struct
    return _map_values(schema, s, values, _leaf_to_wire, _array_to_wire)


def from_wire(schema: SchemaIR, struct: StructIR | str, values: Any) -> Any:
    """Wire values -> codec values: integral floats in integer and enum fields become ``int``."""
    s = schema.structs[struct] if isinstance(struct, str) else struct
    return _map_values(schema, s, values, _leaf_from_wire, _array_from_wire)


def to_codec(schema: SchemaIR, struct: StructIR | str, values: Any) -> Any:
    """``from_wire``, then well-formed numeric lists as NumPy arrays: the same value for the
    codec (floats are doubles either way), checked vectorised instead of element by element."""
    s = schema.structs[struct] if isinstance(struct, str) else struct
    return _map_values(schema, s, values, _leaf_from_wire, _array_to_codec)


def plain(value: Any) -> Any:
    """Any nested value with NumPy parts -> plain Python (for payloads of any shape)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


# -- comparison --------------------------------------------------------------------------------


def float_bits(value: float, width: str) -> int:
    """IEEE bits of ``value`` rounded to ``width`` ("f32" | "f64"), every NaN canonical."""
    if math.isnan(value):
        return _F32_NAN_BITS if width == "f32" else _F64_NAN_BITS
    if width == "f32":
        try:
            return int(_U32.unpack(_F32.pack(value))[0])
        except OverflowError:  # rounds beyond the f32 range
            with np.errstate(over="ignore"):
                return int(np.array([value]).astype(np.float32).view(np.uint32)[0])
    return int(_U64.unpack(_F64.pack(value))[0])


def _elements_differ(f: FieldIR, a: Any, b: Any) -> bool:
    if f.kind == "bool":
        return not (isinstance(a, bool | np.bool_) and isinstance(b, bool | np.bool_) and a == b)
    if not (_is_plain_number(a) and _is_plain_number(b)):
        return True
    if f.kind == "float":
        x, y = float(a), float(b)
        if x == y and x != 0:
            return False
        return float_bits(x, f.elem) != float_bits(y, f.elem)
    for v in (a, b):
        if isinstance(v, float | np.floating) and not float(v).is_integer():
            return True
    return int(a) != int(b)


def _clean_array(f: FieldIR, items: Any) -> np.ndarray | None:
    """``items`` as a 1-D NumPy array when every element has the field's kind, else None
    (the caller then compares element by element and reports the odd one)."""
    items = _flat(f, items)
    if isinstance(items, np.ndarray):
        dtype_kinds = {"float": "f", "bool": "b"}.get(f.kind, "iu")
        return items if items.ndim == 1 and items.dtype.kind in dtype_kinds else None
    if not isinstance(items, list | tuple):
        return None
    kinds = set(map(type, items))  # the element types, in one C-level pass
    if f.kind == "float":
        return np.array(items, dtype=np.float64) if kinds <= {float} else None
    if f.kind == "bool":
        return np.array(items, dtype=bool) if kinds <= {bool} else None
    if kinds <= {int}:
        arr = np.array(items) if items and -(2**63) <= min(items) and max(items) < 2**64 else None
        return arr if arr is not None and arr.dtype.kind in "iu" else None
    if kinds <= {float}:  # JavaScript numbers in an integer field: each integral, <= 2**53
        arr = np.array(items, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            whole = np.isfinite(arr) & (np.floor(arr) == arr) & (np.abs(arr) <= 2**53)
        return arr if whole.all() else None
    return None


def _float_array_bits(f: FieldIR, arr: np.ndarray) -> np.ndarray:
    bits: np.ndarray
    with np.errstate(over="ignore", invalid="ignore"):
        if f.elem == "f32":
            bits = arr.astype(np.float32).view(np.uint32).copy()
            bits[np.isnan(arr)] = _F32_NAN_BITS
        else:
            bits = arr.astype(np.float64).view(np.uint64).copy()
            bits[np.isnan(arr)] = _F64_NAN_BITS
    return bits


def _array_difference(f: FieldIR, xs: Any, ys: Any) -> int | bool | None:
    """Vectorised comparison: index of the first difference, None if equal, False if the
    arrays are not clean enough to compare this way."""
    ax, ay = _clean_array(f, xs), _clean_array(f, ys)
    if ax is None or ay is None or ax.shape != ay.shape:
        return False
    if f.kind == "float":
        differ = _float_array_bits(f, ax) != _float_array_bits(f, ay)
    elif f.kind != "bool" and (ax.dtype.kind == "f") != (ay.dtype.kind == "f"):
        if (ax.dtype.kind == "f" and ay.size and np.abs(ay).max() > 2**53) or (
            ay.dtype.kind == "f" and ax.size and np.abs(ax).max() > 2**53
        ):
            return False
        differ = ax.astype(np.float64) != ay.astype(np.float64)
    elif ax.dtype != ay.dtype and ax.dtype.kind in "iu" and ay.dtype.kind in "iu":
        differ = np.array(
            [int(a) != int(b) for a, b in zip(ax.tolist(), ay.tolist(), strict=True)], dtype=bool
        )
    else:
        differ = ax != ay
    return int(np.argmax(differ)) if differ.any() else None


def _describe(value: Any) -> str:
    if isinstance(value, float | np.floating):
        return repr(float(value))
    if isinstance(value, np.ndarray):
        return f"array{value.shape}"
    text = repr(plain(value))
    return text if len(text) <= 80 else text[:77] + "..."


def first_difference(
    schema: SchemaIR, struct: StructIR | str, a: Any, b: Any, prefix: str = ""
) -> tuple[str, str, str] | None:
    """The first differing element in declaration order: ``(path, a_text, b_text)``, or None."""
    s = schema.structs[struct] if isinstance(struct, str) else struct
    where = prefix.rstrip(".") or "(struct)"
    if not isinstance(a, Mapping) or not isinstance(b, Mapping):
        if isinstance(a, Mapping) == isinstance(b, Mapping):
            return None if a == b else (where, _describe(a), _describe(b))
        return (where, _describe(a), _describe(b))
    for f in s.fields:
        path = prefix + f.name
        if f.name not in a or f.name not in b:
            return (
                path,
                "missing" if f.name not in a else "present",
                "missing" if f.name not in b else "present",
            )
        x, y = a[f.name], b[f.name]
        if f.kind == "struct":
            sub = schema.structs[f.elem]
            if not f.is_array:
                diff = first_difference(schema, sub, x, y, path + ".")
                if diff:
                    return diff
                continue
            if (
                not isinstance(x, list | tuple)
                or not isinstance(y, list | tuple)
                or len(x) != len(y)
            ):
                return (path, _describe(x), _describe(y))
            for i, (u, v) in enumerate(zip(x, y, strict=True)):
                diff = first_difference(schema, sub, u, v, f"{path}[{i}].")
                if diff:
                    return diff
            continue
        if not f.is_array:
            if _elements_differ(f, x, y):
                return (path, _describe(x), _describe(y))
            continue
        quick = _array_difference(f, x, y)
        if quick is None:
            continue
        xs, ys = _flat(f, x), _flat(f, y)
        xs = xs.tolist() if isinstance(xs, np.ndarray) else xs
        ys = ys.tolist() if isinstance(ys, np.ndarray) else ys
        if quick is not False:
            i = int(quick)
            return (f"{path}[{i}]", _describe(xs[i]), _describe(ys[i]))
        if (
            not isinstance(xs, list | tuple)
            or not isinstance(ys, list | tuple)
            or len(xs) != len(ys)
        ):
            return (path, _describe(x), _describe(y))
        for i, (u, v) in enumerate(zip(xs, ys, strict=True)):
            if _elements_differ(f, u, v):
                return (f"{path}[{i}]", _describe(u), _describe(v))
    extra = sorted(str(k) for k in set(a) ^ set(b))
    if extra:
        return (
            prefix + extra[0],
            "present" if extra[0] in a else "absent",
            "present" if extra[0] in b else "absent",
        )
    return None
