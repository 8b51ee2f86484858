"""The canonical layout IR: what the compiler produces and every emitter and codec consumes.

The IR is plain data. Its JSON form is what ``transport-schema inspect --json`` prints, and the
fingerprint is a hash of its canonical JSON (sorted keys, no whitespace) without the schema's
name, version and the fingerprint itself, so renaming a schema file or editing comments does not
change it but moving, resizing, retyping or renaming anything does.
"""

from __future__ import annotations

import hashlib
import json
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


def _bound_from_json(raw: Any) -> Bound | None:
    """A bound as the IR JSON holds it (text, or a list of texts)."""
    if raw is None or isinstance(raw, str):
        return raw
    return tuple(str(v) for v in raw)


def _check_extents(ir: SchemaIR) -> None:
    """Every field inside its struct (a field past the end would write into the next record),
    and every struct [env] names one of the IR's (node_bridge/src/codec.ts: the same words)."""
    for struct in ir.structs.values():
        for f in struct.fields:
            end = f.offset + f.elem_size * f.count
            if f.offset < 0 or end > struct.size:
                where = "starts before byte 0" if f.offset < 0 else f"ends at byte {end}"
                raise ValueError(
                    f"IR of {ir.name}: field {struct.name}.{f.name} ({f.type} at offset "
                    f"{f.offset}) {where}, outside struct {struct.name} of {struct.size} bytes"
                )
    if ir.env is not None:
        for role in ("result", "request", "multi_request", "multi_result"):
            named = getattr(ir.env, role)
            if named not in ir.structs:
                raise ValueError(
                    f"IR of {ir.name}: [env] {role} names struct {named}, which this IR lacks"
                )


def ir_from_json(data: dict[str, Any]) -> SchemaIR:
    """Rebuild the IR from its JSON form (as embedded in generated modules); checks the hash."""
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
            is_array = bool(rest)
            if elem in SCALARS:
                kind = "bool" if elem == "bool" else "float" if elem[0] == "f" else "int"
                elem_size = SCALARS[elem]
            elif elem in enums and enums[elem].type in SCALARS:
                kind, elem_size = "enum", SCALARS[enums[elem].type]
            elif elem in sizes:
                kind, elem_size = "struct", sizes[elem]
            else:
                raise ValueError(
                    f"IR of {data['name']}: field {name}.{f['name']} has type "
                    f"{json.dumps(type_str)}, not a scalar type, an enum or a struct of this IR"
                )
            fields.append(
                FieldIR(
                    f["name"],
                    type_str,
                    elem,
                    kind,
                    f["offset"],
                    f["size"],
                    f["count"],
                    is_array,
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
    _check_extents(ir)
    return ir
