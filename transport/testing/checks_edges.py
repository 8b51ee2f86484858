"""Contract checks for bad input at the edges (issue 17 items 6 and 7, issue 22 item 6): HELLO
msgpack tails both server languages refuse the same way, the HTTP mapping's edge cases (HEAD,
deep JSON, u64 integers in JSON bodies, pipelining, garbage after a request, bare LF heads,
Content-Length leading zeros) answered with the ERROR contract, and SEND_REQ env ids that are
not integers or not in range refused as BAD_BATCH. Registered with ``_check`` like the checks
of ``transport.testing.checks``."""

from __future__ import annotations

import json
import socket
import time

import msgpack

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


# -- issue 22 item 6: one behaviour for both server languages -------------------------------------

PARITY_ANSWER_WITHIN = 10.0
"""Seconds a bare-LF head's 400 must come within: well under the servers' read timeout (30 s),
so a server that waits for a CRLFCRLF fails."""


def _http_responses(
    server: RunningServer, data: bytes, count: int
) -> list[tuple[int, dict[str, str], bytes]]:
    """``data`` in one write on a new connection: the first ``count`` responses (status,
    lowercased headers, body), fewer when the server closes or PARITY_ANSWER_WITHIN passes."""
    host, _, port = server.url.partition("://")[2].partition("/")[0].rpartition(":")
    out: list[tuple[int, dict[str, str], bytes]] = []
    raw = b""
    deadline = time.monotonic() + PARITY_ANSWER_WITHIN
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock:
        sock.sendall(data)
        while len(out) < count and time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            raw += chunk
            while True:
                head, sep, rest = raw.partition(b"\r\n\r\n")
                if not sep:
                    break
                lines = head.decode("latin-1").split("\r\n")
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0"))
                if len(rest) < length:
                    break
                out.append((int(lines[0].split()[1]), headers, rest[:length]))
                raw = rest[length:]
    return out


def _codes(answers: list[tuple[int, dict[str, str], bytes]]) -> list[tuple[int, str | None]]:
    return [(status, headers.get("x-transport-error")) for status, headers, _ in answers]


@_check(per_schema=False)
def check_http_parity(ctx: CheckContext) -> None:
    """http://: pipelined requests follow the async-state rules in order; a valid request then
    garbage in one write gets its answer then a 400; a bare-LF head is a 400 at once; a
    Content-Length with leading zeros is its value (issue 22 item 6)."""
    server = ctx.server(2)
    if not server.url.startswith("http://"):
        raise NotApplicable("HTTP mapping only")
    schema = ctx.schema
    fingerprint = schema.fingerprint
    step = bytes(schema[schema.ir.messages["SEND_REQ"].body or ""].size)
    batch = (1).to_bytes(4, "little")
    pipelined = b"".join(
        [
            _post(fingerprint, "/v1/reset_seed", (5).to_bytes(8, "little")),
            _post(fingerprint, "/v1/send", step + msgpack.packb([0])),
            _post(fingerprint, "/v1/reset", b""),
            _post(fingerprint, "/v1/recv", batch),
        ]
    )
    answers = _http_responses(server, pipelined, 4)
    state = str(int(ErrorCode.ASYNC_STATE))
    assert _codes(answers) == [(200, None), (200, None), (409, state), (200, None)], (
        f"RESET, SEND, RESET, RECV in one write answered {_codes(answers)}"
    )
    text = answers[2][2][4:].decode("utf-8", "replace")
    assert text.startswith("RESET_REQ while 1 env(s) are in flight: call recv()"), text

    frame = str(int(ErrorCode.BAD_FRAME))
    valid = _post(fingerprint, "/v1/reset_seed", (7).to_bytes(8, "little"))
    answers = _http_responses(server, valid + b"\x00garbage\r\n\r\n", 2)
    assert _codes(answers) == [(200, None), (400, frame)], (
        f"a request then garbage in one write answered {_codes(answers)}"
    )

    for head in (
        b"POST /v1/health HTTP/1.1\nHost: x\n\n",
        b"POST /v1/health HTTP/1.1\r\nHost: x\r\n\n",
        b"POST /v1/health HTTP/1.1\r\nHost: x\nX-A: b\r\n\r\n",
    ):
        answers = _http_responses(server, head, 1)
        assert _codes(answers) == [(400, frame)], (
            f"a bare-LF head {head!r} answered {_codes(answers)} (within {PARITY_ANSWER_WITHIN} s)"
        )

    health = _post(fingerprint, "/v1/health", b"")
    for length, expected in (
        ("0" * 20, (200, None)),
        ("0" * 19 + "1", (400, str(int(ErrorCode.BAD_BODY_SIZE)))),
        (str(2**64 - 1), (413, str(int(ErrorCode.BODY_TOO_LARGE)))),
        (str(2**64), (400, frame)),
    ):
        data = health.replace(b"Content-Length: 0", f"Content-Length: {length}".encode())
        answers = _http_responses(server, data + (b"\x00" if length.endswith("1") else b""), 1)
        assert _codes(answers) == [expected], (
            f"Content-Length: {length} answered {_codes(answers)}, expected {expected}"
        )
    _still_served(ctx, server, "after the HTTP parity cases")


SEND_ID_REFUSALS: list[tuple[object, str]] = [
    (True, "a boolean"),
    (1.0, "a float"),
    ("0", "a string"),
    (2**63, "a u64 of 2**63"),
    (2**64 - 1, "the largest u64"),
    (-1, "a negative id"),
    (-(2**63), "the smallest i64"),
]
"""SEND_REQ env ids both server languages refuse with BAD_BATCH (issue 22 item 6)."""


@_check(per_schema=False)
def check_send_env_ids_refused(ctx: CheckContext) -> None:
    """SEND_REQ env ids that are not msgpack integers (true, 1.0, "0"), integers outside
    0..N-1 at any size (-1, 2**63, 2**64 - 1), and more ids than envs are BAD_BATCH, never
    INTERNAL or accepted; the session keeps serving (issue 22 item 6)."""
    server = ctx.server(2)
    ids = MessageIds.from_schema(ctx.schema.ir)
    step = bytes(ctx.schema[ctx.schema.ir.messages["SEND_REQ"].body or ""].size)
    with ctx.connect(server, autoreset="next_step") as client:
        client.reset(3)
        channel = client.channel
        cases = [(step + msgpack.packb([item]), what) for item, what in SEND_ID_REFUSALS]
        cases.append((step * 3 + msgpack.packb([0, 1, 0]), "3 ids for 2 envs"))
        for body, what in cases:
            msg_type, answer = channel.request(ids.SEND_REQ, body)
            _expect_error_frame(
                ids, msg_type, answer, ErrorCode.BAD_BATCH, f"a SEND_REQ env id of {what}"
            )
        client.send([0], [1])  # nothing was left in flight by the refusals
        assert client.recv(2).env_ids.tolist() == [1]
