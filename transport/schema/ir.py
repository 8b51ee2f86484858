"""The canonical layout IR: what the compiler produces and every emitter and codec consumes.

The IR is plain data. Its JSON form is what ``transport-schema inspect --json`` prints, and the
fingerprint is a hash of its canonical JSON (sorted keys, no whitespace) without the schema's
name, version and the fingerprint itself, so renaming a schema file or editing comments does not
change it but moving, resizing, retyping or renaming anything does.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SCALARS: dict[str, int] = {
    "u8": 1,
    "u16": 2,
    "u32": 4,
    "u64": 8,
    "i8": 1,
    "i16": 2,
    "i32": 4,
    "i64": 8,
    "f32": 4,
    "f64": 8,
    "bool": 1,
}
"""Scalar type name -> size in bytes (natural alignment equals the size)."""

INTEGER_RANGES: dict[str, tuple[int, int]] = {
    "u8": (0, 2**8 - 1),
    "u16": (0, 2**16 - 1),
    "u32": (0, 2**32 - 1),
    "u64": (0, 2**64 - 1),
    "i8": (-(2**7), 2**7 - 1),
    "i16": (-(2**15), 2**15 - 1),
    "i32": (-(2**31), 2**31 - 1),
    "i64": (-(2**63), 2**63 - 1),
}

ROLES = (
    "observation",
    "action",
    "action_mask",
    "reward",
    "terminated",
    "truncated",
    "done",
    "frames",
    "events",
)
"""Field roles an RL adapter looks for; at most one field per role in a struct, except
``observation`` (several observation fields make a gymnasium ``Dict`` space). ``frames`` (u32:
frames an env ran in one request) and ``events`` (integer array: event counters) are for
decision-boundary runs (docs/schema.md)."""
MULTI_ROLES = frozenset({"observation"})
"""Roles several fields of one struct may take."""
BOUNDED_ROLES = frozenset({"observation", "action"})
"""Roles whose fields may declare ``low`` / ``high`` bounds (the adapters' Box and
MultiDiscrete spaces, the runtime's action range check)."""

Bound = str | tuple[str, ...]
"""A declared bound in the IR: one value for every element, or one per element (flat,
row-major), each written as Python's ``repr`` of the number (an int or a finite float). Text,
not JSON numbers, so both languages hash the same canonical JSON (which holds integers only)."""
FLAG_ROLES = frozenset({"done", "terminated", "truncated", "action_mask"})
"""Roles whose integer fields hold flags (0 or 1): the codecs take booleans there too."""


@dataclass(frozen=True)
class FieldIR:
    """One field: its element type, element count and where it sits in its struct."""

    name: str
    type: str  # as written, normalised: "f32", "f32[612]", "f32[2,5,5]", "StepResult[8]", "Command"
    elem: str  # element type: a scalar name, an enum name or a struct name
    kind: str  # "int" | "float" | "bool" | "enum" | "struct"
    offset: int
    size: int  # total bytes of the field (elem_size * count)
    count: int  # element count (the product of a multi-dimensional shape); 1 for a scalar
    is_array: bool
    elem_size: int
    role: str | None = None
    shape: tuple[int, ...] | None = None  # dimensions of a multi-dimensional array, row-major
    low: Bound | None = None  # declared lower bound (inclusive), observation and action fields
    high: Bound | None = None  # declared upper bound (inclusive)
    allow_nonfinite: bool = False  # a float action field that may carry NaN / inf

    def bound(self, which: str) -> tuple[float, ...] | None:
        """The declared ``low`` or ``high`` bound, one float per element; None when absent."""
        raw = self.low if which == "low" else self.high
        if raw is None:
            return None
        if isinstance(raw, str):
            return (float(raw),) * self.count
        return tuple(float(v) for v in raw)

    @property
    def dims(self) -> tuple[int, ...]:
        """The array's dimensions: ``shape``, ``(count,)`` for a 1-D array, ``()`` for a scalar."""
        if self.shape is not None:
            return self.shape
        return (self.count,) if self.is_array else ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "type": self.type,
            "offset": self.offset,
            "size": self.size,
            "count": self.count,
        }
        if self.role is not None:
            out["role"] = self.role
        if self.shape is not None:
            out["shape"] = list(self.shape)
        # absent unless declared: schemas without them keep their IR and fingerprint
        if self.low is not None:
            out["low"] = self.low if isinstance(self.low, str) else list(self.low)
        if self.high is not None:
            out["high"] = self.high if isinstance(self.high, str) else list(self.high)
        if self.allow_nonfinite:
            out["allow_nonfinite"] = True
        return out


