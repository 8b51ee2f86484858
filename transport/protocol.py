"""The protocol layer shared by every backend: frame header, HELLO handshake, ERROR messages.

The wire format is specified in docs/protocol.md (seed 000 Appendix A plus HELLO and ERROR).
Backends move frames; this module says what the bytes mean. The message ids come from the
schema's ``[messages]`` table, looked up by name, so any schema that declares these messages
can ride the same client and server.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import msgpack

from transport.errors import (
    BadFrameError,
    EnvError,
    FingerprintMismatchError,
    ProtocolError,
    RemoteError,
    VersionMismatchError,
)
from transport.schema.ir import SchemaIR

PROTOCOL_VERSION = 0x0100
"""major << 8 | minor; peers with different majors refuse each other."""

HEADER = struct.Struct("<BII")
HEADER_SIZE = HEADER.size  # 9
BODY_OFFSET = 16
"""Receive buffers hold the header at 7..15 so that bodies start 16-byte aligned (zero-copy
float32 views need aligned data; torch.from_numpy refuses misaligned arrays)."""
HEADER_OFFSET = BODY_OFFSET - HEADER_SIZE
DEFAULT_MAX_BODY = 64 << 20

HELLO = struct.Struct("<HHQ")
ERROR_HEAD = struct.Struct("<HH")
MAX_ERROR_TEXT = 0xFFFF


class AutoReset(IntEnum):
    """Who resets an env whose episode ended: HELLO_REQ flags bits 0-1, echoed by HELLO_RESP.

    DISABLED: the client sends a reset (a step on a done env is NOT_RESET).
    NEXT_STEP: the next step of a done env ignores its action and resets it (gymnasium 1.x).
    SAME_STEP: the step that ends an episode resets the env at once; the response carries the
    reset result in place and the final result in a tail (SB3 VecEnv).
    """

    DISABLED = 0
    NEXT_STEP = 1
    SAME_STEP = 2


AUTORESET_MASK = 0x3
FINAL_COUNT = struct.Struct("<I")
"""SAME_STEP tail after the N results: u32 k, then k x (u32 env index, result struct)."""


class ErrorCode(IntEnum):
    """ERROR message codes (docs/protocol.md)."""

    BAD_FRAME = 1
    UNKNOWN_MESSAGE = 2
    BAD_BODY_SIZE = 3
    BODY_TOO_LARGE = 4
    HELLO_REQUIRED = 5
    VERSION_MISMATCH = 6
    FINGERPRINT_MISMATCH = 7
    INVALID_ACTION = 8
    MASKED_ACTION = 9
    ENV_ERROR = 10
    BAD_BATCH = 11
    NOT_RESET = 12
    INTERNAL = 13


CLOSING_ERRORS = frozenset(
    {
        ErrorCode.BAD_FRAME,
        ErrorCode.UNKNOWN_MESSAGE,
        ErrorCode.BODY_TOO_LARGE,
        ErrorCode.VERSION_MISMATCH,
        ErrorCode.FINGERPRINT_MISMATCH,
    }
)
"""After these the server closes the connection: the stream or the peer cannot be trusted."""


@dataclass(frozen=True)
class MessageIds:
    """The message ids this protocol uses, read from a schema's [messages] by name."""

    RESET_REQ: int
    RESET_RESP: int
    STEP_REQ: int
    STEP_RESP: int
    STEP_MULTI_REQ: int
    STEP_MULTI_RESP: int
    HEALTH_REQ: int
    HEALTH_RESP: int
    SPACES_REQ: int
    SPACES_RESP: int
    HELLO_REQ: int
    HELLO_RESP: int
    ERROR: int
    RESET_SEED_REQ: int
    STEP_BATCH_REQ: int
    STEP_BATCH_RESP: int

    @classmethod
    def from_schema(cls, schema: SchemaIR) -> MessageIds:
        names = cls.__dataclass_fields__
        missing = [name for name in names if name not in schema.messages]
        if missing:
            raise ProtocolError(
                f"schema {schema.name} lacks the protocol messages {', '.join(missing)}"
            )
        return cls(**{name: schema.messages[name].id for name in names})


@dataclass(frozen=True)
class Hello:
    """A decoded HELLO_REQ / HELLO_RESP: version, flags, fingerprint and the server's info."""

    version: int
    flags: int
    fingerprint: int
    info: dict[str, Any]


