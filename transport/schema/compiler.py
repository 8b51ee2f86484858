"""Schema compiler front end: a TOML schema file -> validated layout IR.

Every error is a ``SchemaError`` whose one-line message names the file, the struct and the
field. The file format is documented in ``docs/schema.md``.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from transport.errors import SchemaError
from transport.schema.ir import (
    INTEGER_RANGES,
    ROLES,
    SCALARS,
    EnumIR,
    FieldIR,
    MessageIR,
    SchemaIR,
    StructIR,
)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TYPE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\[\s*(-?\d+)\s*\])?\s*$")
_LAYOUTS = ("packed", "natural")
_TAILS = ("msgpack", "utf8")
_JS_SAFE = 2**53 - 1

_SCHEMA_KEYS = {"name", "version", "layout"}
_STRUCT_KEYS = {"layout", "size", "fields", "doc"}
_FIELD_KEYS = {"name", "type", "offset", "role", "doc"}
_ENUM_KEYS = {"type", "values", "doc"}
_MESSAGE_KEYS = {"id", "body", "tail", "batch", "doc"}
_TOP_KEYS = {"schema", "structs", "enums", "messages"}


def load_schema(path: str | Path) -> SchemaIR:
    """Parse and validate a schema file, returning its layout IR."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SchemaError(f"cannot read schema: {exc.strerror}", file=str(path)) from exc
    return compile_schema(text, str(path))