@dataclass(frozen=True)
class StructIR:
    name: str
    size: int
    align: int
    layout: str  # "packed" | "natural"
    fields: tuple[FieldIR, ...]

    def field(self, name: str) -> FieldIR:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def role(self, role: str) -> FieldIR | None:
        for f in self.fields:
            if f.role == role:
                return f
        return None

    def roles(self, role: str) -> tuple[FieldIR, ...]:
        """Every field with ``role`` (several only for ``observation``), in field order."""
        return tuple(f for f in self.fields if f.role == role)

    def episode_end_fields(self) -> tuple[FieldIR, ...]:
        """The fields whose truth ends an episode: ``done`` (terminated or truncated) when the
        struct has one, else ``terminated`` and ``truncated`` (whichever it has)."""
        done = self.role("done")
        if done is not None:
            return (done,)
        return tuple(f for f in (self.role("terminated"), self.role("truncated")) if f is not None)

    def control_sizes(self) -> tuple[int, int]:
        """The shm control block's ``obs_size`` / ``act_size`` for this result struct (seed 000
        Appendix B): the element counts of its observation and action_mask fields (0: none)."""
        observation, mask = self.role("observation"), self.role("action_mask")
        return (
            observation.count if observation is not None else 0,
            mask.count if mask is not None else 0,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "align": self.align,
            "layout": self.layout,
            "fields": [f.to_json() for f in self.fields],
        }


@dataclass(frozen=True)
class EnumIR:
    name: str
    type: str  # underlying integer scalar
    values: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "values": dict(self.values)}


@dataclass(frozen=True)
class MessageIR:
    name: str
    id: int
    body: str | None  # struct name, or None for an empty body
    tail: str | None = None  # "msgpack" | "utf8": a variable-length tail after the body
    batch: bool = False  # the body is one or more bodies back to back (one per env)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "body": self.body}
        if self.tail is not None:
            out["tail"] = self.tail
        if self.batch:
            out["batch"] = True
        return out


@dataclass(frozen=True)
class ErrorSpecIR:
    """How one ErrorCode travels (the envelope's ``[errors]`` table): its HTTP status and whether
    the server closes the connection after sending it."""

    name: str  # an ErrorCode member
    http: int
    closes: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"http": self.http, "closes": self.closes}


@dataclass(frozen=True)
class EnvIR:
    """The env protocol of a schema (its ``[env]`` table): which structs the env messages carry."""

    result: str  # STEP_RESP / RESET_RESP body struct
    request: str  # STEP_REQ body struct (has the "action" role field)
    multi_request: str  # STEP_MULTI_REQ body: declared, or derived (action type [seats])
    multi_result: str  # STEP_MULTI_RESP body: declared, or derived (result [seats])
    seats: int  # seats of a STEP_MULTI
    max_frames: int | None = None  # decision-boundary runs: at most this many frames a request
    stall_requests: int | None = None  # the watchdog: frames == 0 this many requests in a row

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "result": self.result,
            "request": self.request,
            "multi_request": self.multi_request,
            "multi_result": self.multi_result,
            "seats": self.seats,
        }
        # only when declared: the IR (and fingerprint) of every other schema is unchanged
        if self.max_frames is not None:
            out["max_frames"] = self.max_frames
        if self.stall_requests is not None:
            out["stall_requests"] = self.stall_requests
        return out

    @staticmethod
    def from_json(data: dict[str, Any]) -> EnvIR:
        return EnvIR(
            data["result"],
            data["request"],
            data["multi_request"],
            data["multi_result"],
            data["seats"],
            data.get("max_frames"),
            data.get("stall_requests"),
        )


@dataclass(frozen=True)
class ShmIR:
    """The shared-memory layout of an env schema: region = control, k slots, k final areas
    (and, in the column layout, the columns: ``shm_columns``).

    ``control``, ``slot`` and ``final`` name structs of the schema (ShmControl, ShmSlot,
    ShmFinal); the offset maps give each request / result field's byte offset in a slot and each
    result field's offset in a final area, whatever the profile ("derived" or a named one).
    """

    profile: str  # "derived", or the name of an explicit layout profile schema ("pac_shm")
    control: str
    slot: str
    final: str
    request_offsets: dict[str, int]
    result_offsets: dict[str, int]
    final_result_offsets: dict[str, int]
    layout: str = "slots"
    """``"slots"`` (request and result fields in each env's slot) or ``"columns"`` (``[env] shm =
    "columns"``: each field of all envs contiguous after the final areas; ``shm_columns``)."""

    @property
    def columns(self) -> bool:
        """True for the column (struct-of-arrays) layout."""
        return self.layout == COLUMNS

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "profile": self.profile,
            "control": self.control,
            "slot": self.slot,
            "final": self.final,
            "request_offsets": dict(self.request_offsets),
            "result_offsets": dict(self.result_offsets),
            "final_result_offsets": dict(self.final_result_offsets),
        }
        # only for the column layout: every slot layout's IR (and fingerprint) is unchanged
        if self.layout != "slots":
            out["layout"] = self.layout
        return out

    @staticmethod
    def from_json(data: dict[str, Any]) -> ShmIR:
        return ShmIR(
            data["profile"],
            data["control"],
            data["slot"],
            data["final"],
            dict(data["request_offsets"]),
            dict(data["result_offsets"]),
            dict(data["final_result_offsets"]),
            str(data.get("layout", "slots")),
        )


