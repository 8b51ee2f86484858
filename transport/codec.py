"""Runtime codecs: one ``StructCodec`` per struct of a compiled schema, built on NumPy dtypes.

Three ways in and out, from fastest to most checked:

* ``view(buffer, offset)``: a zero-copy structured NumPy array over the buffer (O(1), no
  per-field work). ``view(...)["observation"]`` is a float32 view of the bytes themselves.
* ``encode_into(buffer, offset, record)`` with a record of the codec's dtype (``zeros()``):
  one copy of the fixed block, padding zeroed with one fancy-index store, NaNs canonicalised.
* ``encode(values)`` / ``decode(buffer)`` with plain Python values (dicts, lists, NumPy arrays):
  validated per field, for control messages, tests and the conformance suite.

Canonical bytes: padding is zero, floats are little-endian IEEE 754 with every NaN written as the
quiet NaN 0x7FC00000 (f32) / 0x7FF8000000000000 (f64). Strict decoding rejects bool bytes other
than 0/1, undeclared enum values and non-canonical NaNs. Errors name the field path, e.g.
``results[2].observation[5]``, and are the first invalid element in byte-offset order.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from transport.errors import (
    ArrayLengthError,
    BufferSizeError,
    CodecError,
    InvalidBoolError,
    InvalidEnumError,
    MissingFieldError,
    NonCanonicalError,
    UnknownFieldError,
    ValueRangeError,
    ValueTypeError,
)
from transport.schema.ir import FLAG_ROLES, INTEGER_RANGES, FieldIR, SchemaIR, StructIR

_NUMPY_SCALAR = {
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
    "bool": "?",
}
_ELEM_DTYPES = {elem: np.dtype(code) for elem, code in _NUMPY_SCALAR.items()}
_FLOAT_BITS = {"f32": "<u4", "f64": "<u8"}
_CANONICAL_NAN_BITS = {"f32": 0x7FC00000, "f64": 0x7FF8000000000000}
_EXP_MASK = {"f32": 0x7F800000, "f64": 0x7FF0000000000000}
_FRAC_MASK = {"f32": 0x007FFFFF, "f64": 0x000FFFFFFFFFFFFF}
F32_MAX = float(np.finfo(np.float32).max)

Buffer = Any  # anything with the buffer protocol: bytes, bytearray, memoryview, mmap, ndarray


@dataclass(frozen=True)
class _Leaf:
    """A scalar or scalar-array field reached through nested structs: one strict-decode check."""

    path: tuple[str, ...]  # field names from the top struct down
    arrays: tuple[bool, ...]  # which path components are arrays (consume one index each)
    field: FieldIR
    enum_values: np.ndarray | None
    base_offset: tuple[int, ...]  # byte offset of each path component within its parent
    strides: tuple[int, ...]  # element size of each array component, in path order


class StructCodec:
    """Encoder, decoder and zero-copy view for one struct of a schema."""

    def __init__(self, codecs: Schema, struct: StructIR) -> None:
        schema = codecs.ir
        self.schema = schema
        self.ir = struct
        self.name = struct.name
        self.size = struct.size
        self.dtype = codecs.dtype_of(struct.name)
        self.raw_dtype = _raw_dtype(schema, struct)
        self._names = tuple(f.name for f in struct.fields)
        self._getter = operator.itemgetter(*self._names)
        self._leaves = _leaves(schema, struct)
        self._float_paths = [leaf.path for leaf in self._leaves if leaf.field.kind == "float"]
        self._padding = _padding_offsets(schema, struct)
        self._validators: list[tuple[str, Callable[[Any, str], None]]] = [
            (f.name, _validator(codecs, f)) for f in struct.fields
        ]
        self._nested = [
            (f, codecs.structs_lazy(f.elem) if f.kind == "struct" else None) for f in struct.fields
        ]
        self._bases = {  # the element dtype of each multi-dimensional field (lists become it)
            f.name: self.dtype[f.name].base for f in struct.fields if f.shape is not None
        }

    # -- zero-copy -------------------------------------------------------------------------

    def view(self, buffer: Buffer, offset: int = 0, count: int | None = None) -> np.ndarray:
        """A structured NumPy array over ``buffer`` (no copy); shape () or (count,)."""
        needed = self.size * (1 if count is None else count)
        self._check_room(buffer, offset, needed)
        shape: tuple[int, ...] = () if count is None else (count,)
        return np.ndarray(shape, dtype=self.dtype, buffer=buffer, offset=offset)

    def zeros(self, count: int | None = None) -> np.ndarray:
        """An owned, zeroed record (or array of records) to fill and pass to ``encode_into``."""
        return np.zeros(() if count is None else (count,), dtype=self.dtype)

    # -- encode ----------------------------------------------------------------------------

    def encode(self, values: Mapping[str, Any] | np.ndarray, *, validate: bool = True) -> bytes:
        """Encode to a new ``bytes`` of exactly ``size`` bytes."""
        out = bytearray(self.size)
        self.encode_into(out, 0, values, validate=validate)
        return bytes(out)

    def encode_into(
        self,
        buffer: Buffer,
        offset: int,
        values: Mapping[str, Any] | np.ndarray,
        *,
        validate: bool = True,
    ) -> None:
        """Write the canonical encoding of ``values`` into ``buffer[offset:offset+size]``."""
        target = self.view(buffer, offset)
        raw = np.ndarray((self.size,), dtype=np.uint8, buffer=buffer, offset=offset)
        if isinstance(values, np.ndarray | np.void) and values.dtype == self.dtype:
            if validate:  # NaN payloads are canonicalised below, not refused
                self.check(np.frombuffer(values.tobytes(), dtype=np.uint8), 0, nan=False)
            target[()] = values
        elif isinstance(values, Mapping):
            if validate:
                self.validate(values)
            raw[:] = 0
            try:
                target[()] = self.as_tuple(values)
            except KeyError as exc:
                raise MissingFieldError("no value given", struct=self.name, field=str(exc)) from exc
            except (TypeError, ValueError, OverflowError) as exc:
                raise ValueTypeError(str(exc), struct=self.name) from exc
        else:
            raise ValueTypeError(self._not_a_record(values), struct=self.name)
        if self._padding is not None:
            raw[self._padding] = 0
        self.canonicalize(target)

    def _not_a_record(self, values: Any) -> str:
        """Why ``values`` is neither a mapping nor a record of this struct: a record of another
        layout (another struct, or this struct of another schema version) says how it differs."""
        dtype = getattr(values, "dtype", None)
        if not isinstance(values, np.ndarray | np.void) or dtype is None or dtype.names is None:
            return f"expected a mapping or a record of this struct, not {type(values).__name__}"
        theirs, mine = list(dtype.names), list(self._names)
        missing = [n for n in mine if n not in theirs]
        extra = [n for n in theirs if n not in mine]
        where: Mapping[str, Any] = dtype.fields or {}
        here: Mapping[str, Any] = self.dtype.fields or {}
        moved = [n for n in mine if n in theirs and where[n] != here[n]]
        how = "; ".join(
            part
            for part in (
                f"it lacks {', '.join(missing)}" if missing else "",
                f"it has {', '.join(extra)}, which this struct does not" if extra else "",
                f"{', '.join(moved)}: another type or offset" if moved else "",
            )
            if part
        )
        return (
            f"got a record of another struct layout ({dtype.itemsize} bytes, this struct "
            f"{self.size}; {how or 'another field order'}): "
            "a record made from another schema (version)? Make records with this schema's codec "
            "(its zeros()) or return a mapping of field values"
        )

    def canonicalize(self, record: np.ndarray) -> None:
        """Rewrite every NaN of ``record`` (a view or owned record) as the canonical quiet NaN."""
        for path in self._float_paths:
            values = record
            for name in path:
                values = values[name]
            if values.ndim == 0:  # a scalar field of one record: one comparison
                if values != values:
                    values[...] = np.nan
                continue
            nan = np.isnan(values)
            if nan.any():
                np.copyto(values, np.nan, where=nan)

    def validate(self, values: Mapping[str, Any]) -> None:
        """Check plain Python values against the layout; raise the first error in byte order."""
        try:
            self.validate_at(values, "")
        except CodecError as exc:
            if exc.struct:
                raise
            raise type(exc)(exc.reason, struct=self.name, field=exc.field) from None

    def validate_at(self, values: Any, prefix: str) -> None:
        """``validate`` for a nested value whose field path starts with ``prefix``."""
        if not isinstance(values, Mapping):
            raise ValueTypeError(
                f"expected a mapping of field values, not {type(values).__name__}",
                field=prefix.rstrip("."),
            )
        for name, check in self._validators:
            if name not in values:
                raise MissingFieldError("no value given", field=prefix + name)
            check(values[name], prefix + name)
        if len(values) != len(self._validators):
            extra = sorted(str(k) for k in set(values) - set(self._names))
            raise UnknownFieldError(
                f"not a field of this struct: {', '.join(extra)}", field=prefix + extra[0]
            )

    def as_tuple(self, values: Mapping[str, Any]) -> tuple[Any, ...]:
        """Field values in declaration order, nested structs as tuples, as NumPy assigns them."""
        got = self._getter(values)
        if len(self._names) == 1:
            got = (got,)
        out: list[Any] = []
        for (f, sub), value in zip(self._nested, got, strict=True):
            if f.shape is not None:  # flat (row-major) or nested: NumPy assigns this shape
                if not isinstance(value, np.ndarray):  # lists: in the field's own type, never
                    # through float64 (mixed big u64 / i64 integers would lose their low bits)
                    value = np.asarray(value, dtype=self._bases[f.name])
                out.append(np.reshape(value, f.shape))
            elif sub is None:
                out.append(value)
            elif f.is_array:
                out.append([sub().as_tuple(v) for v in value])
            else:
                out.append(sub().as_tuple(value))
        return tuple(out)

    # -- decode ----------------------------------------------------------------------------

    def decode(self, buffer: Buffer, offset: int = 0, *, strict: bool = True) -> dict[str, Any]:
        """Decode into owned Python values: ints, floats, bools, NumPy arrays, dicts, lists."""
        if strict:
            self.check(buffer, offset)
        return self.values_of(self.view(buffer, offset).copy())

    def values_of(self, record: np.ndarray) -> dict[str, Any]:
        """A record's fields as Python values (``decode``'s shape), read through its dtype: what
        a zero-copy ``view`` shows a client. Arrays come out copied."""
        return _record_to_dict(self.ir, self.schema, record)

    def check(self, buffer: Buffer, offset: int = 0, *, nan: bool = True) -> None:
        """Strict-mode checks of encoded bytes: bools 0/1, declared enums, canonical NaNs."""
        self._check_room(buffer, offset, self.size)
        raw = np.ndarray((), dtype=self.raw_dtype, buffer=buffer, offset=offset)
        first: tuple[int, CodecError] | None = None
        for leaf in self._leaves:
            kind = leaf.field.kind
            if kind not in ("bool", "enum", "float") or (kind == "float" and not nan):
                continue
            values = raw
            for name in leaf.path:
                values = values[name]
            if kind == "bool":
                bad = values > 1
            elif kind == "enum":
                assert leaf.enum_values is not None
                bad = ~np.isin(values, leaf.enum_values)
            else:
                elem = leaf.field.elem
                exp, frac = _EXP_MASK[elem], _FRAC_MASK[elem]
                bad = ((values & exp) == exp) & ((values & frac) != 0)
                bad &= values != _CANONICAL_NAN_BITS[elem]
            if not bad.any():
                continue
            index = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.ndim else ()
            found = int(values[index]) if index else int(values)
            flat = _flat_index(leaf, index)
            where = _element_offset(leaf, flat)
            if first is None or where < first[0]:
                first = (where, _strict_error(self.name, leaf, flat, found))
        if first is not None:
            raise first[1]

    def _check_room(self, buffer: Buffer, offset: int, needed: int) -> None:
        length = memoryview(buffer).nbytes
        if offset < 0 or length - offset < needed:
            raise BufferSizeError(
                f"needs {needed} bytes at offset {offset}, buffer has {length}", struct=self.name
            )


class Schema:
    """All codecs of one schema, by struct name, plus the schema's IR and fingerprint."""

    def __init__(self, schema: SchemaIR) -> None:
        self.ir = schema
        self.name = schema.name
        self.fingerprint = schema.fingerprint
        self._dtypes: dict[str, np.dtype[Any]] = {}
        self.structs: dict[str, StructCodec] = {}
        for name, struct in schema.structs.items():
            self.structs[name] = StructCodec(self, struct)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its IR (codecs are rebuilt): a factory holding a schema can go to worker
        processes."""
        return (type(self), (self.ir,))

    def dtype_of(self, struct: str) -> np.dtype[Any]:
        """The NumPy dtype of a struct (nested structs resolved in any declaration order)."""
        if struct not in self._dtypes:
            self._dtypes[struct] = _dtype(self.ir, self.ir.structs[struct], self.dtype_of)
        return self._dtypes[struct]

    def structs_lazy(self, struct: str) -> Callable[[], StructCodec]:
        """A getter for a struct's codec that may not be built yet (nested struct fields)."""
        return lambda: self.structs[struct]

    def __getitem__(self, struct: str) -> StructCodec:
        return self.structs[struct]

    def __getattr__(self, struct: str) -> StructCodec:
        try:
            return self.__dict__["structs"][struct]  # type: ignore[no-any-return]
        except KeyError:
            raise AttributeError(struct) from None


