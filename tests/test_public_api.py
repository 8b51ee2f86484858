"""The public surface is explicit and pinned: changing it is a deliberate act."""

from __future__ import annotations

import inspect
import types

import transport
import transport.errors

PINNED = [
    "ActionError",
    "AdapterError",
    "ArrayLengthError",
    "AutoReset",
    "BadFrameError",
    "BatchError",
    "BufferSizeError",
    "Client",
    "CodecError",
    "ConnectError",
    "Env",
    "EnvError",
    "EnvFactory",
    "EpisodeBatch",
    "EpisodeCollector",
    "FingerprintMismatchError",
    "InvalidBoolError",
    "InvalidEnumError",
    "MissingFieldError",
    "MultiClient",
    "NoProgressError",
    "NonCanonicalError",
    "PeerGoneError",
    "ProtocolError",
    "RegionInUseError",
    "RegionMismatchError",
    "RemoteError",
    "ReplyTooLargeError",
    "Schema",
    "SchemaError",
    "Server",
    "ServerLimits",
    "Spaces",
    "StepOutput",
    "StepView",
    "StructCodec",
    "TransportError",
    "TransportTimeoutError",
    "UnknownFieldError",
    "ValueRangeError",
    "ValueTypeError",
    "VersionMismatchError",
    "WorkerDiedError",
    "__version__",
    "connect",
    "connect_many",
    "load_schema",
    "request_episodes",
    "serve",
    "serve_gym",
]


def test_all_is_the_pinned_list() -> None:
    assert sorted(transport.__all__) == sorted(PINNED)
    assert len(set(transport.__all__)) == len(transport.__all__)


def test_every_exported_name_is_importable() -> None:
    namespace: dict[str, object] = {}
    exec("from transport import *", namespace)
    for name in transport.__all__:
        assert hasattr(transport, name), name
        assert name == "__version__" or name in namespace, name


def test_nothing_public_is_left_out_and_nothing_private_is_exported() -> None:
    public = {
        name
        for name, value in vars(transport).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)  # subpackages: transport.gym, ...
        and name != "annotations"  # from __future__ import annotations
    }
    assert public == set(transport.__all__) - {"__version__"}
    assert not [
        name for name in transport.__all__ if name.startswith("_") and name != "__version__"
    ]


def test_the_whole_error_tree_is_exported() -> None:
    errors = {
        name
        for name, value in vars(transport.errors).items()
        if inspect.isclass(value) and issubclass(value, Exception)
    }
    assert errors <= set(transport.__all__)


def test_every_error_is_a_transport_error() -> None:
    for name in transport.__all__:
        obj = getattr(transport, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, transport.TransportError), name


def test_the_library_imports_no_tool_dependency() -> None:
    """matplotlib and hypothesis are the tools' extra (transport[tools]); ray is its own."""
    import subprocess
    import sys

    code = (
        "import sys, transport, transport.client, transport.runtime, transport.backends.unix\n"
        "print(sorted(m for m in ('matplotlib', 'hypothesis', 'ray') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
