"""The TypeScript emitter: one layout IR -> the text of ``node_bridge/src/generated/<name>.ts``.

A generated module holds, for one schema: the IR as a constant (the JSON of ``ir.to_json()``),
its fingerprint (``FINGERPRINT_HEX`` and the bigint ``FINGERPRINT``), every enum as an
``as const`` object plus a union type, the message ids, and per struct an output ``interface``,
an ``...Input`` type that ``encode`` accepts, a zero-copy ``...View`` class and a ``...Codec``
built by the runtime's ``defineStruct`` from straight-line functions with the IR's offsets
written in. Everything that is the same for every schema (value checks, error codes and paths,
NaN canonicalisation, array copies) lives in the hand-written runtime ``node_bridge/src/codec.ts``
and is called as ``rt.<helper>``, never duplicated here.

``transport-schema compile`` writes ``emit_typescript(ir)`` to ``<name>.ts`` and
``emit_typescript_index(names)`` to ``index.ts``. Output is deterministic: the same IR gives the
same text.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePath

from transport.schema.diagram import shm_diagram
from transport.schema.ir import FLAG_ROLES, SCALARS, FieldIR, SchemaIR, StructIR

__all__ = ["emit_typescript", "emit_typescript_index"]

_DATAVIEW_TYPE = {
    "u8": "Uint8",
    "u16": "Uint16",
    "u32": "Uint32",
    "u64": "BigUint64",
    "i8": "Int8",
    "i16": "Int16",
    "i32": "Int32",
    "i64": "BigInt64",
    "f32": "Float32",
    "f64": "Float64",
}
_TYPED_ARRAY = {
    "u8": "Uint8Array",
    "u16": "Uint16Array",
    "u32": "Uint32Array",
    "u64": "BigUint64Array",
    "i8": "Int8Array",
    "i16": "Int16Array",
    "i32": "Int32Array",
    "i64": "BigInt64Array",
    "f32": "Float32Array",
    "f64": "Float64Array",
}
_BIG = ("u64", "i64")

# Names every generated module defines itself; a struct or enum may not take them.
_MODULE_NAMES = frozenset(
    {
        "rt",
        "IR",
        "FINGERPRINT",
        "FINGERPRINT_HEX",
        "MessageId",
        "SCHEMA",
        "SHM_LAYOUT",
        "ERRORS",
        "HTTP_ROUTES",
    }
)
_TS_RESERVED = frozenset(
    "break case catch class const continue debugger default delete do else enum export extends "
    "false finally for function if import in instanceof new null return super switch this throw "
    "true try typeof var void while with as implements interface let package private protected "
    "public static yield any boolean number string symbol bigint unknown never object type "
    "await async".split()
)

_INDENT = "  "


IN_TREE_RUNTIME = ".."
"""The runtime import of the modules generated into node_bridge/src/generated (relative)."""
PACKAGE_RUNTIME = "@transport/node-bridge"
"""The runtime import of modules generated for a user's project: the npm package by name."""


def runtime_import_for(ts_out: Path) -> str:
    """The runtime import of modules written to ``ts_out``: relative inside node_bridge's own
    ``src/generated`` (the package compiles itself from source), the package name anywhere else
    (a user's project that installed @transport/node-bridge)."""
    folder = ts_out.resolve()
    package = folder.parent.parent / "package.json"
    if folder.name == "generated" and folder.parent.name == "src" and package.is_file():
        try:
            if json.loads(package.read_text()).get("name") == PACKAGE_RUNTIME:
                return IN_TREE_RUNTIME
        except (OSError, ValueError):
            pass
    return PACKAGE_RUNTIME


def emit_typescript(ir: SchemaIR, runtime: str = IN_TREE_RUNTIME) -> str:
    """The full text of the generated TypeScript module for one schema; ``runtime``: where it
    imports the codec runtime from (``runtime_import_for`` its output folder)."""
    _check_names(ir)
    source = PurePath(ir.source).name if ir.source else f"{ir.name}.toml"
    parts = [
        _header(f"from the schema {source} (schema {ir.name!r}, version {ir.version})"),
        f'import * as rt from "{runtime}/codec";\n'
        f'import type {{ SchemaJson }} from "{runtime}/ir";\n',
        _emit_constants(ir),
        *(_emit_enum(ir, name) for name in ir.enums),
        _emit_message_ids(ir),
        *_emit_envelope(ir),
        *(_emit_struct(ir, struct) for struct in ir.structs.values()),
        _emit_schema(ir),
        *_emit_shm(ir),
    ]
    return "\n".join(parts)


