"""The schema compiler: declarative TOML -> validated layout IR -> Python and TypeScript code."""

from transport.schema.compiler import compile_schema, load_schema
from transport.schema.ir import (
    EnumIR,
    EnvIR,
    ErrorSpecIR,
    FieldIR,
    MessageIR,
    SchemaIR,
    ShmIR,
    StructIR,
    ir_from_json,
)

__all__ = [
    "EnumIR",
    "EnvIR",
    "ErrorSpecIR",
    "FieldIR",
    "MessageIR",
    "SchemaIR",
    "ShmIR",
    "StructIR",
    "compile_schema",
    "ir_from_json",
    "load_schema",
]
