"""The protocol layer shared by every backend: frame header, HELLO handshake, ERROR messages.

The wire format is specified in docs/protocol.md (seed 000 Appendix A plus HELLO and ERROR) and
declared once in ``schema/protocol.toml``, the protocol envelope: every constant here (error
codes, which close the connection, HTTP statuses and routes, auto-reset modes, message ids, the
header, HELLO and ERROR head layouts) comes from its generated module
``transport.generated.protocol``. Backends move frames; this module says what the bytes mean.
The message ids are read from a schema's ``[messages]`` by name (every env schema has the
envelope's), so any such schema can ride the same client and server.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgpack
import numpy as np

from transport.codec import Schema, StructCodec
from transport.errors import (
    BadFrameError,
    EnvError,
    FingerprintMismatchError,
    NoProgressError,
    ProtocolError,
    RemoteError,
    VersionMismatchError,
)
from transport.generated import protocol as envelope
from transport.generated.protocol import AutoReset as AutoReset
from transport.generated.protocol import ErrorCode as ErrorCode
from transport.generated.protocol import RegionState as RegionState
from transport.generated.protocol import SlotCommand as SlotCommand
from transport.schema.ir import SchemaIR, ir_from_json

PROTOCOL_VERSION = 0x0100
"""major << 8 | minor; peers with different majors refuse each other."""

_STRUCT_CHARS = {
    "u8": "B",
    "u16": "H",
    "u32": "I",
    "u64": "Q",
    "i8": "b",
    "i16": "h",
    "i32": "i",
    "i64": "q",
}


def packed_struct(codec: StructCodec) -> struct.Struct:
    """A ``struct.Struct`` for a packed envelope struct of scalar integers, from its IR (the
    fast path for headers; the offsets are checked, never assumed)."""
    fmt, end = "<", 0
    for f in codec.ir.fields:
        if f.offset != end or f.is_array or f.elem not in _STRUCT_CHARS:
            raise TypeError(f"{codec.name}.{f.name} is not a packed integer field at byte {end}")
        fmt += _STRUCT_CHARS[f.elem]
        end += f.size
    if end != codec.size:
        raise TypeError(f"{codec.name} has {codec.size - end} bytes of trailing padding")
    return struct.Struct(fmt)


HEADER = packed_struct(envelope.FrameHeader)  # "<BII"
HEADER_SIZE = HEADER.size  # 9
BODY_OFFSET = 16
"""Receive buffers hold the header at 7..15 so that bodies start 16-byte aligned (zero-copy
float32 views need aligned data; torch.from_numpy refuses misaligned arrays)."""
HEADER_OFFSET = BODY_OFFSET - HEADER_SIZE
DEFAULT_MAX_BODY = 64 << 20
"""The largest body a peer accepts unless told otherwise (``max_body=``): a limit on memory."""

HELLO = packed_struct(envelope.Hello)  # "<HHQ"
ERROR_HEAD = packed_struct(envelope.ErrorHead)  # "<HH"
MAX_ERROR_TEXT = 0xFFFF

# AutoReset (imported above): who resets an env whose episode ended: HELLO_REQ flags bits 0-1,
# echoed by HELLO_RESP. DISABLED: the client sends a reset (a step on a done env is NOT_RESET).
# NEXT_STEP: the next step of a done env ignores its action and resets it (gymnasium 1.x).
# SAME_STEP: the step that ends an episode resets the env at once; the response carries the
# reset result in place and the final result in a tail (SB3 VecEnv).
# ErrorCode (imported above): the ERROR message codes (docs/protocol.md).
# SlotCommand, RegionState (imported above): a shm slot's command word and a region's state word
# (docs/shm.md).

AUTORESET_MASK = 0x3
FINAL_COUNT = struct.Struct("<I")
"""SAME_STEP tail after the N results: u32 k, then k x (u32 env index, result struct)."""


def carries_finals(mode: AutoReset) -> bool:
    """Whether responses under ``mode`` carry final results (a shm region needs final areas)."""
    return mode == AutoReset.SAME_STEP


PER_ENV_RESPONSES: Final[frozenset[str]] = frozenset(
    {"RESET_RESP", "STEP_BATCH_RESP", "OBSERVE_RESP"}
)
"""Responses of one result per env (then OBSERVE_RESP's infos, STEP_BATCH_RESP's final tail)."""
FINAL_TAIL_RESPONSES: Final[frozenset[str]] = frozenset(
    {"STEP_RESP", "STEP_MULTI_RESP", "STEP_BATCH_RESP"}
)
"""Responses whose results a final tail may follow (``read_final_tail``; ``carries_finals``)."""


def read_final_tail(body: Any, results_len: int, size: int, most: int) -> list[tuple[int, int]]:
    """A SAME_STEP step response's final tail after ``results_len`` bytes of results: each
    final result as (env index, its byte offset in ``body``); at most ``most`` of them."""
    length = len(body) if isinstance(body, (bytes, bytearray)) else memoryview(body).nbytes
    if length < results_len + FINAL_COUNT.size:
        raise ProtocolError(f"step response of {length} bytes lacks its final tail")
    (k,) = FINAL_COUNT.unpack_from(body, results_len)
    if k > most or length != results_len + FINAL_COUNT.size + k * (FINAL_COUNT.size + size):
        raise ProtocolError(f"final tail says {k} results; body is {length} bytes")
    finals = []
    for j in range(k):
        start = results_len + FINAL_COUNT.size + j * (FINAL_COUNT.size + size)
        finals.append((FINAL_COUNT.unpack_from(body, start)[0], start + FINAL_COUNT.size))
    return finals


@dataclass(frozen=True)
class RecvTail:
    """A RECV_RESP cut at its tail: ``count`` results, then msgpack ``[env ids, ended env ids,
    their final results' bytes]`` (docs/protocol.md, "Session", RECV_RESP)."""

    count: int
    env_ids: list[int]
    ended: list[int]
    finals: bytes

    def final_rows(self, size: int) -> list[tuple[int, bytes]]:
        """Each ended env's (index, final result bytes)."""
        return [(int(i), self.finals[k * size : (k + 1) * size]) for k, i in enumerate(self.ended)]


def split_recv_tail(body: Any, size: int, most: int) -> RecvTail:
    """Where a RECV_RESP's tail starts: the one count <= ``most`` whose msgpack parses to exactly
    the rest of the body with that many env ids (results are fixed size; the tail is not)."""
    view = memoryview(body).cast("B")
    for count in range(most + 1):
        at = count * size
        if at >= view.nbytes:
            break
        if view[at] != 0x93:  # a fixarray of 3
            continue
        try:
            ids, ended, finals = msgpack.unpackb(view[at:], strict_map_key=False)
            if len(ids) == count and len(finals) == len(ended) * size:
                return RecvTail(count, [int(i) for i in ids], [int(i) for i in ended], finals)
        except Exception:
            continue  # not the tail: the bytes of a result
    raise ProtocolError(f"RECV_RESP of {view.nbytes} bytes has no [env ids, ended, finals] tail")


CLOSING_ERRORS: Final[frozenset[int]] = envelope.CLOSING_ERRORS
"""After these the server closes the connection: the stream or the peer cannot be trusted."""

HTTP_STATUS: Final[dict[int, int]] = envelope.HTTP_STATUS
"""The HTTP status of each ERROR code (a 405 for a non-POST request carries UNKNOWN_MESSAGE)."""

HTTP_ROUTES: Final[dict[str, str]] = envelope.HTTP_ROUTES
"""``POST /v1/<method>`` -> the name of the request message it carries."""


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
    RESET_SEEDS_REQ: int
    OBSERVE_REQ: int
    OBSERVE_RESP: int
    SEND_REQ: int
    SEND_RESP: int
    RECV_REQ: int
    RECV_RESP: int
    ASYNC_RESET_REQ: int

    @classmethod
    def from_schema(cls, schema: SchemaIR) -> MessageIds:
        names = cls.__dataclass_fields__
        missing = [name for name in names if name not in schema.messages]
        if missing:
            raise ProtocolError(
                f"schema {schema.name} lacks the protocol messages {', '.join(missing)}"
            )
        return cls(**{name: schema.messages[name].id for name in names})


MESSAGE_IDS: Final = MessageIds.from_schema(envelope.SCHEMA.ir)
"""The envelope's message ids: the same in every env schema."""


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


GOODBYE_FLAG: Final = 0x8000
"""HELLO_REQ flags bit 15: the client is leaving. A zmq server (which is not told when a peer
goes) ends that client's session and closes its envs, and answers nothing; the other backends
end a session when its connection ends (docs/protocol.md "Goodbye")."""


def encode_goodbye() -> bytes:
    """The HELLO_REQ body a zmq client sends as it closes (its fingerprint is not checked)."""
    return HELLO.pack(PROTOCOL_VERSION, GOODBYE_FLAG, 0)


def is_goodbye(body: Any) -> bool:
    """Whether a HELLO_REQ body says goodbye (``GOODBYE_FLAG``)."""
    return len(body) >= HELLO.size and bool(HELLO.unpack_from(body, 0)[1] & GOODBYE_FLAG)


def encode_hello(fingerprint: int, info: dict[str, Any] | None = None, flags: int = 0) -> bytes:
    body = HELLO.pack(PROTOCOL_VERSION, flags, fingerprint)
    return body + msgpack.packb(info) if info is not None else body


HELLO_TAIL_MAX_DEPTH = 32
"""The deepest nesting of maps and arrays a HELLO tail may have (the tail map itself is 1)."""


def msgpack_kind(value: Any) -> str:
    """A decoded msgpack value's family as a HELLO refusal names it (Node: ``msgpackKind``, from
    the value's first byte): nil, bool, int, float, str, bin, array, map or ext."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "bool"
    for kind, name in ((int, "int"), (float, "float"), (str, "str"), (bytes, "bin")):
        if isinstance(value, kind):
            return name
    if isinstance(value, (list, tuple)):
        return "array"
    return "map" if isinstance(value, dict) else "ext"


# the size of a msgpack head after its first byte, and how its length is read: ("fixed", n):
# n more bytes; ("len", k): a k-byte big-endian length of that many bytes follows; ("ext", k):
# the same plus the type byte; ("items", k): k-byte count of values (arrays; maps: x2)
_FIXED = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
_FIXED.update({0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8, 0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17})
_SIZED = {0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0), 0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1)}
_SIZED.update({0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0)})
_ITEMS = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}


def msgpack_failure(data: bytes) -> str:
    """Why ``data`` is not one msgpack value, in the words Node's HELLO tail reader uses:
    ``truncated``, ``byte 0xc1 at 0`` (a byte no value starts with) or ``2 byte(s) after it``."""
    at, pending, end = 0, 1, len(data)
    while pending:
        if at >= end:
            return "truncated"
        b = data[at]
        at += 1
        pending -= 1
        if b <= 0x7F or b >= 0xE0 or b in _FIXED:
            at += _FIXED.get(b, 0)
        elif 0x80 <= b <= 0x9F:
            pending += (b & 0x0F) * (2 if b < 0x90 else 1)
        elif 0xA0 <= b <= 0xBF:
            at += b & 0x1F
        elif b in _SIZED:
            width, extra = _SIZED[b]
            if at + width > end:
                return "truncated"
            at += width + extra + int.from_bytes(data[at : at + width], "big")
        elif b in _ITEMS:
            width, per = _ITEMS[b]
            if at + width > end:
                return "truncated"
            pending += per * int.from_bytes(data[at : at + width], "big")
            at += width
        else:
            return f"byte 0x{b:x} at {at - 1}"
    if at > end:
        return "truncated"
    return f"{end - at} byte(s) after it"


def _tail_map(pairs: list[tuple[Any, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if not isinstance(key, str):
            kind = msgpack_kind(key)
            shown = str(key) if kind == "int" else f"of type {kind}"
            raise BadFrameError(f"HELLO tail has a map key {shown}: every key must be a string")
        if key in out:
            raise BadFrameError(
                f"HELLO tail has the map key {json.dumps(key, ensure_ascii=False)} twice"
            )
        out[key] = value
    return out


def _check_tail_values(info: dict[str, Any]) -> None:
    """Depth and types of a decoded tail: nil, bool, int, float, str, bin, array, map only."""
    stack: list[tuple[Any, int]] = [(info, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > HELLO_TAIL_MAX_DEPTH:
                raise BadFrameError(
                    f"HELLO tail nests deeper than {HELLO_TAIL_MAX_DEPTH} maps and arrays"
                )
            items = value.values() if isinstance(value, dict) else value
            stack.extend((item, depth + 1) for item in items)
        elif not (value is None or isinstance(value, (bool, int, float, str, bytes))):
            raise BadFrameError("HELLO tail holds an ext type (msgpack ext types are refused)")


def decode_hello(body: Any) -> Hello:
    """A HELLO body: the fixed head, then an optional msgpack tail (the peer's info).

    The tail rules (the Node side applies the same; docs/decisions.md): absent, or
    exactly one msgpack map and nothing after it, whose keys (at every depth) are strings, each
    key once per map; every string valid UTF-8; values nil, bool, int, float, str, bin, array or
    map (no ext types); at most HELLO_TAIL_MAX_DEPTH levels of maps and arrays. Anything else is
    a ``BadFrameError``.
    """
    data = bytes(body)
    if len(data) < HELLO.size:
        raise BadFrameError(f"HELLO body is {len(data)} bytes, expected at least {HELLO.size}")
    version, flags, fingerprint = HELLO.unpack_from(data, 0)
    info: dict[str, Any] = {}
    if len(data) > HELLO.size:
        try:
            decoded = msgpack.unpackb(
                data[HELLO.size :],
                raw=False,
                strict_map_key=False,  # _tail_map names a bad key itself
                object_pairs_hook=_tail_map,
                use_list=True,
            )
        except BadFrameError:
            raise
        except UnicodeDecodeError as exc:
            raise BadFrameError(f"HELLO tail has a string that is not UTF-8: {exc}") from exc
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            reason = msgpack_failure(data[HELLO.size :])
            raise BadFrameError(f"HELLO tail is not one msgpack value: {reason}") from exc
        if not isinstance(decoded, dict):
            raise BadFrameError(f"HELLO tail is a msgpack {msgpack_kind(decoded)}, expected a map")
        _check_tail_values(decoded)
        info = decoded
    return Hello(version, flags, fingerprint, info)


# -- schema discovery (docs/client.md "Connecting without a schema file") ----------------------
# HELLO_REQ tail keys: "schema_name" (the schema the client was built for: names it in a
# mismatch) or "discover": true with fingerprint 0 (the client has no schema). HELLO_RESP tail
# keys: "schema_name" (the server's) and, answering a discovery, "schema_ir": the server's
# compiled IR as the JSON text `transport-schema inspect --json` prints.
SCHEMA_NAME_KEY = "schema_name"
DISCOVER_KEY = "discover"
SCHEMA_IR_KEY = "schema_ir"
DISCOVER_FINGERPRINT = 0
"""The fingerprint a discovering HELLO_REQ carries (with ``discover: true`` in its tail)."""


def is_discovery(hello: Hello) -> bool:
    """A HELLO_REQ from a client without a schema: fingerprint 0 and ``discover: true``."""
    return hello.fingerprint == DISCOVER_FINGERPRINT and hello.info.get(DISCOVER_KEY) is True


def encode_hello_request(schema: Schema | None, autoreset: int = 0) -> bytes:
    """A client's HELLO_REQ: pinned to ``schema`` (its fingerprint and name), or, for None, a
    discovery request that asks the server for its schema."""
    if schema is None:
        return encode_hello(DISCOVER_FINGERPRINT, {DISCOVER_KEY: True}, flags=autoreset)
    return encode_hello(schema.fingerprint, {SCHEMA_NAME_KEY: schema.name}, flags=autoreset)


def encode_hello_response(schema: Schema, hello: Hello, info: dict[str, Any], mode: int) -> bytes:
    """A server's HELLO_RESP to ``hello``: its fingerprint, ``info`` plus its schema's name, and
    its compiled IR when the client asked to discover it."""
    tail = {**info, SCHEMA_NAME_KEY: schema.name}
    if is_discovery(hello):
        tail[SCHEMA_IR_KEY] = schema_ir_text(schema)
    return encode_hello(schema.fingerprint, tail, flags=mode)


_IR_TEXT: dict[tuple[int, str, int], str] = {}


def schema_ir_text(schema: Schema) -> str:
    """The compiled IR of ``schema`` as compact JSON text, cached per fingerprint, name and
    version (the fingerprint leaves the name and version out: two schemas that differ only there,
    such as two gymnasium envs with the same spaces, each announce their own)."""
    ir = schema.ir
    key = (schema.fingerprint, ir.name, ir.version)
    text = _IR_TEXT.get(key)
    if text is None:
        text = _IR_TEXT[key] = json.dumps(ir.to_json(), separators=(",", ":"))
    return text


def schema_from_ir_text(text: Any, announced: int, *, peer: str) -> Schema:
    """The ``Schema`` of a discovered IR, refused unless it hashes to ``announced`` (the
    fingerprint the peer announced in its HELLO head or control block)."""
    if not isinstance(text, str):
        raise ProtocolError(f"{peer} sent no schema IR ({SCHEMA_IR_KEY} is not a string)")
    try:
        ir = ir_from_json(json.loads(text))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ProtocolError(f"{peer} sent a schema IR that does not load: {exc}") from exc
    if ir.fingerprint != announced:
        raise FingerprintMismatchError(
            f"{peer} announced fingerprint {announced:016x} but its schema {ir.name} hashes to "
            f"{ir.fingerprint:016x}",
            local=ir.fingerprint,
            remote=announced,
        )
    try:
        return Schema(ir)
    except (ValueError, KeyError, TypeError) as exc:  # codecs NumPy cannot lay out
        raise ProtocolError(f"{peer} sent a schema IR that does not load: {exc}") from exc


def mismatch_text(server_name: str, server_fp: int, client_name: str, client_fp: int) -> str:
    """A fingerprint mismatch naming both schemas (name and fingerprint of each side)."""
    return (
        f"the server serves {server_name or 'an unnamed schema'} (fp {server_fp:016x}), "
        f"this client was built for {client_name or 'an unnamed schema'} (fp {client_fp:016x})"
    )


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
    """The typed error an ERROR body stands for (``error_from_code`` of its code and text)."""
    data = bytes(body)
    if len(data) < ERROR_HEAD.size:
        return BadFrameError(f"ERROR body is {len(data)} bytes, shorter than its head")
    code, text_len = ERROR_HEAD.unpack_from(data, 0)
    if len(data) != ERROR_HEAD.size + text_len:
        return BadFrameError(
            f"ERROR body is {len(data)} bytes, its head says {ERROR_HEAD.size + text_len}"
        )
    return error_from_code(code, data[ERROR_HEAD.size :].decode("utf-8", "replace"))


def error_from_code(code: int, text: str) -> RemoteError | ProtocolError:
    """The typed error of a protocol error code and its text: the one mapping every client uses
    (a stream ERROR body, an HTTP refusal, a shm slot's status and error text). Mismatches keep
    their own types; ENV_ERROR names the env (``env {i}:``)."""
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
        env_id = int(match.group(1)) if match else None
        stalled = _NO_PROGRESS.search(text)
        if stalled is not None:  # the runtime's watchdog (decision-boundary runs)
            requests = (int(stalled.group(1)), int(stalled.group(2)))
            state = json.loads(stalled.group(3))
            return NoProgressError(code, name, text, env_id, requests, state)
        return EnvError(code, name, text, env_id)
    return RemoteError(code, name, text)


_ENV_PREFIX = re.compile(r"env (\d+):")
_NO_PROGRESS = re.compile(
    r"NoProgressError: no progress: .*?\(requests (\d+)\.\.(\d+) since reset\); "
    r"last state: (\{[^{}]*\})"
)
"""ENV_ERROR texts start with ``env {i}:``, naming the env that raised."""


class RequestError(Exception):
    """Raised inside a server's dispatcher: becomes one ERROR response (never leaves the server)."""

    def __init__(self, code: ErrorCode, text: str, env_ids: tuple[int, ...] = ()) -> None:
        self.code = code
        self.text = text
        self.env_ids = env_ids  # ENV_ERROR: the envs that failed (the others did their step)
        super().__init__(f"{code.name}: {text}")


def accept_hello(body: Any, schema: Schema | int) -> tuple[Hello, AutoReset]:
    """A server's reading of a HELLO_REQ: the hello and the auto-reset mode it asks for, or the
    ``RequestError`` to answer (BAD_FRAME, VERSION_MISMATCH, FINGERPRINT_MISMATCH). Every
    server, and the shm channel that answers for its region, decides the same way. A discovery
    request (``is_discovery``) passes the fingerprint check: the answer carries the schema.
    A mismatch names both schemas when ``schema`` is a ``Schema`` and the client sent its name."""
    fingerprint = schema if isinstance(schema, int) else schema.fingerprint
    try:
        hello = decode_hello(body)
        if is_discovery(hello):
            check_hello(hello, DISCOVER_FINGERPRINT, peer="client")
        else:
            check_hello(hello, fingerprint, peer="client")
    except FingerprintMismatchError as exc:
        text = str(exc)
        if isinstance(schema, Schema):
            client_name = hello.info.get(SCHEMA_NAME_KEY)
            text = mismatch_text(
                schema.name,
                fingerprint,
                client_name if isinstance(client_name, str) else "",
                hello.fingerprint,
            )
        raise RequestError(ErrorCode.FINGERPRINT_MISMATCH, text) from None
    except VersionMismatchError as exc:
        raise RequestError(ErrorCode.VERSION_MISMATCH, str(exc)) from None
    except ProtocolError as exc:
        raise RequestError(ErrorCode.BAD_FRAME, str(exc)) from None
    return hello, hello_mode(hello.flags)


def hello_mode(flags: int) -> AutoReset:
    """The auto-reset mode of a HELLO_REQ's ``flags``, or the BAD_FRAME to answer: only bits 0-1
    (the mode: 0, 1 or 2) are defined; the goodbye bit is zmq's alone (its server reads it
    before a HELLO gets here); any other bit is refused (Node: ``helloMode``, the same words)."""
    head = f"HELLO flags 0x{flags:04X}: "
    if flags & GOODBYE_FLAG:
        raise RequestError(
            ErrorCode.BAD_FRAME,
            head + "the goodbye bit (0x8000) ends a zmq session only; close the connection instead",
        )
    unknown = flags & ~AUTORESET_MASK
    if unknown:
        raise RequestError(
            ErrorCode.BAD_FRAME,
            head
            + f"unknown bits 0x{unknown:04X} (only bits 0-1, the auto-reset mode, are defined)",
        )
    try:
        return AutoReset(flags & AUTORESET_MASK)
    except ValueError:
        raise RequestError(
            ErrorCode.BAD_FRAME,
            head + f"no auto-reset mode {flags & AUTORESET_MASK} "
            "(0 disabled, 1 next_step, 2 same_step)",
        ) from None


SEED_LIMIT: Final = 1 << 64
"""Seeds are u64 on the wire (ResetRequest, EnvSeed)."""


def _seed_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def reset_seed(
    seed: Any, num_envs: int, method: str = "reset", per_env: bool = True
) -> int | list[int | None] | None:
    """What a reset's ``seed`` says, checked before any bytes move: None (unseeded), one int
    (env i gets ``seed + i``) or, where ``per_env``, a sequence of one int or None per env.
    Anything else is a ``TypeError`` naming it (a str was read as a list of digits, a float
    truncated), a seed out of the u64 range or a list of the wrong length a ``ValueError``."""
    if seed is None:
        return None
    if _seed_int(seed):
        return _in_range(int(seed), method)
    takes = "an int, or a list of one int or None per env" if per_env else "one int"
    if (
        not per_env
        or isinstance(seed, str | bytes | float | np.floating)
        or not (isinstance(seed, Sequence) or (isinstance(seed, np.ndarray) and seed.ndim == 1))
    ):
        raise TypeError(
            f"{method}(seed={seed!r}): a seed is {takes} (env i gets seed + i), "
            f"not {type(seed).__name__}"
        )
    seeds = list(seed)
    if len(seeds) != num_envs:
        raise ValueError(
            f"{method}(seed=[...]) needs one seed (an int or None) per env: {num_envs}, "
            f"got {len(seeds)}"
        )
    for i, entry in enumerate(seeds):
        if entry is not None and not _seed_int(entry):
            raise TypeError(
                f"{method}(seed=[...]): env {i}'s seed is {entry!r}, not an int or None"
            )
    return [None if entry is None else _in_range(int(entry), method) for entry in seeds]


def _in_range(seed: int, method: str) -> int:
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"{method}(seed={seed}): a seed must be an integer in 0..2**64-1")
    return seed


def body_codec(schema: Schema, message: str) -> StructCodec:
    """The codec of ``message``'s body struct; a clear error when the schema does not speak the
    env protocol (no ``[env]`` table: no messages) or the message has no body."""
    found = schema.ir.messages.get(message)
    if found is None:
        raise ProtocolError(
            f"schema {schema.name} has no message {message}: a schema served or connected to "
            "needs an [env] table naming its result and request structs (docs/schema.md)"
        )
    if found.body is None:
        raise ProtocolError(f"message {message} of schema {schema.name} has no body struct")
    return schema[found.body]


# -- the JSON hello (HTTP, docs/protocol.md "JSON hello") --------------------------------------
JSON_HELLO_KEYS: Final = (
    "protocol_version",
    "flags",
    "fingerprint",
    "info",
    SCHEMA_NAME_KEY,
    DISCOVER_KEY,
)
"""The keys of a JSON hello request: the answer's (``protocol_version``, ``flags``,
``fingerprint``, ``info``: the msgpack tail) and the tail's two request keys at the top level."""


def _json_whole(value: Any, what: str, top: int) -> int:
    """A JSON number that is a whole number in 0..top (an integral float too: Node cannot tell
    ``1.0`` from ``1``); ValueError otherwise (Node: the same words)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise ValueError(f"{what} must be a whole number in 0..{top}")
    return value


def hello_from_json(value: Any) -> bytes:
    """The HELLO_REQ body a JSON hello request stands for: the shape the JSON HELLO_RESP has
    (``protocol_version`` as ``"1.0"`` or ``major << 8 | minor``; ``fingerprint`` as 16 hex
    digits or an integer; ``flags``; ``info``: the tail map), plus ``schema_name`` and
    ``discover`` accepted at the top level (Node: ``helloFromJson``, the same words)."""
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object of Hello fields")
    for key in value:
        if key not in JSON_HELLO_KEYS:
            raise ValueError(
                f"unknown key {json.dumps(key, ensure_ascii=False)} (a hello takes "
                + ", ".join(JSON_HELLO_KEYS)
                + ")"
            )
    version: Any = value.get("protocol_version", PROTOCOL_VERSION)
    if isinstance(version, str):
        match = re.fullmatch(r"([0-9]{1,3})\.([0-9]{1,3})", version)
        if match is None or int(match.group(1)) > 255 or int(match.group(2)) > 255:
            raise ValueError('protocol_version must be "major.minor" (such as "1.0") or a number')
        version = int(match.group(1)) << 8 | int(match.group(2))
    version = _json_whole(version, "protocol_version", 0xFFFF)
    flags = _json_whole(value.get("flags", 0), "flags", 0xFFFF)
    if "fingerprint" not in value:
        raise ValueError("no fingerprint given (16 hex digits, or 0 with discover: true)")
    fingerprint: Any = value["fingerprint"]
    if isinstance(fingerprint, str):
        if re.fullmatch(r"[0-9a-fA-F]{16}", fingerprint) is None:
            raise ValueError("fingerprint must be 16 hex digits or a number")
        fingerprint = int(fingerprint, 16)
    fingerprint = _json_whole(fingerprint, "fingerprint", (1 << 64) - 1)
    info = value.get("info", {})
    if not isinstance(info, dict):
        raise ValueError("info must be a JSON object (the HELLO tail)")
    info = dict(info)
    for key in (SCHEMA_NAME_KEY, DISCOVER_KEY):
        if key in value:
            info[key] = value[key]
    tail = msgpack.packb(info) if info else b""
    return HELLO.pack(version, flags, fingerprint) + tail
