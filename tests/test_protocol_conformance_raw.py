"""The wire protocol as docs/protocol.md states it, spoken with raw sockets to real Python and
Node servers (``transport-serve ... --lang python|node``): one behaviour, the same codes and the
same words from both (a client written from the docs alone found where they differed).

Covers: a batch body that is not whole records (BAD_BODY_SIZE, not BAD_BATCH); a second HELLO
on a connection (a fresh session: envs reset-required, the new auto-reset mode); HELLO flags
(unknown bits, mode 3, the goodbye bit off zmq); HELLO tail refusals (with a reason); strict
EnvSeed bool bytes; error texts (JSON spelling, no Python reprs); the JSON hello (request and
answer symmetric); a pipelined request followed by garbage (the garbage is quoted).
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterator

import msgpack
import pytest

from transport.envs import env_schema
from transport.protocol import ErrorCode

from .servers import LANGS, ServerProcess, unique_url

FP = env_schema("pac").fingerprint
FP_HEX = f"{FP:016x}"
HEADER = struct.Struct("<BII")
HELLO = struct.Struct("<HHQ")
RESULT_SIZE = 2557
MASK_AT, MASK_N = 2448, 92
IDS = {
    "RESET_REQ": 1,
    "RESET_RESP": 2,
    "STEP_REQ": 3,
    "STEP_RESP": 4,
    "STEP_MULTI_REQ": 5,
    "HEALTH_REQ": 9,
    "HEALTH_RESP": 10,
    "HELLO_REQ": 13,
    "HELLO_RESP": 14,
    "ERROR": 15,
    "STEP_BATCH_REQ": 17,
    "STEP_BATCH_RESP": 18,
    "RESET_SEEDS_REQ": 19,
}
TIMEOUT = 10.0


class Conn:
    """One raw unix-socket connection speaking frames."""

    def __init__(self, url: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(TIMEOUT)
        self.sock.connect(url.removeprefix("unix://"))
        self.msg_id = 0

    def close(self) -> None:
        self.sock.close()

    def _recvn(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise EOFError(f"closed after {len(out)}/{n} bytes")
            out += chunk
        return out

    def request(self, msg_type: int, body: bytes = b"") -> tuple[int, bytes]:
        self.msg_id += 1
        self.sock.sendall(HEADER.pack(msg_type, self.msg_id, len(body)) + body)
        kind, msg_id, length = HEADER.unpack(self._recvn(HEADER.size))
        assert msg_id == self.msg_id
        return kind, self._recvn(length)

    def hello(self, flags: int = 0, tail: bytes | None = None) -> tuple[int, bytes]:
        if tail is None:
            tail = msgpack.packb({"schema_name": "pac_env"})
        return self.request(IDS["HELLO_REQ"], HELLO.pack(0x0100, flags, FP) + tail)

    def closed(self) -> bool:
        self.sock.settimeout(5.0)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True


def error(reply: tuple[int, bytes]) -> tuple[int, str]:
    kind, body = reply
    assert kind == IDS["ERROR"], f"expected an ERROR, got msg_type {kind}"
    code, size = struct.unpack_from("<HH", body)
    assert len(body) == 4 + size
    return code, body[4:].decode()


def valid_actions(results: bytes, count: int) -> bytes:
    """One allowed action per env (the first in each result's action mask), as i32s."""
    actions = []
    for i in range(count):
        mask = results[i * RESULT_SIZE + MASK_AT : i * RESULT_SIZE + MASK_AT + MASK_N]
        actions.append(mask.index(1))
    return struct.pack(f"<{count}i", *actions)


@pytest.fixture(scope="module", params=LANGS)
def lang(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def unix8(lang: str) -> Iterator[ServerProcess]:
    with ServerProcess(unique_url("unix"), env="pac", lang=lang, num_envs=8, seed=1) as proc:
        yield proc


@pytest.fixture(scope="module")
def unix1(lang: str) -> Iterator[ServerProcess]:
    with ServerProcess(unique_url("unix"), env="pac", lang=lang, num_envs=1, seed=1) as proc:
        yield proc


@pytest.fixture(scope="module")
def http1(lang: str) -> Iterator[ServerProcess]:
    with ServerProcess(unique_url("http"), env="pac", lang=lang, num_envs=1, seed=1) as proc:
        yield proc


@pytest.fixture
def conn8(unix8: ServerProcess) -> Iterator[Conn]:
    conn = Conn(unix8.url)
    yield conn
    conn.close()


@pytest.fixture
def conn1(unix1: ServerProcess) -> Iterator[Conn]:
    conn = Conn(unix1.url)
    yield conn
    conn.close()


# -- item 1: a batch body that is not whole records --------------------------------------------


def test_batch_body_not_whole_actions_is_bad_body_size(conn8: Conn) -> None:
    assert conn8.hello()[0] == IDS["HELLO_RESP"]
    assert conn8.request(IDS["RESET_REQ"])[0] == IDS["RESET_RESP"]
    assert error(conn8.request(IDS["STEP_BATCH_REQ"], b"\x00" * 30)) == (
        ErrorCode.BAD_BODY_SIZE,
        "STEP_BATCH_REQ body is 30 bytes, not a whole number of 4-byte actions",
    )
    # whole records, the wrong count: still BAD_BATCH
    assert error(conn8.request(IDS["STEP_BATCH_REQ"], b"\x00" * 28)) == (
        ErrorCode.BAD_BATCH,
        "STEP_BATCH_REQ carries 7 actions (28 bytes); this server has 8 envs",
    )
    assert conn8.request(IDS["HEALTH_REQ"]) == (IDS["HEALTH_RESP"], b"\x01")  # kept


# -- item 2: a second HELLO is a fresh session ------------------------------------------------


def test_second_hello_is_a_fresh_session(conn8: Conn) -> None:
    assert conn8.hello(flags=0)[0] == IDS["HELLO_RESP"]
    kind, results = conn8.request(IDS["RESET_REQ"])
    assert kind == IDS["RESET_RESP"]
    kind, results = conn8.request(IDS["STEP_BATCH_REQ"], valid_actions(results, 8))
    assert kind == IDS["STEP_BATCH_RESP"] and len(results) == 8 * RESULT_SIZE  # no tail
    kind, body = conn8.hello(flags=2)
    assert kind == IDS["HELLO_RESP"] and HELLO.unpack_from(body)[1] == 2
    # the envs are reset-required in the new session: no step of an episode of the old one
    assert error(conn8.request(IDS["STEP_BATCH_REQ"], valid_actions(results, 8))) == (
        ErrorCode.NOT_RESET,
        "env 0: step before the first reset",
    )
    kind, results = conn8.request(IDS["RESET_REQ"])
    assert kind == IDS["RESET_RESP"]
    kind, body = conn8.request(IDS["STEP_BATCH_REQ"], valid_actions(results, 8))
    assert kind == IDS["STEP_BATCH_RESP"]
    assert len(body) >= 8 * RESULT_SIZE + 4  # the same_step tail of the new mode


# -- item 4: HELLO flags ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "text"),
    [
        (3, "HELLO flags 0x0003: no auto-reset mode 3 (0 disabled, 1 next_step, 2 same_step)"),
        (
            4,
            "HELLO flags 0x0004: unknown bits 0x0004 "
            "(only bits 0-1, the auto-reset mode, are defined)",
        ),
        (
            0x4001,
            "HELLO flags 0x4001: unknown bits 0x4000 "
            "(only bits 0-1, the auto-reset mode, are defined)",
        ),
        (
            0x8000,
            "HELLO flags 0x8000: the goodbye bit (0x8000) ends a zmq session only; "
            "close the connection instead",
        ),
    ],
)
def test_hello_flags_refused(conn8: Conn, flags: int, text: str) -> None:
    assert error(conn8.hello(flags=flags)) == (ErrorCode.BAD_FRAME, text)
    assert conn8.closed()


# -- item 3: HELLO tail refusals name a reason, the same words --------------------------------


@pytest.mark.parametrize(
    ("tail", "text"),
    [
        (b"\xc1", "HELLO tail is not one msgpack value: byte 0xc1 at 0"),
        (b"\x81\xa1a\xc1", "HELLO tail is not one msgpack value: byte 0xc1 at 3"),
        (b"\x81\xa1a", "HELLO tail is not one msgpack value: truncated"),
        (b"\x80\x00\x00", "HELLO tail is not one msgpack value: 2 byte(s) after it"),
        (msgpack.packb([1]), "HELLO tail is a msgpack array, expected a map"),
        (msgpack.packb("x"), "HELLO tail is a msgpack str, expected a map"),
        (msgpack.packb(1.5), "HELLO tail is a msgpack float, expected a map"),
        (b"\x81\x07\x01", "HELLO tail has a map key 7: every key must be a string"),
        (b"\x81\xc4\x01a\x01", "HELLO tail has a map key of type bin: every key must be a string"),
        (b"\x82\xa1a\x01\xa1a\x02", 'HELLO tail has the map key "a" twice'),
    ],
)
def test_hello_tail_refusals(conn8: Conn, tail: bytes, text: str) -> None:
    assert error(conn8.hello(tail=tail)) == (ErrorCode.BAD_FRAME, text)


# -- item 5: strict EnvSeed bool bytes ---------------------------------------------------------


def test_reset_seeds_has_seed_byte_is_strict(conn8: Conn) -> None:
    assert conn8.hello()[0] == IDS["HELLO_RESP"]
    entries = [struct.pack("<QB7x", 5, 1)] * 8
    entries[3] = struct.pack("<QB7x", 5, 2)
    assert error(conn8.request(IDS["RESET_SEEDS_REQ"], b"".join(entries))) == (
        ErrorCode.BAD_BODY_SIZE,
        "RESET_SEEDS_REQ entry 3: has_seed byte is 2, expected 0 or 1",
    )
    entries[3] = struct.pack("<QB7x", 5, 0)
    assert conn8.request(IDS["RESET_SEEDS_REQ"], b"".join(entries))[0] == IDS["RESET_RESP"]


# -- item 3: the same words --------------------------------------------------------------------


def test_step_multi_on_one_env_text(conn1: Conn) -> None:
    assert conn1.hello()[0] == IDS["HELLO_RESP"]
    assert error(conn1.request(IDS["STEP_MULTI_REQ"], b"\x00" * 32)) == (
        ErrorCode.BAD_BATCH,
        "STEP_MULTI_REQ needs an 8-env server or one vector env with a batch step; "
        "this one has 1 envs",
    )


# -- HTTP ----------------------------------------------------------------------------------------


def exchange(url: str, data: bytes, responses: int = 1, wait: float = 2.0) -> list[bytes]:
    """Send ``data`` on a new connection; the raw responses (heads + bodies) received."""
    host, _, port = url.partition("://")[2].rpartition(":")
    out = b""
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock:
        sock.sendall(data)
        sock.settimeout(wait)
        try:
            while chunk := sock.recv(65536):
                out += chunk
                if len(split_responses(out)) >= responses:
                    break
        except (TimeoutError, ConnectionResetError):
            pass
    return split_responses(out)


def split_responses(raw: bytes) -> list[bytes]:
    found = []
    while True:
        head, sep, rest = raw.partition(b"\r\n\r\n")
        if not sep:
            return found
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(rest) < length:
            return found
        found.append(head + sep + rest[:length])
        raw = rest[length:]


def parse(response: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers, body


def post(method: str, body: bytes = b"", headers: str = "") -> bytes:
    return (
        f"POST /v1/{method} HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def http_error(response: bytes) -> tuple[int, int, str]:
    status, _, body = parse(response)
    code, size = struct.unpack_from("<HH", body)
    return status, code, body[4 : 4 + size].decode()


def test_http_bad_fingerprint_header_is_json_quoted(http1: ServerProcess) -> None:
    (reply,) = exchange(http1.url, post("health", headers="X-Transport-Fingerprint: 0x7f1b\r\n"))
    assert http_error(reply) == (
        400,
        ErrorCode.BAD_FRAME,
        'X-Transport-Fingerprint "0x7f1b" is not 16 hex digits',
    )


def test_http_json_value_in_json_spelling(http1: ServerProcess) -> None:
    headers = f"X-Transport-Fingerprint: {FP_HEX}\r\nContent-Type: application/json\r\n"
    (reply,) = exchange(http1.url, post("step", b'{"action": true}', headers))
    status, code, text = http_error(reply)
    assert (status, code) == (400, ErrorCode.BAD_BODY_SIZE)
    assert text.endswith("expected an integer, not true"), text


def test_http_json_hello_is_symmetric(http1: ServerProcess) -> None:
    json_headers = "Content-Type: application/json\r\nAccept: application/json\r\n"
    request = {
        "protocol_version": "1.0",
        "flags": 1,
        "fingerprint": FP_HEX,
        "schema_name": "pac_env",
    }
    (reply,) = exchange(http1.url, post("hello", json.dumps(request).encode(), json_headers))
    status, _, body = parse(reply)
    answer = json.loads(body)
    assert status == 200, answer
    assert answer["protocol_version"] == "1.0" and answer["flags"] == 1
    assert answer["fingerprint"] == FP_HEX and answer["info"]["autoreset"] == "next_step"
    # the answer's own fields are a valid request (integers too: 256, the decimal fingerprint)
    again = {k: answer[k] for k in ("protocol_version", "flags", "fingerprint")}
    again["info"] = {"schema_name": "pac_env"}
    (reply,) = exchange(http1.url, post("hello", json.dumps(again).encode(), json_headers))
    assert parse(reply)[0] == 200
    numeric = {"protocol_version": 256, "flags": 0, "fingerprint": FP}
    (reply,) = exchange(http1.url, post("hello", json.dumps(numeric).encode(), json_headers))
    assert json.loads(parse(reply)[2])["flags"] == 0
    # discovery through JSON: the tail key at the top level
    discover = {"fingerprint": 0, "discover": True}
    (reply,) = exchange(http1.url, post("hello", json.dumps(discover).encode(), json_headers))
    status, _, body = parse(reply)
    assert status == 200 and "schema_ir" in json.loads(body)["info"]
    bad = {"fingerprint": FP_HEX, "colour": 1}
    (reply,) = exchange(
        http1.url, post("hello", json.dumps(bad).encode(), "Content-Type: application/json\r\n")
    )
    assert http_error(reply) == (
        400,
        ErrorCode.BAD_BODY_SIZE,
        'JSON body for /v1/hello: unknown key "colour" (a hello takes protocol_version, flags, '
        "fingerprint, info, schema_name, discover)",
    )


def test_http_pipelined_garbage_is_quoted(http1: ServerProcess) -> None:
    data = post("health", headers=f"X-Transport-Fingerprint: {FP_HEX}\r\n") + b"GARBAGE\r\n\r\n"
    first, second = exchange(http1.url, data, responses=2)
    assert parse(first)[0] == 200
    status, code, text = http_error(second)
    assert (status, code) == (400, ErrorCode.BAD_FRAME)
    assert '"GARBAGE' in text and "/v1/health" not in text, text


# -- item 9: the same HTTP bytes from both servers ----------------------------------------------


def test_http_answers_are_the_same_bytes() -> None:
    """Headers and JSON bytes: compact JSON, integral floats as integers, no Date header,
    ``Connection: keep-alive``, from the Python and the Node server alike."""
    fp = f"X-Transport-Fingerprint: {FP_HEX}\r\n"
    requests = [
        post("spaces", headers=fp + "Accept: application/json\r\n"),
        post("reset", headers=fp + "Accept: application/json\r\n"),
        post("step", b"\xff\x00\x00\x00", headers=fp + "Accept: application/json\r\n"),
        post("health", headers=fp),
    ]
    answers = {}
    for lang in LANGS:
        with ServerProcess(unique_url("http"), env="pac", lang=lang, seed=1) as proc:
            answers[lang] = exchange(proc.url, b"".join(requests), responses=len(requests))
    python, node = answers["python"], answers["node"]
    assert len(python) == len(node) == len(requests)
    for mine, theirs in zip(python, node, strict=True):
        assert parse(mine)[1] == parse(theirs)[1]  # the same headers
        assert "date" not in parse(mine)[1] and parse(mine)[1]["connection"] == "keep-alive"
    assert python[0] == node[0] and python[2] == node[2]  # spaces; the refused step
    reset = parse(python[1])[2]
    assert b'"reward":0,' in reset and b", " not in reset