COLUMNS = "columns"
"""The reserved ``[env] shm`` value (and IR ``shm.layout``) of the column layout."""
COLUMN_ALIGN = 64
"""Every column starts at a multiple of this (a cache line)."""


@dataclass(frozen=True)
class ShmColumn:
    """One column of a column-layout region: field ``field`` of ``struct`` (the request or the
    result struct, ``part``) for every env, ``field.size`` bytes each, from ``start``."""

    part: str  # "request" | "result"
    struct: str
    field: FieldIR
    start: int

    @property
    def key(self) -> str:
        """``"<struct>.<field>"``: the column's name in the conformance answer."""
        return f"{self.struct}.{self.field.name}"

    def end(self, slots: int) -> int:
        return self.start + slots * self.field.size


def shm_columns(ir: SchemaIR, slots: int) -> tuple[tuple[ShmColumn, ...], int]:
    """The columns of a column-layout region of ``slots`` slots and its size (without the schema
    area): after control, k slots and k final areas, every request field then every result
    field in declaration order, each at the previous one's end rounded up to 64 bytes; the size
    is the last column's end rounded up to 64 (docs/shm.md, "Column layout")."""
    shm, env = ir.shm, ir.env
    if shm is None or env is None or not shm.columns:
        raise ValueError(f"schema {ir.name} has no column shm layout")
    control, slot, final = (ir.structs[n].size for n in (shm.control, shm.slot, shm.final))
    at = control + slots * (slot + final)
    out: list[ShmColumn] = []
    for part, name in (("request", env.request), ("result", env.result)):
        for f in ir.structs[name].fields:
            at = _round_up(at, COLUMN_ALIGN)
            out.append(ShmColumn(part, name, f, at))
            at += slots * f.size
    return tuple(out), _round_up(at, COLUMN_ALIGN)


def _round_up(value: int, align: int) -> int:
    return (value + align - 1) // align * align


@dataclass(frozen=True)
class SchemaIR:
    name: str
    version: int
    structs: dict[str, StructIR]
    enums: dict[str, EnumIR]
    messages: dict[str, MessageIR]
    source: str = field(default="", compare=False)
    env: EnvIR | None = None  # the [env] table; None for a schema without one
    shm: ShmIR | None = None  # the shared-memory layout of an env schema
    errors: dict[str, ErrorSpecIR] | None = None  # the protocol envelope's [errors] table
    http: dict[str, str] | None = None  # the envelope's [http] table: method -> request message

    def layout_json(self) -> dict[str, Any]:
        """The part of the IR the fingerprint covers (``env`` and ``shm`` only when present)."""
        out: dict[str, Any] = {
            "structs": {n: s.to_json() for n, s in self.structs.items()},
            "enums": {n: e.to_json() for n, e in self.enums.items()},
            "messages": {n: m.to_json() for n, m in self.messages.items()},
        }
        if self.env is not None:
            out["env"] = self.env.to_json()
        if self.shm is not None:
            out["shm"] = self.shm.to_json()
        if self.errors is not None:
            out["errors"] = {n: e.to_json() for n, e in self.errors.items()}
        if self.http is not None:
            out["http"] = dict(self.http)
        return out

    @property
    def fingerprint(self) -> int:
        return fingerprint_of(self.layout_json())

    @property
    def fingerprint_hex(self) -> str:
        return f"{self.fingerprint:016x}"

    def to_json(self) -> dict[str, Any]:
        layout = self.layout_json()
        return {
            "name": self.name,
            "version": self.version,
            "fingerprint": self.fingerprint_hex,
            **layout,
        }

    def message_by_id(self, msg_id: int) -> MessageIR | None:
        for m in self.messages.values():
            if m.id == msg_id:
                return m
        return None


