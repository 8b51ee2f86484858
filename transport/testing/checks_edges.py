"""Contract checks for bad input at the edges (issue 17 items 6 and 7): HELLO msgpack tails both
server languages refuse the same way, and the HTTP mapping's edge cases (HEAD, deep JSON, u64
integers in JSON bodies) answered with the ERROR contract. Registered with ``_check`` like the
checks of ``transport.testing.checks``."""

from __future__ import annotations

import json
import socket

from transport.errors import PeerGoneError
from transport.protocol import HELLO, PROTOCOL_VERSION, ErrorCode, MessageIds
from transport.testing.checks import (
    TIMEOUT,
    CheckContext,
    NotApplicable,
    _check,
    _expect_error_frame,
    _raw_channel,
    _still_served,
)
from transport.testing.servers import RunningServer

BAD_HELLO_TAILS: list[tuple[bytes, str]] = [
    (b"\x81\x01\x01", "an integer map key"),
    (b"\x81\xa1a\xa1\xff", "a string that is not UTF-8"),
    (b"\x81\xa1\xff\x01", "a key that is not UTF-8"),
    (b"\x82\xa1a\x01\xa1a\x02", "a key twice"),
    (b"\x91\x01", "an array, not a map"),
    (b"\x81\xa1a\xd4\x01\x00", "an ext type"),
]
"""HELLO msgpack tails every server refuses with BAD_FRAME (the full table: tests/
test_start_validation.py, docs/decisions.md "The HELLO msgpack tail")."""

JSON_DEPTH = 1000
"""Nesting of the deep JSON body: over the 32 levels both servers parse (and deep enough that
a recursive parser without a limit fails)."""
U64_SEED = 2**53 + 1
"""The smallest integer a float64 cannot hold (JSON.parse would read 2**53)."""


@_check(per_schema=False)
def check_hello_tail_refused(ctx: CheckContext) -> None:
    """A HELLO whose msgpack tail breaks the tail rules (integer key, bad UTF-8, duplicate key,
    not a map, ext) is refused with BAD_FRAME by every server; the server goes on serving."""
    server = ctx.server()
    if server.url.startswith("shm://"):
        raise NotApplicable("shm:// has no HELLO frame: the region's control block is the hello")
    ids = MessageIds.from_schema(ctx.schema.ir)
    head = HELLO.pack(PROTOCOL_VERSION, 0, ctx.schema.fingerprint)
    for tail, what in BAD_HELLO_TAILS:
        channel = _raw_channel(server, ctx.schema)
        try:
            msg_type, body = channel.request(ids.HELLO_REQ, head + tail)
            _expect_error_frame(
                ids, msg_type, body, ErrorCode.BAD_FRAME, f"a HELLO tail with {what}"
            )
        except PeerGoneError:
            pass  # the ERROR was sent and the connection closed: some channels see only the close
        finally:
            channel.close()
    _still_served(ctx, server, "after HELLOs with bad tails")


def _http_exchange(server: RunningServer, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """One raw request on a new connection: status, lowercased headers, everything after the
    head (until the server closes or is quiet for 0.5 s)."""
    host, _, port = server.url.partition("://")[2].partition("/")[0].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock:
        sock.sendall(data)
        raw = b""
        sock.settimeout(0.5)
        try:
            while chunk := sock.recv(65536):
                raw += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    head, sep, rest = raw.partition(b"\r\n\r\n")
    assert sep, f"no response head to {data[:60]!r}: {raw[:120]!r}"
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers, rest


def _post(fingerprint: int, path: str, body: bytes, *, json_body: bool = False) -> bytes:
    kind = "application/json" if json_body else "application/octet-stream"
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nX-Transport-Fingerprint: {fingerprint:016x}\r\n"
        f"Content-Type: {kind}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


@_check(per_schema=False)
def check_http_edge_cases(ctx: CheckContext) -> None:
    """http://: HEAD gets a 405 head without a body; deeply nested JSON is a 400 with the ERROR
    contract; a u64 seed in a JSON body is exact (2**53 + 1 answers as in binary)."""
    server = ctx.server()
    if not server.url.startswith("http://"):
        raise NotApplicable("HTTP mapping only")
    status, headers, rest = _http_exchange(server, b"HEAD /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 405 and headers.get("x-transport-error") == str(ErrorCode.UNKNOWN_MESSAGE)
    assert rest == b"", f"a 405 to HEAD carries {len(rest)} body bytes"

    fingerprint = ctx.schema.fingerprint
    deep = b"[" * JSON_DEPTH + b"]" * JSON_DEPTH
    status, headers, rest = _http_exchange(
        server, _post(fingerprint, "/v1/reset_seed", deep, json_body=True)
    )
    assert status == 400, f"deep JSON answered {status}"
    assert headers.get("x-transport-error") == str(ErrorCode.BAD_BODY_SIZE), headers
    code = int.from_bytes(rest[0:2], "little")
    assert code == ErrorCode.BAD_BODY_SIZE and b"nests deeper than 32" in rest, rest[:120]

    seed_struct = ctx.schema.ir.messages["RESET_SEED_REQ"].body
    if seed_struct is None or [f.name for f in ctx.schema.ir.structs[seed_struct].fields] != [
        "seed"
    ]:
        return  # a schema whose seeded reset is not one u64 seed
    codec = ctx.schema[seed_struct]
    binary = codec.encode({"seed": U64_SEED})
    _, _, expected = _http_exchange(server, _post(fingerprint, "/v1/reset_seed", binary))
    body = json.dumps({"seed": U64_SEED}).encode()
    status, _, got = _http_exchange(
        server, _post(fingerprint, "/v1/reset_seed", body, json_body=True)
    )
    assert status == 200 and got == expected, "a JSON seed of 2**53 + 1 was not read exactly"
    _still_served(ctx, server, "after HTTP edge cases")
