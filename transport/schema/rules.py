"""The naming and size rules every schema obeys, in one place (docs/schema.md, "Naming rules").

The compiler front end applies them, so ``inspect`` and ``compile`` refuse the same inputs, and
no name or number that passes can make an emitter write code that does not import (Python) or
does not type-check (TypeScript ``--strict``). Each check returns the rule that is broken, or
``None``; the compiler turns it into a one-line ``SchemaError`` naming the file and the item.
"""

from __future__ import annotations

import builtins
import keyword
import re

from transport.schema.ir import MAX_NUMBER as MAX_NUMBER
from transport.schema.ir import MAX_STRUCT_SIZE as MAX_STRUCT_SIZE
from transport.schema.ir import SCALARS

NAME_PATTERN = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")
"""An identifier; ``\\Z`` (not ``$``) so a name ending in a newline does not pass."""
MAX_NAME = 64
"""Longest name (schema, struct, enum, value, message, field): file names stay short."""
MAX_DIGITS = 10
"""Longest digit string of an array dimension; longer ones are refused before ``int()``."""
MAX_DEPTH = 32
"""Deepest nesting of structs in structs."""
MAX_DIMS = 63
"""Most dimensions of an array field: NumPy arrays have at most 64, and a batch of records (the
client's env axis) adds one."""
STEP_VIEW_NAMES = frozenset({"source", "record", "copy", "keys", "_fields"})
"""Attributes of the client's ``StepView`` (transport/step_view.py): a field of an ``[env]``
result struct with one of these names would be shadowed by them (``r.source`` would be the
record array, not the field), so the compiler refuses it."""

_PY_KEYWORDS = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist)
_PY_MODULE = frozenset(
    {
        # what emit_python's modules import or define
        "annotations",
        "IntEnum",
        "Any",
        "Final",
        "Schema",
        "StructCodec",
        "ir_from_json",
        "IR",
        "FINGERPRINT",
        "FINGERPRINT_HEX",
        "SCHEMA",
        "MsgType",
        "STRUCT_SIZES",
        "HTTP_STATUS",
        "CLOSING_ERRORS",
        "HTTP_ROUTES",
        "SHM_PROFILE",
        "SHM_CONTROL_SIZE",
        "SHM_SLOT_SIZE",
        "SHM_FINAL_SIZE",
        "SHM_REQUEST_OFFSETS",
        "SHM_RESULT_OFFSETS",
        "SHM_FINAL_RESULT_OFFSETS",
    }
)
_PY_BUILTINS = frozenset(n for n in dir(builtins) if not n.startswith("_"))
"""A module-level name may not shadow a builtin (the generated code calls some of them)."""
_TS_RESERVED = frozenset(
    "break case catch class const continue debugger default delete do else enum export extends "
    "false finally for function if import in instanceof new null return super switch this throw "
    "true try typeof var void while with as implements interface let package private protected "
    "public static yield any boolean number string symbol bigint unknown never object type "
    "await async undefined NaN Infinity arguments eval declare namespace module require "
    "keyof readonly infer is asserts unique global of get set constructor".split()
)
"""Words a struct or enum name cannot be in TypeScript (the generated code writes struct names
in type positions: ``rt.StructLayout<unique, ...>`` does not parse, ``unique`` being the type
operator of ``unique symbol``). Contextual words that pass ``tsc --strict`` there (``satisfies``,
``abstract``, ``accessor``, ``out``, ``override``, ``intrinsic``, ``using``) stay allowed."""
_TS_MODULE = frozenset(
    {
        # what emit_typescript's modules import, define or use from the global scope
        "rt",
        "SchemaJson",
        "IR",
        "FINGERPRINT",
        "FINGERPRINT_HEX",
        "MessageId",
        "SCHEMA",
        "SCHEMAS",
        "SHM_LAYOUT",
        "ERRORS",
        "HTTP_ROUTES",
        "DataView",
        "ArrayLike",
        "Readonly",
        "Record",
        "Partial",
        "Number",
        "BigInt",
        "Boolean",
        "String",
        "Object",
        "Array",
        "Math",
        "Error",
        "Symbol",
        "JSON",
        "Map",
        "Set",
        "Promise",
        "ArrayBuffer",
        "Uint8Array",
        "Uint16Array",
        "Uint32Array",
        "BigUint64Array",
        "Int8Array",
        "Int16Array",
        "Int32Array",
        "BigInt64Array",
        "Float32Array",
        "Float64Array",
        "globalThis",
    }
)
OBJECT_MEMBERS = frozenset(
    {
        "constructor",
        "__proto__",
        "toString",
        "toLocaleString",
        "valueOf",
        "hasOwnProperty",
        "isPrototypeOf",
        "propertyIsEnumerable",
        "__defineGetter__",
        "__defineSetter__",
        "__lookupGetter__",
        "__lookupSetter__",
    }
)
"""Members of ``Object.prototype``: a key or getter with one of these names misbehaves in JS."""
STRUCT_SUFFIXES = ("Input", "View", "Codec", "Layout", "Fields", "Shapes")
"""Names emit_typescript derives from a struct name."""
ENUM_SUFFIXES = ("Values",)
"""Names emit_typescript derives from an enum name."""
RESERVED_SCHEMA_NAMES = frozenset({"index", "__init__", "protocol", "codec", "ir"})
"""Files of the generated packages (and the TypeScript runtime beside them); ``protocol`` is
the envelope's and only the envelope (the schema with ``[errors]``) may take it."""