def canonical_json(value: Any) -> str:
    """Canonical JSON: sorted keys, no whitespace, ASCII only (the TypeScript side matches)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def fingerprint_of(layout: dict[str, Any]) -> int:
    """The 64-bit fingerprint: the first 8 bytes of SHA-256 of the canonical JSON, big-endian."""
    digest = hashlib.sha256(canonical_json(layout).encode("ascii")).digest()
    return int.from_bytes(digest[:8], "big")


# -- loading an IR ------------------------------------------------------------------------------
#
# One set of rules for every IR read at run time (a .json file, a discovered IR, a generated
# module's IR), in the same order and words as the Node loader (node_bridge/src/ir.ts
# ``checkIrJson`` / ``checkIrLayout``): first the shape (every key known, every value of its JSON
# type, every name a name, every type resolved), then the fingerprint, then the layout (counts,
# sizes and extents, enums, message ids, [env] and the shm offset maps). Each refusal is one
# ``ValueError`` line naming the IR and the path of what is wrong (the loaders make it a
# ``SchemaError`` with the file name, or a ``ProtocolError`` for a discovered IR).

MAX_SAFE_INTEGER = 2**53 - 1
"""Every number of an IR is an integer of at most this magnitude: JavaScript holds it exactly."""
MAX_NUMBER = 2**31 - 1
"""Largest count, offset or size (every generated constant is a signed 32-bit integer)."""
MAX_STRUCT_SIZE = 2**28
"""Largest struct (256 MiB): a total-size cap on what one frame body or shm slot may hold."""
SLOT_WORDS: tuple[tuple[str, str], ...] = (
    ("sem_action_ready", "u32"),
    ("sem_result_ready", "u32"),
    ("command", "SlotCommand"),
    ("status", "u16"),
    ("has_seed", "u8"),
    ("seed", "u64"),
    ("error_len", "u16"),
    ("info_len", "u16"),
    ("checksum", "u32"),
)
"""The control words of every shm slot (``checksum``: CRC-32 of the slot's result bytes when
the server runs with ?checksum=crc32); a derived slot has them in its first cache line."""
SLOT_TEXTS = ("error_text", "info")
"""The ``u8`` text areas of every shm slot: the error text and the server's info map."""

_IDENT = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")
_TYPE_TEXT = re.compile(
    r"\A([A-Za-z_][A-Za-z0-9_]*)(?:\[([1-9][0-9]{0,9}(?:,[1-9][0-9]{0,9}){0,62})\])?\Z"
)
"""A normalised type: ``f32``, ``f32[612]``, ``f32[2,5,5]`` (ASCII, no spaces; the compiler's
output)."""
_HEX16 = re.compile(r"\A[0-9a-f]{16}\Z")
_BOUND_TEXT = re.compile(r"\A-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?\Z")
"""A bound as the compiler writes it: Python's ``repr`` of an int or a finite float."""

_TOP = (
    ("name", "version", "fingerprint", "structs", "enums", "messages"),
    ("env", "shm", "errors", "http"),
)
_STRUCT = (("size", "align", "layout", "fields"), ())
_FIELD = (
    ("name", "type", "offset", "size", "count"),
    ("role", "shape", "low", "high", "allow_nonfinite"),
)
_ENUM = (("type", "values"), ())
_MESSAGE = (("id", "body"), ("tail", "batch"))
_ENV = (
    ("result", "request", "multi_request", "multi_result", "seats"),
    ("max_frames", "stall_requests"),
)
_SHM = (
    (
        "profile",
        "control",
        "slot",
        "final",
        "request_offsets",
        "result_offsets",
        "final_result_offsets",
    ),
    ("layout",),
)
_ERROR = (("http", "closes"), ())
NOT_AN_IR = "not a schema IR: a JSON object (transport-schema inspect --json) was expected"

Path = tuple[str | int, ...]


def _quoted(text: str) -> str:
    """A string as JSON text, ASCII only (Node: fingerprint.ts ``jsonString``)."""
    return json.dumps(text, ensure_ascii=True)


def _where(path: Path) -> str:
    """``structs.StepResult.fields[2].offset``; a key that is not a name is quoted in brackets."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENT.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{_quoted(part)}]"
    return out


def _kind(value: Any) -> str:
    """What a JSON value is, in the words of a refusal."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "a table"


def _shown(value: Any) -> str:
    """A string value quoted, anything else by its kind."""
    return _quoted(value) if isinstance(value, str) else _kind(value)