def emit_typescript_index(schema_names: list[str], runtime: str = IN_TREE_RUNTIME) -> str:
    """``index.ts``: every schema module as a namespace, and ``SCHEMAS`` keyed by schema name."""
    names = sorted(set(schema_names))
    for name in names:
        if not name.isidentifier() or name in _TS_RESERVED or name == "SCHEMAS":
            raise ValueError(f"schema name {name!r} cannot be a TypeScript module namespace")
    lines = [_header("from the schemas " + ", ".join(names) if names else "with no schemas")]
    lines.append(f'import type {{ SchemaModule }} from "{runtime}/codec";')
    # with its .js extension: resolved to the .ts file by every module setting, ESM (nodenext) too
    lines += [f'import * as {name} from "./{name}.js";' for name in names]
    lines.append("")
    lines.append(f"export {{ {', '.join(names)} }};" if names else "export {};")
    lines.append("")
    lines.append("/** Every generated schema module, keyed by schema name. */")
    lines.append("export const SCHEMAS: Readonly<Record<string, SchemaModule>> = {")
    lines += [f"{_INDENT}{name}: {name}.SCHEMA," for name in names]
    lines.append("};")
    return "\n".join(lines) + "\n"


# -- module parts ----------------------------------------------------------------------------------


def _header(origin: str) -> str:
    return (
        f"// Generated by `transport-schema compile` {origin}.\n"
        "// Do not edit: change the schema and run `transport-schema compile` again.\n"
    )


def _check_names(ir: SchemaIR) -> None:
    taken: set[str] = set()
    for name in (*ir.enums, *ir.structs):
        if name in _MODULE_NAMES or name in _TS_RESERVED:
            raise ValueError(f"schema {ir.name}: {name!r} cannot be a TypeScript type name")
        taken.add(name)
    for struct in ir.structs.values():
        for suffix in ("Input", "View", "Codec", "Layout", "Fields", "Shapes"):
            if struct.name + suffix in taken:
                raise ValueError(
                    f"schema {ir.name}: {struct.name + suffix!r} clashes with the generated "
                    f"names of struct {struct.name}"
                )
    for name in ir.enums:
        if name + "Values" in taken:
            raise ValueError(f"schema {ir.name}: {name + 'Values'!r} clashes with enum {name}")


def _emit_constants(ir: SchemaIR) -> str:
    ir_json = json.dumps(ir.to_json(), indent=2, ensure_ascii=True)
    return (
        "/** The layout IR (`transport-schema inspect --json`); fingerprint.ts re-hashes it. */\n"
        f"export const IR: SchemaJson = {ir_json};\n"
        "\n"
        "/** The schema fingerprint: first 8 bytes of SHA-256 of the canonical layout IR. */\n"
        f'export const FINGERPRINT_HEX = "{ir.fingerprint_hex}";\n'
        f"export const FINGERPRINT = 0x{ir.fingerprint_hex}n;\n"
    )


def _emit_enum(ir: SchemaIR, name: str) -> str:
    enum = ir.enums[name]
    members = "".join(f"{_INDENT}{key}: {value},\n" for key, value in enum.values.items())
    used = any(f.elem == name for s in ir.structs.values() for f in s.fields)
    values = f"const {name}Values = rt.enumValueSet({name});\n" if used else ""
    return (
        f"/** Enum {name} (stored as {enum.type}). */\n"
        f"export const {name} = {{\n{members}}} as const;\n"
        f"export type {name} = (typeof {name})[keyof typeof {name}];\n"
        f"{values}"
    )


def _emit_message_ids(ir: SchemaIR) -> str:
    members = "".join(f"{_INDENT}{name}: {m.id},\n" for name, m in ir.messages.items())
    return (
        "/** Message type ids (the frame header's msg_type), by message name. */\n"
        f"export const MessageId = {{\n{members}}} as const;\n"
        "export type MessageId = (typeof MessageId)[keyof typeof MessageId];\n"
    )