def check_name(name: object) -> str | None:
    """Every name: an identifier of at most MAX_NAME characters, no Object.prototype member."""
    if not isinstance(name, str) or not name:
        return "a name must be a non-empty string"
    if len(name) > MAX_NAME:
        return f"name is {len(name)} characters long (at most {MAX_NAME})"
    if not NAME_PATTERN.match(name):
        return "invalid name (letters, digits and _, not starting with a digit)"
    if name in OBJECT_MEMBERS:
        return f"{name!r} is a member of JavaScript's Object.prototype"
    if name.startswith("__"):
        return "a name may not start with __ (reserved by Python and JavaScript)"
    return None


def check_type_name(name: str) -> str | None:
    """A struct or enum name: a module-level identifier in both generated modules."""
    if (rule := check_name(name)) is not None:
        return rule
    if name in SCALARS:
        return f"{name!r} is a scalar type"
    if name in _PY_KEYWORDS:
        return f"{name!r} is a Python keyword"
    if name in _TS_RESERVED:
        return f"{name!r} is a TypeScript reserved word"
    if name in _PY_MODULE or name in _TS_MODULE:
        return f"{name!r} is defined or used by the generated modules"
    if name in _PY_BUILTINS:
        return f"{name!r} would shadow a Python builtin in the generated module"
    return None


def check_member_name(name: str) -> str | None:
    """An enum value or a message name: a class attribute in Python, a key in TypeScript."""
    if (rule := check_name(name)) is not None:
        return rule
    if name in _PY_KEYWORDS:
        return f"{name!r} is a Python keyword"
    if name.startswith("_"):
        return "an enum value or message name may not start with _ (reserved by Python's enum)"
    if name in ("name", "value", "mro"):
        return f"{name!r} is an attribute of every Python enum member"
    return None


def check_field_name(name: str) -> str | None:
    """A field: a property and a getter of the generated TypeScript classes."""
    return check_name(name)


def check_schema_name(name: object, *, envelope: bool) -> str | None:
    """A schema name: a Python module, a TypeScript file and namespace of the index."""
    if not isinstance(name, str):
        return '[schema] needs name = "identifier"'
    if (rule := check_name(name)) is not None:
        return rule
    if name in _PY_KEYWORDS:
        return f"{name!r} is a Python keyword"
    if name in _TS_RESERVED or name in _TS_MODULE:
        return f"{name!r} is a TypeScript reserved word or a name the index defines"
    lower = name.lower()
    if lower == "protocol" and envelope and name == "protocol":
        return None
    if lower in RESERVED_SCHEMA_NAMES:
        return f"{name!r} is reserved for a file of the generated packages"
    return None


def check_number(value: object, what: str, *, minimum: int = 0) -> str | None:
    """A count, offset or size: an integer in minimum..MAX_NUMBER."""
    if not isinstance(value, int) or isinstance(value, bool):
        return f"{what} must be an integer"
    if not minimum <= value <= MAX_NUMBER:
        return f"{what} must be {minimum}..{MAX_NUMBER}, not {short_number(value)}"
    return None


def short_number(value: int) -> str:
    """A number for a message; no decimal conversion of a huge one."""
    return str(value) if value.bit_length() <= 64 else f"a {value.bit_length()}-bit number"