# -- dtypes ------------------------------------------------------------------------------------


def _dtype(
    schema: SchemaIR, struct: StructIR, dtype_of: Callable[[str], np.dtype[Any]]
) -> np.dtype[Any]:
    def element(f: FieldIR) -> Any:
        if f.kind == "struct":
            return dtype_of(f.elem)
        if f.kind == "enum":
            return _NUMPY_SCALAR[schema.enums[f.elem].type]
        return _NUMPY_SCALAR[f.elem]

    return _build_dtype(struct, element)


def _raw_dtype(schema: SchemaIR, struct: StructIR) -> np.dtype[Any]:
    """The same layout with bools as u8 and floats as their bit patterns: for strict checks."""

    def element(f: FieldIR) -> Any:
        if f.kind == "struct":
            return _raw_dtype(schema, schema.structs[f.elem])
        if f.kind == "enum":
            return _NUMPY_SCALAR[schema.enums[f.elem].type]
        if f.kind == "bool":
            return "<u1"
        if f.kind == "float":
            return _FLOAT_BITS[f.elem]
        return _NUMPY_SCALAR[f.elem]

    return _build_dtype(struct, element)


def _build_dtype(struct: StructIR, element: Callable[[FieldIR], Any]) -> np.dtype[Any]:
    formats = [(element(f), f.dims) if f.is_array else element(f) for f in struct.fields]
    return np.dtype(
        {
            "names": [f.name for f in struct.fields],
            "formats": formats,
            "offsets": [f.offset for f in struct.fields],
            "itemsize": struct.size,
        }
    )