def _emit_schema(ir: SchemaIR) -> str:
    entries = "".join(f"{_INDENT}{name}: {name}Codec,\n" for name in ir.structs)
    return (
        "/** The schema for dynamic use: IR, fingerprint, codecs by struct name, messages. */\n"
        f"export const SCHEMA: rt.SchemaModule = rt.defineSchema(IR, FINGERPRINT, {{\n"
        f"{entries}}});\n"
    )


def _emit_envelope(ir: SchemaIR) -> list[str]:
    """The protocol envelope's [errors] and [http] tables as constants (only it has them)."""
    out: list[str] = []
    if ir.errors is not None:
        body = "".join(
            f"{_INDENT}{name}: {{ http: {e.http}, closes: {'true' if e.closes else 'false'} }},\n"
            for name, e in ir.errors.items()
        )
        out.append(
            "/** [errors]: per ErrorCode, its HTTP status and whether the connection closes. */\n"
            f"export const ERRORS = {{\n{body}}} as const;\n"
        )
    if ir.http is not None:
        body = "".join(f'{_INDENT}{m}: "{msg}",\n' for m, msg in ir.http.items())
        out.append(
            "/** [http]: POST /v1/<method> -> the request message it carries. */\n"
            f"export const HTTP_ROUTES = {{\n{body}}} as const;\n"
        )
    return out


def _emit_shm(ir: SchemaIR) -> list[str]:
    """The shm region's diagram and flat offsets (the same numbers as ``IR.shm``)."""
    shm = ir.shm
    if shm is None:
        return []
    diagram = "".join(f"// {line}".rstrip() + "\n" for line in shm_diagram(ir))

    def mapping(offsets: dict[str, int]) -> str:
        body = "".join(f"{_INDENT * 2}{name}: {offset},\n" for name, offset in offsets.items())
        return f"{{\n{body}{_INDENT}}}"

    return [
        diagram
        + "export const SHM_LAYOUT = {\n"
        + f'{_INDENT}profile: "{shm.profile}",\n'
        + (f'{_INDENT}layout: "{shm.layout}",\n' if shm.columns else "")
        + f"{_INDENT}controlSize: {ir.structs[shm.control].size},\n"
        + f"{_INDENT}slotSize: {ir.structs[shm.slot].size},\n"
        + f"{_INDENT}finalSize: {ir.structs[shm.final].size},\n"
        + f"{_INDENT}requestOffsets: {mapping(shm.request_offsets)},\n"
        + f"{_INDENT}resultOffsets: {mapping(shm.result_offsets)},\n"
        + f"{_INDENT}finalResultOffsets: {mapping(shm.final_result_offsets)},\n"
        + "} as const;\n"
    ]


# -- one struct ----------------------------------------------------------------------------------


def _emit_struct(ir: SchemaIR, struct: StructIR) -> str:
    name = struct.name
    types = f"{name}, {name}Input, {name}View"
    field_names = ", ".join(f'"{f.name}"' for f in struct.fields)
    return "\n".join(
        [
            _rule(f"{name}: {struct.size} bytes, {struct.layout} layout, align {struct.align}"),
            "",
            _emit_interface(ir, struct, output=True),
            _emit_interface(ir, struct, output=False),
            _emit_view_class(ir, struct),
            *_emit_shapes(struct),
            f"const {name}Fields = rt.nameSet([{field_names}]);",
            "",
            f"const {name}Layout: rt.StructLayout<{types}> = {{",
            f'{_INDENT}name: "{name}",',
            f"{_INDENT}size: {struct.size},",
            _emit_validate(ir, struct),
            _emit_write(ir, struct),
            _emit_check(ir, struct),
            _emit_read(ir, struct),
            f"{_INDENT}viewAt(dv: DataView, at: number): {name}View {{",
            f"{_INDENT * 2}return new {name}View(dv, at);",
            f"{_INDENT}}},",
            "};",
            "",
            f"export const {name}Codec: rt.StructCodec<{types}> = rt.defineStruct({name}Layout);",
            "",
        ]
    )


