"""transport: zero-copy IPC between RL environment servers and trainers.

The public surface is pinned by ``tests/test_public_api.py``.
"""

from __future__ import annotations

from pathlib import Path

from transport.api import Server, connect, serve
from transport.codec import Schema, StructCodec
from transport.errors import (
    ArrayLengthError,
    BufferSizeError,
    CodecError,
    InvalidBoolError,
    InvalidEnumError,
    MissingFieldError,
    NonCanonicalError,
    SchemaError,
    TransportError,
    UnknownFieldError,
    ValueRangeError,
    ValueTypeError,
)
from transport.multi import connect_many
from transport.schema import load_schema as _load_ir

__version__ = "0.1.0"


def load_schema(path: str | Path) -> Schema:
    """Compile a schema file and return its codecs (``schema["StepResult"].view(buf)``)."""
    return Schema(_load_ir(path))


__all__ = [
    "ArrayLengthError",
    "BufferSizeError",
    "CodecError",
    "InvalidBoolError",
    "InvalidEnumError",
    "MissingFieldError",
    "NonCanonicalError",
    "Schema",
    "SchemaError",
    "Server",
    "StructCodec",
    "TransportError",
    "UnknownFieldError",
    "ValueRangeError",
    "ValueTypeError",
    "__version__",
    "connect",
    "connect_many",
    "load_schema",
    "serve",
]