def _padding_offsets(schema: SchemaIR, struct: StructIR) -> np.ndarray | None:
    """The byte offsets of ``struct`` that no field covers (zeroed on encode), or None."""
    pad = np.flatnonzero(~_used_bytes(schema, struct, {}))
    return pad if pad.size else None


def _used_bytes(schema: SchemaIR, struct: StructIR, done: dict[str, np.ndarray]) -> np.ndarray:
    """Which bytes of ``struct`` its fields cover: one slice per field (an array of a struct
    repeats that struct's pattern), so a u8[1000,1000,3] field costs one store, not 3M."""
    used = np.zeros(struct.size, dtype=bool)
    for f in struct.fields:
        span = used[f.offset : f.offset + f.count * f.elem_size]
        if f.kind != "struct":
            span[...] = True  # scalar elements sit back to back
            continue
        inner = done.get(f.elem)
        if inner is None:
            inner = done[f.elem] = _used_bytes(schema, schema.structs[f.elem], done)
        width = min(inner.size, f.elem_size)
        span.reshape(f.count, f.elem_size)[:, :width] |= inner[:width]
    return used


def _leaves(schema: SchemaIR, struct: StructIR) -> list[_Leaf]:
    out: list[_Leaf] = []

    def walk(
        s: StructIR,
        path: tuple[str, ...],
        arrays: tuple[bool, ...],
        offsets: tuple[int, ...],
        strides: tuple[int, ...],
    ) -> None:
        for f in s.fields:
            p, a, o = (*path, f.name), (*arrays, f.is_array), (*offsets, f.offset)
            st = (*strides, f.elem_size) if f.is_array else strides
            if f.kind == "struct":
                walk(schema.structs[f.elem], p, a, o, st)
            else:
                enum_values = None
                if f.kind == "enum":
                    enum = schema.enums[f.elem]
                    enum_values = np.array(
                        sorted(enum.values.values()), dtype=_NUMPY_SCALAR[enum.type]
                    )
                out.append(_Leaf(p, a, f, enum_values, o, st))

    walk(struct, (), (), (), ())
    return out