def pack_header(buffer: Any, offset: int, msg_type: int, msg_id: int, body_len: int) -> None:
    HEADER.pack_into(buffer, offset, msg_type, msg_id, body_len)


def parse_header(buffer: Any, offset: int, max_body: int) -> tuple[int, int, int]:
    """(msg_type, msg_id, body_len); a body_len over ``max_body`` is refused before any read."""
    msg_type, msg_id, body_len = HEADER.unpack_from(buffer, offset)
    if body_len > max_body:
        raise BadFrameError(f"body_len {body_len} exceeds the maximum {max_body}")
    return msg_type, msg_id, body_len


def encode_hello(fingerprint: int, info: dict[str, Any] | None = None, flags: int = 0) -> bytes:
    body = HELLO.pack(PROTOCOL_VERSION, flags, fingerprint)
    return body + msgpack.packb(info) if info is not None else body


def decode_hello(body: Any) -> Hello:
    data = bytes(body)
    if len(data) < HELLO.size:
        raise BadFrameError(f"HELLO body is {len(data)} bytes, expected at least {HELLO.size}")
    version, flags, fingerprint = HELLO.unpack_from(data, 0)
    info: dict[str, Any] = {}
    if len(data) > HELLO.size:
        try:
            decoded = msgpack.unpackb(data[HELLO.size :])
        except (ValueError, msgpack.UnpackException) as exc:
            raise BadFrameError(f"HELLO tail is not msgpack: {exc}") from exc
        if isinstance(decoded, dict):
            info = decoded
    return Hello(version, flags, fingerprint, info)


def check_hello(hello: Hello, fingerprint: int, *, peer: str) -> None:
    """Refuse a peer whose major version or schema fingerprint differs (both sides call it)."""
    if hello.version >> 8 != PROTOCOL_VERSION >> 8:
        raise VersionMismatchError(
            f"protocol version mismatch: {peer} speaks {hello.version >> 8}.{hello.version & 255},"
            f" this side {PROTOCOL_VERSION >> 8}.{PROTOCOL_VERSION & 255}"
        )
    if hello.fingerprint != fingerprint:
        raise FingerprintMismatchError(
            f"schema fingerprint mismatch: {peer} has {hello.fingerprint:016x}, "
            f"this side has {fingerprint:016x}",
            local=fingerprint,
            remote=hello.fingerprint,
        )


def encode_error(code: int, text: str) -> bytes:
    raw = text.encode("utf-8")[:MAX_ERROR_TEXT]
    raw = raw.decode("utf-8", "ignore").encode("utf-8")  # never cut a character in half
    return ERROR_HEAD.pack(code, len(raw)) + raw


def decode_error(body: Any) -> RemoteError | ProtocolError:
    """The typed error an ERROR body stands for (mismatches keep their own types)."""
    data = bytes(body)
    if len(data) < ERROR_HEAD.size:
        return BadFrameError(f"ERROR body is {len(data)} bytes, shorter than its head")
    code, text_len = ERROR_HEAD.unpack_from(data, 0)
    if len(data) != ERROR_HEAD.size + text_len:
        return BadFrameError(f"ERROR body is {len(data)} bytes, its head says {4 + text_len}")
    text = data[ERROR_HEAD.size :].decode("utf-8", "replace")
    if code == ErrorCode.FINGERPRINT_MISMATCH:
        return FingerprintMismatchError(f"server refused the session: {text}")
    if code == ErrorCode.VERSION_MISMATCH:
        return VersionMismatchError(f"server refused the session: {text}")
    try:
        name = ErrorCode(code).name
    except ValueError:
        name = "UNKNOWN"
    if code == ErrorCode.ENV_ERROR:
        match = _ENV_PREFIX.match(text)
        return EnvError(code, name, text, int(match.group(1)) if match else None)
    return RemoteError(code, name, text)


_ENV_PREFIX = re.compile(r"env (\d+):")
"""ENV_ERROR texts start with ``env {i}:``, naming the env that raised."""


class RequestError(Exception):
    """Raised inside a server's dispatcher: becomes one ERROR response (never leaves the server)."""

    def __init__(self, code: ErrorCode, text: str) -> None:
        self.code = code
        self.text = text
        super().__init__(f"{code.name}: {text}")