def compile_schema(text: str, file: str = "<schema>") -> SchemaIR:
    """Compile schema source text; ``file`` is only used in error messages."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SchemaError(f"invalid TOML: {exc}", file=file) from exc
    return _Compiler(doc, file).run()


class _Compiler:
    def __init__(self, doc: dict[str, Any], file: str) -> None:
        self.doc = doc
        self.file = file
        self.enums: dict[str, EnumIR] = {}
        self.raw_structs: dict[str, dict[str, Any]] = {}
        self.structs: dict[str, StructIR] = {}
        self.in_progress: list[str] = []
        self.default_layout = "packed"

    def error(self, message: str, struct: str = "", field: str = "") -> SchemaError:
        return SchemaError(message, file=self.file, struct=struct, field=field)

    def run(self) -> SchemaIR:
        if (k := _unknown_key(self.doc, _TOP_KEYS)) is not None:
            raise self.error(f"unknown top-level table {k!r}")
        head = self._table(self.doc.get("schema"), "[schema]")
        if (k := _unknown_key(head, _SCHEMA_KEYS)) is not None:
            raise self.error(f"unknown key {k!r} in [schema]")
        name = head.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise self.error('[schema] needs name = "identifier"')
        version = head.get("version", 1)
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise self.error("[schema] version must be a non-negative integer")
        layout = head.get("layout", "packed")
        if layout not in _LAYOUTS:
            raise self.error(f"[schema] layout must be one of {', '.join(_LAYOUTS)}")
        self.default_layout = layout

        for enum_name, body in self._table(self.doc.get("enums", {}), "[enums]").items():
            self.enums[enum_name] = self._enum(enum_name, body)
        self.raw_structs = self._table(self.doc.get("structs", {}), "[structs]")
        for struct_name in self.raw_structs:
            if struct_name in self.enums:
                raise self.error("name is used by an enum too", struct=struct_name)
            self._struct(struct_name)
        if not self.structs:
            raise self.error("the schema declares no structs")
        messages = self._messages(self._table(self.doc.get("messages", {}), "[messages]"))
        ordered = {n: self.structs[n] for n in self.raw_structs}
        return SchemaIR(name, version, ordered, self.enums, messages, source=self.file)

    def _table(self, value: Any, what: str) -> dict[str, Any]:
        if value is None:
            raise self.error(f"missing {what} table")
        if not isinstance(value, dict):
            raise self.error(f"{what} must be a table")
        return value

    def _enum(self, name: str, body: Any) -> EnumIR:
        where = f"enum {name}"
        if not _NAME.match(name):
            raise self.error(f"{where}: invalid name")
        if not isinstance(body, dict):
            raise self.error(f"{where}: must be a table")
        if (k := _unknown_key(body, _ENUM_KEYS)) is not None:
            raise self.error(f"{where}: unknown key {k!r}")
        base = body.get("type")
        if base not in INTEGER_RANGES:
            raise self.error(f"{where}: type must be an integer scalar, not {base!r}")
        values = body.get("values")
        if not isinstance(values, dict) or not values:
            raise self.error(f"{where}: values must be a non-empty table NAME = integer")
        lo, hi = INTEGER_RANGES[base]
        seen: dict[int, str] = {}
        for key, value in values.items():
            if not _NAME.match(key):
                raise self.error(f"{where}: invalid value name {key!r}")
            if not isinstance(value, int) or isinstance(value, bool):
                raise self.error(f"{where}: value {key} must be an integer")
            if not lo <= value <= hi or abs(value) > _JS_SAFE:
                raise self.error(f"{where}: value {key} = {value} does not fit {base}")
            if value in seen:
                raise self.error(f"{where}: values {seen[value]} and {key} are both {value}")
            seen[value] = key
        return EnumIR(name, base, dict(values))

    def _struct(self, name: str) -> StructIR:
        if name in self.structs:
            return self.structs[name]
        if name in self.in_progress:
            cycle = " -> ".join([*self.in_progress[self.in_progress.index(name) :], name])
            raise self.error(f"struct contains itself ({cycle})", struct=name)
        if not _NAME.match(name):
            raise self.error("invalid struct name", struct=name)
        body = self.raw_structs[name]
        if not isinstance(body, dict):
            raise self.error("must be a table", struct=name)
        if (k := _unknown_key(body, _STRUCT_KEYS)) is not None:
            raise self.error(f"unknown key {k!r}", struct=name)
        layout = body.get("layout", self.default_layout)
        if layout not in _LAYOUTS:
            raise self.error(f"layout must be one of {', '.join(_LAYOUTS)}", struct=name)
        raw_fields = body.get("fields")
        if not isinstance(raw_fields, list) or not raw_fields:
            raise self.error("fields must be a non-empty array of tables", struct=name)

        self.in_progress.append(name)
        fields: list[FieldIR] = []
        end = 0
        align = 1
        names: set[str] = set()
        roles: set[str] = set()
        for index, raw in enumerate(raw_fields):
            if not isinstance(raw, dict):
                raise self.error(f"field #{index} must be a table", struct=name)
            fname = raw.get("name")
            if not isinstance(fname, str) or not _NAME.match(fname):
                raise self.error(f"field #{index} needs a name", struct=name)
            if (k := _unknown_key(raw, _FIELD_KEYS)) is not None:
                raise self.error(f"unknown key {k!r}", name, fname)
            if fname in names:
                raise self.error("duplicate field name", name, fname)
            names.add(fname)
            elem, kind, elem_size, elem_align, count, is_array, type_str = self._field_type(
                name, fname, raw.get("type")
            )
            field_align = 1 if layout == "packed" else elem_align
            offset = raw.get("offset")
            if offset is None:
                offset = _round_up(end, field_align)
            else:
                if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                    raise self.error("offset must be a non-negative integer", name, fname)
                if offset < end:
                    prev = fields[-1]
                    raise self.error(
                        f"explicit offset {offset} overlaps field {prev.name} "
                        f"(bytes {prev.offset}..{prev.offset + prev.size - 1})",
                        name,
                        fname,
                    )
                if offset % field_align:
                    raise self.error(
                        f"explicit offset {offset} is not a multiple of its alignment "
                        f"{field_align} (natural layout)",
                        name,
                        fname,
                    )
            role = raw.get("role")
            if role is not None:
                if role not in ROLES:
                    raise self.error(
                        f"unknown role {role!r} (one of {', '.join(ROLES)})", name, fname
                    )
                if role in roles:
                    raise self.error(f"role {role!r} is already taken", name, fname)
                roles.add(role)
            size = elem_size * count
            fields.append(
                FieldIR(
                    fname,
                    type_str,
                    elem,
                    kind,
                    offset,
                    size,
                    count,
                    is_array,
                    elem_size,
                    role,
                )
            )
            end = offset + size
            align = max(align, field_align)
        self.in_progress.pop()

        explicit = body.get("size")
        if explicit is None:
            total = _round_up(end, align)
        else:
            if not isinstance(explicit, int) or isinstance(explicit, bool):
                raise self.error("size must be an integer", struct=name)
            if explicit < end:
                raise self.error(
                    f"size {explicit} is too small: the fields end at byte {end}",
                    name,
                    fields[-1].name,
                )
            if explicit % align:
                raise self.error(
                    f"size {explicit} is not a multiple of the struct alignment {align}",
                    struct=name,
                )
            total = explicit
        ir = StructIR(name, total, align, layout, tuple(fields))
        self.structs[name] = ir
        return ir

    def _field_type(
        self, struct: str, fname: str, raw: Any
    ) -> tuple[str, str, int, int, int, bool, str]:
        if not isinstance(raw, str):
            raise self.error('type must be a string such as "f32" or "f32[612]"', struct, fname)
        match = _TYPE.match(raw)
        if not match:
            raise self.error(f"cannot parse type {raw!r}", struct, fname)
        elem, count_text = match.group(1), match.group(2)
        is_array = count_text is not None
        count = int(count_text) if is_array else 1
        if count < 1:
            raise self.error(f"array count must be at least 1, not {count}", struct, fname)
        if elem in SCALARS:
            size = SCALARS[elem]
            kind = "bool" if elem == "bool" else "float" if elem[0] == "f" else "int"
            elem_align = size
        elif elem in self.enums:
            size = SCALARS[self.enums[elem].type]
            kind, elem_align = "enum", size
        elif elem in self.raw_structs:
            sub = self._struct(elem)
            size, kind, elem_align = sub.size, "struct", sub.align
        else:
            raise self.error(f"unknown type {elem!r}", struct, fname)
        type_str = f"{elem}[{count}]" if is_array else elem
        return elem, kind, size, elem_align, count, is_array, type_str

    def _messages(self, raw: dict[str, Any]) -> dict[str, MessageIR]:
        out: dict[str, MessageIR] = {}
        ids: dict[int, str] = {}
        for name, body in raw.items():
            where = f"message {name}"
            if not _NAME.match(name):
                raise self.error(f"{where}: invalid name")
            if not isinstance(body, dict):
                raise self.error(f"{where}: must be a table with id and body")
            if (k := _unknown_key(body, _MESSAGE_KEYS)) is not None:
                raise self.error(f"{where}: unknown key {k!r}")
            mid = body.get("id")
            if not isinstance(mid, int) or isinstance(mid, bool) or not 0 <= mid <= 255:
                raise self.error(f"{where}: id must be an integer 0..255 (the u8 msg_type)")
            if mid in ids:
                raise self.error(f"{where}: id {mid:#04x} is already used by {ids[mid]}")
            ids[mid] = name
            struct = body.get("body")
            if struct is not None and struct not in self.structs:
                raise self.error(f"{where}: body {struct!r} is not a struct of this schema")
            tail = body.get("tail")
            if tail not in (None, *_TAILS):
                raise self.error(f"{where}: tail must be one of {', '.join(_TAILS)}")
            batch = body.get("batch", False)
            if not isinstance(batch, bool):
                raise self.error(f"{where}: batch must be true or false")
            if batch and (struct is None or tail is not None):
                raise self.error(f"{where}: a batch message needs a body struct and no tail")
            out[name] = MessageIR(name, mid, struct, tail, batch)
        return out


def _unknown_key(table: dict[str, Any], allowed: set[str]) -> str | None:
    for key in table:
        if key not in allowed:
            return key
    return None


def _round_up(value: int, align: int) -> int:
    return (value + align - 1) // align * align