def _flat_index(leaf: _Leaf, index: tuple[int, ...]) -> tuple[int, ...]:
    """``index`` with a multi-dimensional leaf's own indices collapsed to one row-major index
    (paths name an element by its flat index: ``observation[17]``, as in TypeScript)."""
    shape = leaf.field.shape
    if shape is None or len(index) < len(shape):
        return index
    cut = len(index) - len(shape)
    return (*index[:cut], int(np.ravel_multi_index(index[cut:], shape)))


def _element_offset(leaf: _Leaf, index: tuple[int, ...]) -> int:
    offset = sum(leaf.base_offset)
    for i, stride in zip(index, leaf.strides, strict=True):
        offset += i * stride
    return offset


def _path_text(leaf: _Leaf, index: tuple[int, ...]) -> str:
    parts: list[str] = []
    indices = iter(index)
    for name, is_array in zip(leaf.path, leaf.arrays, strict=True):
        parts.append(f"{name}[{next(indices)}]" if is_array else name)
    return ".".join(parts)


def _strict_error(struct: str, leaf: _Leaf, index: tuple[int, ...], found: int) -> CodecError:
    field = _path_text(leaf, index)
    if leaf.field.kind == "bool":
        return InvalidBoolError(f"bool byte is {found}, not 0 or 1", struct=struct, field=field)
    if leaf.field.kind == "enum":
        return InvalidEnumError(
            f"{found} is not a value of enum {leaf.field.elem}", struct=struct, field=field
        )
    width = 8 if leaf.field.elem == "f32" else 16
    return NonCanonicalError(
        f"NaN bits {found:0{width}x} are not the canonical quiet NaN", struct=struct, field=field
    )