def _emit_shapes(struct: StructIR) -> list[str]:
    """``<Struct>Shapes``: the shape of each multi-dimensional field (views and decoded values
    are flat, row-major)."""
    shaped = [f for f in struct.fields if f.shape is not None]
    if not shaped:
        return []
    body = "".join(f"{_INDENT}{f.name}: [{', '.join(map(str, f.dims))}],\n" for f in shaped)
    return [
        f"/** Shapes of {struct.name}'s multi-dimensional fields (row-major; values are flat). */",
        f"export const {struct.name}Shapes = {{\n{body}}} as const;",
        "",
    ]


def _flat_value(struct: StructIR, f: FieldIR, value: str, path: str) -> str:
    """``value``, or for a multi-dimensional field its flat elements (``rt.flatArray``)."""
    if f.shape is None:
        return value
    return f'rt.flatArray({value}, {struct.name}Shapes.{f.name}, {path}, "{f.name}")'


def _rule(title: str) -> str:
    head = f"// -- {title} "
    return head + "-" * max(3, 100 - len(head))


def _field_doc(f: FieldIR) -> str:
    role = f", role {f.role}" if f.role else ""
    unit = "byte" if f.size == 1 else "bytes"
    flat = f", flat row-major: {f.count} elements" if f.shape is not None else ""
    return f"{_INDENT}/** {f.type} at offset {f.offset} ({f.size} {unit}{role}{flat}). */\n"


def _emit_interface(ir: SchemaIR, struct: StructIR, *, output: bool) -> str:
    if output:
        head = f"/** {struct.name} as `decode` returns it. */\n"
        head += f"export interface {struct.name} {{\n"
    else:
        head = f"/** What `{struct.name}Codec.encode` accepts (validated at run time). */\n"
        head += f"export interface {struct.name}Input {{\n"
    body = "".join(
        _field_doc(f) + f"{_INDENT}{f.name}: {_value_type(ir, f, output)};\n" for f in struct.fields
    )
    return head + body + "}\n"


def _is_flag(f: FieldIR) -> bool:
    """An integer field whose role is a flag: its input also takes booleans (codec.ts)."""
    return f.kind == "int" and f.role in FLAG_ROLES


def _value_type(ir: SchemaIR, f: FieldIR, output: bool) -> str:
    if f.kind == "struct":
        element = f.elem if output else f"{f.elem}Input"
        if not f.is_array:
            return element
        return f"{element}[]" if output else f"ArrayLike<{element}>"
    nested = not output and f.shape is not None
    if f.kind == "bool":
        if not f.is_array:
            return "boolean"
        if nested:
            return "rt.NestedArray<boolean>"
        return "boolean[]" if output else "ArrayLike<boolean>"
    scalar = _scalar_of(ir, f)
    flag = " | boolean" if not output and _is_flag(f) else ""
    if f.is_array:
        if output:
            return _TYPED_ARRAY[scalar]
        element = ("bigint | number" if scalar in _BIG else "number") + flag
        return f"rt.NestedArray<{element}>" if nested else f"ArrayLike<{element}>"
    if scalar in _BIG:
        return "bigint" if output else "bigint | number" + flag
    return "number" + flag


def _view_type(ir: SchemaIR, f: FieldIR) -> str:
    if f.kind == "struct":
        return f"{f.elem}View[]" if f.is_array else f"{f.elem}View"
    if f.kind == "bool" and f.is_array:
        return "Uint8Array"
    return _value_type(ir, f, output=True)


def _scalar_of(ir: SchemaIR, f: FieldIR) -> str:
    """The stored scalar type of a numeric or enum field."""
    return ir.enums[f.elem].type if f.kind == "enum" else f.elem


def _at(base: str, offset: int) -> str:
    return f"{base} + {offset}" if offset else base


# -- validate: plain values, in declaration order (which is byte order) ---------------------------


