"""transport: zero-copy IPC between RL environment servers and trainers.

``connect(url)`` gives a trainer a ``Client``; ``serve(env, url)`` / ``Server`` host an ``Env``.
Every error the library raises derives from ``TransportError`` and is exported here. The public
surface is pinned by ``tests/test_public_api.py``.
"""

from __future__ import annotations

from pathlib import Path as _Path
from typing import Any as _Any

from transport.api import Server, ServerLimits, connect, serve
from transport.client import Client
from transport.codec import Schema, StructCodec
from transport.collector import EpisodeBatch, EpisodeCollector, request_episodes
from transport.errors import (
    ActionError,
    AdapterError,
    ArrayLengthError,
    BadFrameError,
    BufferSizeError,
    CodecError,
    ConnectError,
    EnvError,
    FingerprintMismatchError,
    InvalidBoolError,
    InvalidEnumError,
    MissingFieldError,
    NonCanonicalError,
    NoProgressError,
    PeerGoneError,
    ProtocolError,
    RegionInUseError,
    RegionMismatchError,
    RemoteError,
    ReplyTooLargeError,
    SchemaError,
    TransportError,
    TransportTimeoutError,
    UnknownFieldError,
    ValueRangeError,
    ValueTypeError,
    VersionMismatchError,
    WorkerDiedError,
)
from transport.multi import BatchError, MultiClient, connect_many
from transport.protocol import AutoReset
from transport.runtime.env import Env, EnvFactory, Spaces, StepOutput
from transport.schema import load_schema as _load_ir
from transport.step_view import StepView

__version__ = "0.1.0"


def load_schema(path: str | _Path) -> Schema:
    """Compile a schema file and return its codecs (``schema["StepResult"].view(buf)``)."""
    return Schema(_load_ir(path))


def serve_gym(env_id_or_factory: _Any, url: str, **kwargs: _Any) -> None:
    """Serve a gymnasium env with the schema derived from its spaces (``transport.gym_serve``;
    gymnasium is imported only here: ``pip install transport[gym]``)."""
    from transport.gym_serve import serve_gym as _serve_gym

    _serve_gym(env_id_or_factory, url, **kwargs)


__all__ = [
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
