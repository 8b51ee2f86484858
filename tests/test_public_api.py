"""The public surface is explicit and pinned: changing it is a deliberate act."""

from __future__ import annotations

import transport


def test_public_names() -> None:
    assert sorted(transport.__all__) == sorted(
        [
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
    )
    for name in transport.__all__:
        assert hasattr(transport, name)


def test_every_error_is_a_transport_error() -> None:
    for name in transport.__all__:
        obj = getattr(transport, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, transport.TransportError)