def _emit_validate(ir: SchemaIR, struct: StructIR) -> str:
    lines = [
        f"{_INDENT}validateAt(value: unknown, path: string): void {{",
        f"{_INDENT * 2}const fields = rt.asFields(value, path);",
    ]
    for f in struct.fields:
        lines.append(_INDENT * 2 + _validate_field(ir, struct, f) + ";")
    lines.append(f"{_INDENT * 2}rt.rejectUnknownFields(fields, {struct.name}Fields, path);")
    lines.append(f"{_INDENT}}},")
    return "\n".join(lines)


def _validate_field(ir: SchemaIR, struct: StructIR, f: FieldIR) -> str:
    value = _flat_value(struct, f, f'rt.fieldValue(fields, "{f.name}", path)', "path")
    where = f'path, "{f.name}"'
    if f.kind == "struct":
        if f.is_array:
            return f"rt.checkStructArray({f.elem}Layout, {value}, {f.count}, {where})"
        return f"{f.elem}Layout.validateAt({value}, `${{path}}{f.name}.`)"
    if f.kind == "bool":
        if f.is_array:
            return f"rt.checkBoolArray({value}, {f.count}, {where})"
        return f"rt.checkBool({value}, {where})"
    if f.kind == "enum":
        enum = f'{f.elem}Values, "{f.elem}"'
        if f.is_array:
            return f"rt.checkEnumArray({value}, {enum}, {f.count}, {where})"
        return f"rt.checkEnum({value}, {enum}, {where})"
    check = "Float" if f.kind == "float" else "Flag" if _is_flag(f) else "Integer"
    if f.is_array:
        return f'rt.check{check}Array({value}, "{f.elem}", {f.count}, {where})'
    return f'rt.check{check}({value}, "{f.elem}", {where})'


# -- write: validated values at the IR's offsets --------------------------------------------------


def _emit_write(ir: SchemaIR, struct: StructIR) -> str:
    lines = [f"{_INDENT}writeAt(dv: DataView, at: number, value: {struct.name}Input): void {{"]
    for f in struct.fields:
        lines.append(_INDENT * 2 + _write_field(ir, struct, f) + ";")
    lines.append(f"{_INDENT}}},")
    return "\n".join(lines)


def _write_field(ir: SchemaIR, struct: StructIR, f: FieldIR) -> str:
    at, value = _at("at", f.offset), _flat_value(struct, f, f"value.{f.name}", '""')
    if f.kind == "struct":
        if f.is_array:
            return f"rt.writeStructArray({f.elem}Layout, dv, {at}, {value}, {f.count})"
        return f"{f.elem}Layout.writeAt(dv, {at}, {value})"
    if f.kind == "bool":
        if f.is_array:
            return f"rt.writeBoolArray(dv, {at}, {value}, {f.count})"
        return f"dv.setUint8({at}, {value} ? 1 : 0)"
    scalar = _scalar_of(ir, f)
    if f.is_array:
        return f'rt.writeArray(dv, {at}, "{scalar}", {value}, {f.count})'
    if scalar == "f32":
        return f"rt.setF32(dv, {at}, {value})"
    if scalar == "f64":
        return f"rt.setF64(dv, {at}, {value})"
    convert = "rt.toBigInt" if scalar in _BIG else "rt.toNumber"
    little = ", true" if SCALARS[scalar] > 1 else ""
    return f"dv.set{_DATAVIEW_TYPE[scalar]}({at}, {convert}({value}){little})"


# -- strict checks of stored bytes, in byte order -------------------------------------------------


def _needs_check(ir: SchemaIR, struct: StructIR) -> bool:
    return any(
        f.kind in ("bool", "enum", "float")
        or (f.kind == "struct" and _needs_check(ir, ir.structs[f.elem]))
        for f in struct.fields
    )


def _emit_check(ir: SchemaIR, struct: StructIR) -> str:
    if not _needs_check(ir, struct):
        return "\n".join(
            [
                f"{_INDENT}checkAt(): void {{",
                f"{_INDENT * 2}// no bools, enums or floats to check",
                f"{_INDENT}}},",
            ]
        )
    lines = [f"{_INDENT}checkAt(dv: DataView, at: number, path: string): void {{"]
    for f in sorted(struct.fields, key=lambda f: f.offset):
        line = _check_field(ir, f)
        if line:
            lines.append(_INDENT * 2 + line + ";")
    lines.append(f"{_INDENT}}},")
    return "\n".join(lines)