class _IRShape:
    """The shape rules of a raw IR (before the fingerprint): keys, JSON types, names, types."""

    def __init__(self, data: dict[str, Any]) -> None:
        name = data.get("name")
        self.label = f"IR of {name}" if isinstance(name, str) and _IDENT.match(name) else "IR"

    def fail(self, text: str) -> ValueError:
        return ValueError(f"{self.label}: {text}")

    def table(
        self,
        value: Any,
        path: Path,
        keys: tuple[tuple[str, ...], tuple[str, ...]],
        may_lack: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """A JSON object with only the ``keys`` (required, optional) and every required one
        (but those of ``may_lack``)."""
        if not isinstance(value, dict):
            raise self.fail(f"{_where(path)} is {_kind(value)}, not a table")
        required, optional = keys
        for key in sorted(value):
            if key not in required and key not in optional:
                at = _where(path) if path else "the top level"
                raise self.fail(
                    f"unknown key {_quoted(key)} at {at} (an IR written by a newer transport? "
                    f"this one knows {', '.join((*required, *optional))})"
                )
        for key in required:
            if key not in value and key not in may_lack:
                if key == "fingerprint" and not path:
                    raise ValueError(f"{self.label} names no fingerprint")
                if not path:
                    raise ValueError(f"{self.label} has no key {_quoted(key)}")
                raise self.fail(f"{_where(path)} has no key {_quoted(key)}")
        return value

    def named(self, value: Any, path: Path) -> list[tuple[str, Any]]:
        """A table of names (structs, enum values, ...): its entries, keys in code point order."""
        if not isinstance(value, dict):
            raise self.fail(f"{_where(path)} is {_kind(value)}, not a table")
        for key in sorted(value):
            if not _IDENT.match(key):
                raise self.fail(
                    f"{_where(path)} has a key {_quoted(key)} that is not a name "
                    "([A-Za-z_][A-Za-z0-9_]*)"
                )
        return [(key, value[key]) for key in sorted(value)]

    def integer(self, value: Any, path: Path) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(f"{_where(path)} is {_kind(value)}, not an integer")
        if abs(value) > MAX_SAFE_INTEGER:
            raise self.fail(
                f"{_where(path)} is an integer beyond 2**53-1 in magnitude (JavaScript holds "
                "integers exactly only up to it)"
            )

    def string(self, value: Any, path: Path) -> None:
        if not isinstance(value, str):
            raise self.fail(f"{_where(path)} is {_kind(value)}, not a string")

    def name(self, value: Any, path: Path) -> None:
        self.string(value, path)
        if not _IDENT.match(value):
            raise self.fail(
                f"{_where(path)} is {_quoted(value)}, not a name ([A-Za-z_][A-Za-z0-9_]*)"
            )

    def one_of(self, value: Any, path: Path, choices: tuple[str, ...]) -> None:
        if not isinstance(value, str) or value not in choices:
            raise self.fail(f"{_where(path)} is {_shown(value)}, not {' or '.join(choices)}")

    def true(self, value: Any, path: Path) -> None:
        """An optional flag the IR writes only when true."""
        if value is not True:
            raise self.fail(
                f"{_where(path)} is {_kind(value)}, not true (the key is written only when true)"
            )

    def bound(self, value: Any, path: Path) -> None:
        if isinstance(value, list):
            if not value:
                raise self.fail(f"{_where(path)} is an empty list, not a bound")
            for i, item in enumerate(value):
                self.bound_text(item, (*path, i))
        else:
            self.bound_text(value, path)

    def bound_text(self, value: Any, path: Path) -> None:
        if not isinstance(value, str) or not _BOUND_TEXT.match(value):
            raise self.fail(
                f'{_where(path)} is {_shown(value)}, not a number written as text ("-1.0")'
            )
        if not math.isfinite(float(value)):
            raise self.fail(f"{_where(path)} is {_quoted(value)}, not a finite number")

    def check(self, data: dict[str, Any], fingerprint: bool) -> None:
        self.table(data, (), _TOP, () if fingerprint else ("fingerprint",))
        self.name(data["name"], ("name",))
        self.integer(data["version"], ("version",))
        if "fingerprint" in data:
            value = data["fingerprint"]
            if not isinstance(value, str) or not _HEX16.match(value):
                raise self.fail(f"fingerprint is {_shown(value)}, not 16 lowercase hex digits")
        for name, body in self.named(data["structs"], ("structs",)):
            self.struct(body, ("structs", name))
        for name, body in self.named(data["enums"], ("enums",)):
            path = ("enums", name)
            self.table(body, path, _ENUM)
            self.one_of(body["type"], (*path, "type"), tuple(INTEGER_RANGES))
            for member, value in self.named(body["values"], (*path, "values")):
                self.integer(value, (*path, "values", member))
        for name, body in self.named(data["messages"], ("messages",)):
            path = ("messages", name)
            self.table(body, path, _MESSAGE)
            self.integer(body["id"], (*path, "id"))
            if body["body"] is not None:
                self.string(body["body"], (*path, "body"))
            if "tail" in body:
                self.one_of(body["tail"], (*path, "tail"), ("msgpack", "utf8"))
            if "batch" in body:
                self.true(body["batch"], (*path, "batch"))
        if "env" in data:
            self.env(data["env"])
        if "shm" in data:
            self.shm(data["shm"])
        if "errors" in data:
            for name, body in self.named(data["errors"], ("errors",)):
                self.table(body, ("errors", name), _ERROR)
                self.integer(body["http"], ("errors", name, "http"))
                if not isinstance(body["closes"], bool):
                    raise self.fail(
                        f"{_where(('errors', name, 'closes'))} is {_kind(body['closes'])}, "
                        "not true or false"
                    )
        if "http" in data:
            for method, message in self.named(data["http"], ("http",)):
                self.name(message, ("http", method))
        self.types(data)

    def struct(self, body: Any, path: Path) -> None:
        self.table(body, path, _STRUCT)
        self.integer(body["size"], (*path, "size"))
        self.integer(body["align"], (*path, "align"))
        self.one_of(body["layout"], (*path, "layout"), ("packed", "natural"))
        fields = body["fields"]
        if not isinstance(fields, list) or not fields:
            was = "an empty list" if isinstance(fields, list) else _kind(fields)
            raise self.fail(f"{_where((*path, 'fields'))} is {was}, not a list of fields")
        names: set[str] = set()
        for i, f in enumerate(fields):
            at = (*path, "fields", i)
            self.table(f, at, _FIELD)
            self.name(f["name"], (*at, "name"))
            if f["name"] in names:
                raise self.fail(f"{_where(path)} has two fields named {f['name']}")
            names.add(f["name"])
            self.string(f["type"], (*at, "type"))
            if not _TYPE_TEXT.match(f["type"]):
                raise self.fail(
                    f"{_where((*at, 'type'))} is {_quoted(f['type'])}, not a type such as "
                    '"f32", "f32[612]" or "f32[2,5,5]" (ASCII digits, no spaces)'
                )
            for key in ("offset", "size", "count"):
                self.integer(f[key], (*at, key))
            if "role" in f:
                self.one_of(f["role"], (*at, "role"), ROLES)
            if "shape" in f:
                shape = f["shape"]
                if not isinstance(shape, list):
                    raise self.fail(f"{_where((*at, 'shape'))} is {_kind(shape)}, not a list")
                for d, dim in enumerate(shape):
                    self.integer(dim, (*at, "shape", d))
            for key in ("low", "high"):
                if key in f:
                    self.bound(f[key], (*at, key))
            if "allow_nonfinite" in f:
                self.true(f["allow_nonfinite"], (*at, "allow_nonfinite"))

    def env(self, body: Any) -> None:
        self.table(body, ("env",), _ENV)
        for key in ("result", "request", "multi_request", "multi_result"):
            self.name(body[key], ("env", key))
        for key in ("seats", "max_frames", "stall_requests"):
            if key in body:
                self.integer(body[key], ("env", key))

    def shm(self, body: Any) -> None:
        self.table(body, ("shm",), _SHM)
        for key in ("profile", "control", "slot", "final"):
            self.name(body[key], ("shm", key))
        for key in ("request_offsets", "result_offsets", "final_result_offsets"):
            for name, offset in self.named(body[key], ("shm", key)):
                self.integer(offset, ("shm", key, name))
        if "layout" in body:
            self.one_of(body["layout"], ("shm", "layout"), (COLUMNS,))

    def types(self, data: dict[str, Any]) -> None:
        """Every field's element is a scalar, an enum of the IR or a struct of the IR."""
        structs, enums = data["structs"], data["enums"]
        for name in sorted(structs):
            for f in structs[name]["fields"]:
                match = _TYPE_TEXT.match(f["type"])
                assert match is not None  # checked by struct()
                elem, dims = match.group(1), match.group(2)
                if elem not in SCALARS and elem not in enums and elem not in structs:
                    raise self.fail(
                        f"field {name}.{f['name']} has type {_quoted(f['type'])}, not a scalar "
                        "type, an enum or a struct of this IR"
                    )
                if elem in structs and elem not in SCALARS and dims and "," in dims:
                    raise self.fail(
                        f"field {name}.{f['name']} has type {_quoted(f['type'])}: an array of "
                        "structs has one dimension"
                    )


def check_ir_json(data: Any, *, fingerprint: bool = True) -> None:
    """Refuse a raw IR (parsed JSON) whose shape is not an IR's: an unknown key (an IR written by
    a newer transport), a missing one, a value of the wrong JSON type (an integer must be a JSON
    integer: not a bool, a float or a string), a name that is not one, a type that is not
    normalised or does not resolve. ``fingerprint``: the IR must name one."""
    if not isinstance(data, dict) or "structs" not in data:
        raise ValueError(NOT_AN_IR)
    _IRShape(data).check(data, fingerprint)


_ALIGNS = frozenset(2**i for i in range(13))
"""A struct's ``align``: a power of two up to a page (the compiler's are at most 8)."""


def _dims_of(type_str: str) -> tuple[int, ...]:
    _, _, rest = type_str.partition("[")
    return tuple(int(d) for d in rest[:-1].split(",")) if rest else ()


def _elem_align(ir: SchemaIR, f: FieldIR) -> int:
    """The natural alignment of a field's element (a struct's: its ``align``)."""
    return ir.structs[f.elem].align if f.kind == "struct" else f.elem_size


def check_ir_layout(ir: SchemaIR) -> None:
    """Refuse an IR whose numbers do not add up (after its fingerprint is checked): a count,
    shape or size that is not its type's, a field outside its struct, an enum value that does not
    fit, a message id used twice, an [env] naming a struct the IR lacks, an shm offset map that
    puts a field outside its slot, over a control word or misaligned (node_bridge/src/ir.ts
    ``checkIrLayout``: the same words)."""

    def fail(text: str) -> ValueError:
        return ValueError(f"IR of {ir.name}: {text}")

    for name in sorted(ir.structs):
        struct = ir.structs[name]
        if not 0 <= struct.size <= MAX_STRUCT_SIZE:
            raise fail(f"struct {name} has size {struct.size}, not 0..{MAX_STRUCT_SIZE}")
        if struct.align not in _ALIGNS:
            raise fail(f"struct {name} has align {struct.align}, not a power of two 1..4096")
        for f in struct.fields:
            where = f"field {name}.{f.name}"
            dims = _dims_of(f.type)
            elements = math.prod(dims)
            if elements > MAX_NUMBER:
                raise fail(f"{where}: its type {f.type} has more than {MAX_NUMBER} elements")
            if f.count != elements:
                raise fail(f"{where} has count {f.count}, but its type {f.type} has {elements}")
            if len(dims) > 1 and f.shape != dims:
                shown = "no shape" if f.shape is None else f"shape {list(f.shape)}"
                raise fail(f"{where} has {shown}, but its type {f.type} has dims {list(dims)}")
            if len(dims) <= 1 and f.shape is not None:
                raise fail(f"{where} has a shape, but its type {f.type} has one dimension or none")
            end = f.offset + f.elem_size * f.count
            if f.offset < 0 or end > struct.size:
                at = "starts before byte 0" if f.offset < 0 else f"ends at byte {end}"
                raise fail(
                    f"field {name}.{f.name} ({f.type} at offset {f.offset}) {at}, outside struct "
                    f"{name} of {struct.size} bytes"
                )
    # then what each field says of itself (a second pass: a struct grown or shrunk is named
    # where it no longer fits, not in the size of the array that holds it)
    for name in sorted(ir.structs):
        for f in ir.structs[name].fields:
            where = f"field {name}.{f.name}"
            if f.size != f.elem_size * f.count:
                raise fail(
                    f"{where} has size {f.size}, but {f.count} x {f.elem} take "
                    f"{f.elem_size * f.count} bytes"
                )
            for which, bound in (("low", f.low), ("high", f.high)):
                if isinstance(bound, tuple) and len(bound) != f.count:
                    raise fail(
                        f"{where}: {which} has {len(bound)} values; the field has {f.count} "
                        "elements"
                    )
    for name in sorted(ir.enums):
        enum = ir.enums[name]
        lo, hi = INTEGER_RANGES[enum.type]
        seen: dict[int, str] = {}
        for member in sorted(enum.values):
            value = enum.values[member]
            if not lo <= value <= hi:
                raise fail(f"enum {name}: value {member} = {value} does not fit {enum.type}")
            if value in seen:
                raise fail(f"enum {name}: values {seen[value]} and {member} are both {value}")
            seen[value] = member
    ids: dict[int, str] = {}
    for name in sorted(ir.messages):
        mid = ir.messages[name].id
        if not 0 <= mid <= 255:
            raise fail(f"message {name}: id {mid} is not 0..255 (the u8 msg_type)")
        if mid in ids:
            raise fail(f"message {name}: id 0x{mid:02x} is already used by {ids[mid]}")
        ids[mid] = name
    if ir.env is not None:
        _check_env(ir, fail)
    if ir.shm is not None:
        _check_shm(ir, fail)


def _check_env(ir: SchemaIR, fail: Callable[[str], ValueError]) -> None:
    env = ir.env
    assert env is not None
    for role in ("result", "request", "multi_request", "multi_result"):
        named = getattr(env, role)
        if named not in ir.structs:
            raise fail(f"[env] {role} names struct {named}, which this IR lacks")
    if not 1 <= env.seats <= 1024:
        raise fail(f"[env] seats is {env.seats}, not 1..1024")
    for key in ("max_frames", "stall_requests"):
        value = getattr(env, key)
        if value is not None and not 1 <= value < 2**32:
            raise fail(f"[env] {key} is {value}, not 1..2**32-1")


def _check_shm(ir: SchemaIR, fail: Callable[[str], ValueError]) -> None:
    """The shm section: its structs exist, and every offset map puts each field inside its slot
    (final area), clear of the control words it has (``SLOT_WORDS``, ``SLOT_TEXTS``,
    ``final_seq``), and aligned where both its struct and the slot (final area) are natural (a
    packed one takes any offset)."""
    shm, env = ir.shm, ir.env
    assert shm is not None
    if env is None:
        raise fail("[shm] needs an [env] section, which this IR lacks")
    for role in ("control", "slot", "final"):
        named = getattr(shm, role)
        if named not in ir.structs:
            raise fail(f"[shm] {role} names struct {named}, which this IR lacks")
    slot, final = ir.structs[shm.slot], ir.structs[shm.final]
    guarded_words = {w for w, _ in SLOT_WORDS} | set(SLOT_TEXTS)
    request, result = ir.structs[env.request], ir.structs[env.result]
    in_slots = not shm.columns
    for key, offsets, struct, host, guarded in (
        ("request_offsets", shm.request_offsets, request, slot, in_slots),
        ("result_offsets", shm.result_offsets, result, slot, in_slots),
        ("final_result_offsets", shm.final_result_offsets, result, final, True),
    ):
        names = {f.name for f in struct.fields} if guarded else set()
        for f in struct.fields if guarded else ():
            if f.name not in offsets:
                raise fail(f"[shm] {key} has no offset for field {struct.name}.{f.name}")
        for name in sorted(offsets):
            if name not in names:
                why = (
                    f"not a field of {struct.name}"
                    if guarded
                    else "the column layout keeps no field in the slots"
                )
                raise fail(f"[shm] {key} names {name}: {why}")
        what = "slot" if host is slot else "final area"
        words = guarded_words if host is slot else {"final_seq"}
        controls = [g for g in host.fields if g.name in words]
        for f in struct.fields if guarded else ():
            at = offsets[f.name]
            ref = f"[shm] {key}.{f.name} is {at}: {struct.name}.{f.name} ({f.size} bytes)"
            if at < 0:
                raise fail(
                    f"{ref} would start before {what} {host.name} ({host.size} bytes), in the "
                    "control block or another env's area"
                )
            if at + f.size > host.size:
                raise fail(
                    f"{ref} would end at byte {at + f.size}, past {what} {host.name} "
                    f"({host.size} bytes), in another env's area or past the region"
                )
            for guard in controls:
                if at < guard.offset + guard.size and guard.offset < at + f.size:
                    raise fail(
                        f"{ref} would overlap the control word {guard.name} of {what} "
                        f"{host.name} (bytes {guard.offset}..{guard.offset + guard.size - 1})"
                    )
            natural = host.layout == struct.layout == "natural"  # packed: any byte will do
            align = _elem_align(ir, f) if natural else 1
            if at % align:
                raise fail(
                    f"{ref} is not at a multiple of {align}, the alignment of {f.elem} in the "
                    f"natural layouts of {struct.name} and {what} {host.name}"
                )


def _bound_from_json(raw: Any) -> Bound | None:
    """A bound as the IR JSON holds it (text, or a list of texts)."""
    if raw is None or isinstance(raw, str):
        return raw
    return tuple(str(v) for v in raw)


def ir_from_json(data: Any, *, require_fingerprint: bool = False) -> SchemaIR:
    """Rebuild the IR from its JSON form (a ``.json`` file, a discovered IR, a generated module's
    ``IR``), refused with a one-line ``ValueError`` unless it passes ``check_ir_json``, hashes
    to the fingerprint it names (``require_fingerprint``: it must name one) and passes
    ``check_ir_layout``."""
    check_ir_json(data, fingerprint=require_fingerprint)
    enums = {
        name: EnumIR(name, body["type"], dict(body["values"]))
        for name, body in data["enums"].items()
    }
    structs: dict[str, StructIR] = {}
    sizes = {name: body["size"] for name, body in data["structs"].items()}
    for name, body in data["structs"].items():
        fields = []
        for f in body["fields"]:
            type_str: str = f["type"]
            elem, _, rest = type_str.partition("[")
            if elem in SCALARS:
                kind = "bool" if elem == "bool" else "float" if elem[0] == "f" else "int"
                elem_size = SCALARS[elem]
            elif elem in enums:
                kind, elem_size = "enum", SCALARS[enums[elem].type]
            else:
                kind, elem_size = "struct", sizes[elem]
            fields.append(
                FieldIR(
                    f["name"],
                    type_str,
                    elem,
                    kind,
                    f["offset"],
                    f["size"],
                    f["count"],
                    bool(rest),
                    elem_size,
                    f.get("role"),
                    tuple(f["shape"]) if "shape" in f else None,
                    _bound_from_json(f.get("low")),
                    _bound_from_json(f.get("high")),
                    bool(f.get("allow_nonfinite", False)),
                )
            )
        structs[name] = StructIR(name, body["size"], body["align"], body["layout"], tuple(fields))
    messages = {
        name: MessageIR(name, body["id"], body["body"], body.get("tail"), body.get("batch", False))
        for name, body in data["messages"].items()
    }
    env = EnvIR.from_json(data["env"]) if "env" in data else None
    shm = ShmIR.from_json(data["shm"]) if "shm" in data else None
    errors = (
        {n: ErrorSpecIR(n, e["http"], e["closes"]) for n, e in data["errors"].items()}
        if "errors" in data
        else None
    )
    http = dict(data["http"]) if "http" in data else None
    ir = SchemaIR(
        data["name"],
        data["version"],
        structs,
        enums,
        messages,
        env=env,
        shm=shm,
        errors=errors,
        http=http,
    )
    if "fingerprint" in data and data["fingerprint"] != ir.fingerprint_hex:
        raise ValueError(
            f"IR of {ir.name} has fingerprint {data['fingerprint']} but hashes to "
            f"{ir.fingerprint_hex}"
        )
    check_ir_layout(ir)
    return ir