# -- values ------------------------------------------------------------------------------------


def _record_to_dict(struct: StructIR, schema: SchemaIR, record: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in struct.fields:
        value = record[f.name]
        if f.kind == "struct":
            sub = schema.structs[f.elem]
            if f.is_array:
                out[f.name] = [_record_to_dict(sub, schema, v) for v in value]
            else:
                out[f.name] = _record_to_dict(sub, schema, value)
        elif f.is_array:
            out[f.name] = np.array(value)
        else:
            out[f.name] = value.item()
    return out


def _validator(codecs: Schema, f: FieldIR) -> Callable[[Any, str], None]:
    """A checker for one field's plain Python value; raises the typed error with the path."""
    if f.kind == "struct":
        sub = codecs.structs_lazy(f.elem)

        def check_struct(value: Any, path: str) -> None:
            if not f.is_array:
                sub().validate_at(value, path + ".")
                return
            for i, item in enumerate(_sequence(value, f, path)):
                sub().validate_at(item, f"{path}[{i}].")

        return check_struct

    check_scalar = _scalar_checker(codecs.ir, f)
    if f.kind == "int" and f.role in FLAG_ROLES:
        check_scalar = _flag_checker(check_scalar)
    if not f.is_array:
        return check_scalar

    def check_array(value: Any, path: str) -> None:
        seq = _sequence(value, f, path)
        if isinstance(seq, np.ndarray) and f.kind in ("int", "float") and seq.dtype.kind in "iuf":
            _check_numeric_array(f, seq, path)
            return
        for i, item in enumerate(seq):
            check_scalar(item, f"{path}[{i}]")

    return check_array


def _sequence(value: Any, f: FieldIR, path: str) -> Sequence[Any] | np.ndarray:
    """An array field's value as one flat sequence of ``count`` elements. A multi-dimensional
    field takes its shape (an array or nested lists) or the flat row-major elements."""
    if isinstance(value, np.ndarray):
        if f.shape is not None and value.shape == f.shape:
            return value.reshape(-1)
        if value.ndim != 1:
            raise ArrayLengthError(f"expected {_array_text(f)}", field=path)
        seq: Sequence[Any] | np.ndarray = value
    elif isinstance(value, list | tuple):
        nested = f.shape is not None and bool(value) and isinstance(value[0], list | tuple)
        seq = _flatten(value, f, path) if nested else value
    else:
        raise ValueTypeError(
            f"expected an array of {f.count}, not {type(value).__name__}", field=path
        )
    if len(seq) != f.count:
        raise ArrayLengthError(f"expected {f.count} elements, got {len(seq)}", field=path)
    return seq


def _array_text(f: FieldIR) -> str:
    if f.shape is None:
        return f"a 1-D array of {f.count}"
    return f"an array of shape {f.shape} (or {f.count} elements, row-major)"


def _flatten(value: Sequence[Any], f: FieldIR, path: str) -> list[Any]:
    """Nested lists of exactly ``f.shape`` -> their elements, row-major."""
    assert f.shape is not None
    shape = f.shape
    out: list[Any] = []

    def walk(item: Any, depth: int) -> None:
        if depth == len(shape):
            out.append(item)
            return
        if not isinstance(item, list | tuple | np.ndarray) or len(item) != shape[depth]:
            raise ArrayLengthError(f"expected {_array_text(f)}", field=path)
        for sub in item:
            walk(sub, depth + 1)

    walk(value, 0)
    return out


def describe(value: Any) -> str:
    """A value as a refusal names it, in JSON's spelling (Node: ``describe``, the same words):
    strings JSON-quoted, ``true``/``false``/``null``, numbers as digits, ``an array``,
    ``an object`` (a mapping), else ``a <type name>``."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool | np.bool_):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        number = float(value)
        if math.isnan(number):
            return "NaN"
        if math.isinf(number):
            return "Infinity" if number > 0 else "-Infinity"
        return str(int(number)) if number.is_integer() and abs(number) < 1e21 else repr(number)
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def _check_numeric_array(f: FieldIR, arr: np.ndarray, path: str) -> None:
    if arr.dtype == _ELEM_DTYPES[f.elem]:  # the field's own type: every element fits it
        return
    if f.kind == "float":
        if f.elem == "f32":
            with np.errstate(invalid="ignore"):
                bad = np.isfinite(arr) & (np.abs(arr) > F32_MAX)
            if bad.any():
                i = int(np.argmax(bad))
                raise ValueRangeError(
                    f"{describe(arr[i].item())} does not fit f32", field=f"{path}[{i}]"
                )
        return
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.floor(arr))
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueTypeError(
                f"{describe(arr[i].item())} is not an integer", field=f"{path}[{i}]"
            )
    lo, hi = INTEGER_RANGES[f.elem]
    bad = (arr < lo) | (arr > hi) if arr.dtype.kind == "f" else _int_out_of_range(arr, lo, hi)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueRangeError(f"{arr[i]} does not fit {f.elem}", field=f"{path}[{i}]")


def _int_out_of_range(arr: np.ndarray, lo: int, hi: int) -> np.ndarray:
    info = np.iinfo(arr.dtype)
    low = arr < lo if info.min < lo else np.zeros(arr.shape, dtype=bool)
    high = arr > hi if info.max > hi else np.zeros(arr.shape, dtype=bool)
    return low | high


def _flag_checker(check_int: Callable[[Any, str], None]) -> Callable[[Any, str], None]:
    """An integer field with a flag role also takes ``True`` / ``False`` (stored as 1 / 0)."""

    def check_flag(value: Any, path: str) -> None:
        if not isinstance(value, bool | np.bool_):
            check_int(value, path)

    return check_flag


def _scalar_checker(schema: SchemaIR, f: FieldIR) -> Callable[[Any, str], None]:
    kind, elem = f.kind, f.elem
    if kind == "bool":

        def check_bool(value: Any, path: str) -> None:
            if not isinstance(value, bool | np.bool_):
                raise ValueTypeError(f"expected a bool, not {describe(value)}", field=path)

        return check_bool
    if kind == "float":

        def check_float(value: Any, path: str) -> None:
            if isinstance(value, bool | np.bool_) or not isinstance(
                value, int | float | np.integer | np.floating
            ):
                raise ValueTypeError(f"expected a number, not {describe(value)}", field=path)
            if elem == "f32":
                try:
                    number = float(value)
                except OverflowError:
                    raise ValueRangeError(
                        f"{describe(value)} does not fit f32", field=path
                    ) from None
                if math.isfinite(number) and abs(number) > F32_MAX:
                    raise ValueRangeError(f"{describe(value)} does not fit f32", field=path)

        return check_float
    if kind == "enum":
        enum = schema.enums[elem]
        declared = frozenset(enum.values.values())

        def check_enum(value: Any, path: str) -> None:
            number = _integral(value, path)
            if number not in declared:
                raise InvalidEnumError(
                    f"{describe(value)} is not a value of enum {elem}", field=path
                )

        return check_enum
    lo, hi = INTEGER_RANGES[elem]

    def check_int(value: Any, path: str) -> None:
        number = _integral(value, path)
        if not lo <= number <= hi:
            raise ValueRangeError(f"{number} does not fit {elem}", field=path)

    return check_int


def _integral(value: Any, path: str) -> int:
    if isinstance(value, bool | np.bool_):
        raise ValueTypeError(f"expected an integer, not {describe(value)}", field=path)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating) and math.isfinite(value) and value == int(value):
        return int(value)
    raise ValueTypeError(f"expected an integer, not {describe(value)}", field=path)


def row_bytes(rows: np.ndarray) -> np.ndarray:
    """An (R,) record array (any row stride: a packed buffer, shm slots) as an (R, itemsize)
    uint8 view: copying rows through it is a byte copy per row, several times faster than
    NumPy's field-by-field copy of structured records."""
    if rows.shape[0] == 0:
        return np.zeros((0, rows.dtype.itemsize), dtype=np.uint8)
    first = rows[:1].view(np.uint8)
    return np.lib.stride_tricks.as_strided(
        first, shape=(rows.shape[0], rows.dtype.itemsize), strides=(rows.strides[0], 1)
    )