def _check_field(ir: SchemaIR, f: FieldIR) -> str | None:
    at, where = _at("at", f.offset), f'path, "{f.name}"'
    if f.kind == "struct":
        if not _needs_check(ir, ir.structs[f.elem]):
            return None
        if f.is_array:
            return f"rt.checkStructsStored({f.elem}Layout, dv, {at}, {f.count}, {where})"
        return f"{f.elem}Layout.checkAt(dv, {at}, `${{path}}{f.name}.`)"
    if f.kind == "bool":
        if f.is_array:
            return f"rt.checkBoolBytes(dv, {at}, {f.count}, {where})"
        return f"rt.checkBoolByte(dv, {at}, {where})"
    if f.kind == "enum":
        enum = f'"{_scalar_of(ir, f)}", {f.elem}Values, "{f.elem}"'
        if f.is_array:
            return f"rt.checkEnumsStored(dv, {at}, {enum}, {f.count}, {where})"
        return f"rt.checkEnumStored(dv, {at}, {enum}, {where})"
    if f.kind == "float":
        if f.is_array:
            return f'rt.checkFloatsBits(dv, {at}, "{f.elem}", {f.count}, {where})'
        return f'rt.checkFloatBits(dv, {at}, "{f.elem}", {where})'
    return None


# -- read and view ---------------------------------------------------------------------------------


def _emit_read(ir: SchemaIR, struct: StructIR) -> str:
    lines = [
        f"{_INDENT}readAt(dv: DataView, at: number): {struct.name} {{",
        f"{_INDENT * 2}return {{",
    ]
    for f in struct.fields:
        lines.append(f"{_INDENT * 3}{f.name}: {_read_field(ir, f, 'dv', 'at', view=False)},")
    lines += [f"{_INDENT * 2}}};", f"{_INDENT}}},"]
    return "\n".join(lines)


def _read_field(ir: SchemaIR, f: FieldIR, dv: str, base: str, *, view: bool) -> str:
    at = _at(base, f.offset)
    if f.kind == "struct":
        if f.is_array:
            helper = "rt.viewStructArray" if view else "rt.readStructArray"
            return f"{helper}({f.elem}Layout, {dv}, {at}, {f.count})"
        method = "viewAt" if view else "readAt"
        return f"{f.elem}Layout.{method}({dv}, {at})"
    if f.kind == "bool":
        if f.is_array:
            if view:
                return f"rt.viewBoolBytes({dv}, {at}, {f.count})"
            return f"rt.readBoolArray({dv}, {at}, {f.count})"
        return f"{dv}.getUint8({at}) !== 0"
    scalar = _scalar_of(ir, f)
    if f.is_array:
        helper = "rt.viewArray" if view else "rt.readArray"
        return f'{helper}({dv}, {at}, "{scalar}", {f.count})'
    little = ", true" if SCALARS[scalar] > 1 else ""
    return f"{dv}.get{_DATAVIEW_TYPE[scalar]}({at}{little})"


def _emit_view_class(ir: SchemaIR, struct: StructIR) -> str:
    name = struct.name
    lines = [
        "/**",
        f" * Zero-copy view of a {name} in a buffer: scalars are read on every access; numeric",
        " * arrays are typed arrays over the buffer when aligned (a copy otherwise, see",
        " * rt.viewArray); bool arrays are their raw bytes.",
        " */",
        f"export class {name}View {{",
        f"{_INDENT}readonly #dv: DataView;",
        f"{_INDENT}readonly #at: number;",
        "",
        f"{_INDENT}constructor(dv: DataView, at: number) {{",
        f"{_INDENT * 2}this.#dv = dv;",
        f"{_INDENT * 2}this.#at = at;",
        f"{_INDENT}}}",
    ]
    for f in struct.fields:
        lines += [
            "",
            f"{_INDENT}get {f.name}(): {_view_type(ir, f)} {{",
            f"{_INDENT * 2}return {_read_field(ir, f, 'this.#dv', 'this.#at', view=True)};",
            f"{_INDENT}}}",
        ]
    lines.append("}\n")
    return "\n".join(lines)
