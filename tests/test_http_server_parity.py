"""The two HTTP servers give one behaviour (docs/protocol.md "HTTP mapping"): refusal texts
that name the right bytes, one rule for repeated headers, 100 Continue only when a body is
awaited, a lingering close after a refusal, no user info in URLs, a hint for a JSON body sent as
form data.

Real servers (``transport-serve http://... --lang python|node``) and raw sockets.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from transport.backends.http.wire import JSON_TYPE_HINT, USERINFO_TEXT
from transport.envs import env_schema
from transport.protocol import ErrorCode

from .servers import LANGS, ROOT, ServerProcess, free_port, require_lang, unique_url
from .test_http_edge_cases import Reply, exchange, post, split_responses

FP = f"{env_schema('pac').fingerprint:016x}"
TIMEOUT = 10.0
MAX_BODY = 64 << 20


@pytest.fixture(scope="module", params=LANGS)
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    with ServerProcess(unique_url("http"), env="pac", lang=request.param, seed=1) as proc:
        yield proc


def connect(url: str) -> socket.socket:
    host, _, port = url.partition("://")[2].rpartition(":")
    return socket.create_connection((host, int(port)), timeout=TIMEOUT)


def read_reply(sock: socket.socket, raw: bytes = b"") -> tuple[Reply, bytes]:
    """The next whole response from ``sock`` after ``raw`` (a 100 Continue skipped), and the
    bytes after it."""
    while True:
        head, sep, rest = raw.partition(b"\r\n\r\n")
        if sep and head.startswith(b"HTTP/1.1 100 "):
            raw = rest
            continue
        if sep:
            match = re.search(rb"(?im)^content-length: *([0-9]+)", head)
            length = 0 if match is None else int(match.group(1))
            if len(rest) >= length:
                return Reply(raw[: len(head) + len(sep) + length]), rest[length:]
        chunk = sock.recv(65536)
        assert chunk, f"the server closed after {raw!r}"
        raw += chunk


def text_of(raw: bytes) -> str:
    return Reply(raw).error_body()[1]


# -- item 3: the exact Content-Length in a 413 ----------------------------------------------------


@pytest.mark.parametrize(
    "value", ["9007199254740993", "18446744073709551615", "0009007199254740993"]
)
def test_the_413_names_the_content_length_exactly(server: ServerProcess, value: str) -> None:
    data = post("/v1/step").replace(b"Content-Length: 0", f"Content-Length: {value}".encode())
    reply = Reply(exchange(server.url, data))
    assert reply.status == 413 and reply.error_code == ErrorCode.BODY_TOO_LARGE
    assert reply.error_body()[1] == f"Content-Length {int(value)} exceeds the maximum {MAX_BODY}"


# -- item 4: a parse error after a valid request quotes only its own bytes ------------------------


def test_garbage_after_a_body_quotes_the_garbage_alone(server: ServerProcess) -> None:
    data = post("/v1/step", b"WXYZ") + b"junk here\r\n\r\n"
    first, second = split_responses(exchange(server.url, data, responses=2), data)[:2]
    assert Reply(first).status == 422  # the step is answered (before its reset)
    assert text_of(second) == 'not an HTTP/1.x request line: "junk here"'


@pytest.mark.parametrize("split", ["after the head", "after the body"])
def test_garbage_in_a_later_read_quotes_the_garbage_alone(
    server: ServerProcess, split: str
) -> None:
    """The body (or the garbage) arrives in a later read than the head before it."""
    whole = post("/v1/step", b"WXYZ")
    cut = len(whole) - 4 if split == "after the head" else len(whole)
    with connect(server.url) as sock:
        sock.sendall(whole[:cut])
        if split == "after the body":
            first, rest = read_reply(sock)
        time.sleep(0.2)  # a separate read on the server
        sock.sendall(whole[cut:] + b"junk here\r\n\r\n")
        if split == "after the head":
            first, rest = read_reply(sock)
        second, _ = read_reply(sock, rest)
    assert first.status == 422
    assert second.error_body()[1] == 'not an HTTP/1.x request line: "junk here"'


@pytest.mark.parametrize(
    ("line", "text"),
    [
        (b"Bad Header", 'malformed header line "Bad Header"'),
        (b"Content-Length: -4", 'bad Content-Length "-4"'),
        (b"X-A: b\r\n c", 'malformed header line " c"'),
    ],
)
def test_a_bad_header_line_in_a_later_read_is_quoted_alone(
    server: ServerProcess, line: bytes, text: str
) -> None:
    """The request line came in an earlier read than the header line that fails."""
    with connect(server.url) as sock:
        sock.sendall(b"POST /v1/health HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.2)  # a separate read on the server
        sock.sendall(line + b"\r\n\r\n")
        reply, _ = read_reply(sock)
    assert reply.error_body()[1] == text


# -- item 5: repeated Connection, Accept and Content-Type lines -----------------------------------


@pytest.mark.parametrize(
    ("version", "lines", "closes"),
    [
        ("1.1", ["close", "keep-alive"], True),
        ("1.1", ["keep-alive", "close"], True),
        ("1.1", ["keep-alive", "foo"], False),
        ("1.0", ["close", "keep-alive"], True),
        ("1.0", ["keep-alive", "close"], True),
        ("1.0", ["foo", "keep-alive"], False),
        ("1.0", ["foo"], True),
    ],
)
def test_close_in_any_connection_line_closes(
    server: ServerProcess, version: str, lines: list[str], closes: bool
) -> None:
    headers = "".join(f"Connection: {line}\r\n" for line in lines)
    data = post("/v1/health", headers=headers)
    data = data.replace(b"HTTP/1.1", f"HTTP/{version}".encode(), 1)
    reply = Reply(exchange(server.url, data, responses=2))
    assert reply.status == 200
    assert reply.headers["connection"] == ("close" if closes else "keep-alive")


@pytest.mark.parametrize(
    ("lines", "json"),
    [
        (["application/json", "text/plain"], True),
        (["text/plain", "application/json"], True),
        (["text/plain", "application/octet-stream"], False),
    ],
)
def test_accept_lines_are_one_list(server: ServerProcess, lines: list[str], json: bool) -> None:
    headers = "".join(f"Accept: {a}\r\n" for a in lines)
    reply = Reply(exchange(server.url, post("/v1/health", headers=headers)))
    kind = "application/json" if json else "application/octet-stream"
    assert reply.status == 200 and reply.headers["content-type"] == kind


@pytest.mark.parametrize("first", ["application/json", "application/octet-stream"])
def test_the_first_content_type_line_counts(server: ServerProcess, first: str) -> None:
    other = "application/octet-stream" if first == "application/json" else "application/json"
    headers = f"Content-Type: {first}\r\nContent-Type: {other}\r\n"
    body = b'{"seed":1}' if first == "application/json" else (1).to_bytes(8, "little")
    reply = Reply(exchange(server.url, post("/v1/reset_seed", body, headers=headers)))
    assert reply.status == 200, reply.body


# -- items 6 and 7: parse errors (texts; binary whatever Accept says; header order) --------------


@pytest.mark.parametrize(
    ("head", "text"),
    [
        (b"POST /v1/health HTTP/1.1\r\nContent-Length: -4\r\n", 'bad Content-Length "-4"'),
        (b"POST /v1/health HTTP/1.1\r\nContent-Length: 4, 4\r\n", 'bad Content-Length "4, 4"'),
        (
            b"POST /v1/health HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n",
            'bad Content-Length "99999999999999999999999": larger than 2**64 - 1',
        ),
        (b"POST /v1/health HTTP/1.1\r\nBad Header\r\n", 'malformed header line "Bad Header"'),
        (
            b"POST /v1/health HTTP/1.1\r\nContent-Length : 0\r\n",
            'malformed header line "Content-Length : 0"',
        ),
        (b"POST /v1/health HTTP/1.1\r\nX-A: b\r\n c\r\n", 'malformed header line " c"'),
        (
            b"POST /v1/health HTTP/1.2\r\n",
            'not an HTTP/1.x request line: "POST /v1/health HTTP/1.2"',
        ),
        (
            b"post /v1/health HTTP/1.1\r\n",
            'not an HTTP/1.x request line: "post /v1/health HTTP/1.1"',
        ),
        (
            b"POST /v1/health HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n",
            "Transfer-Encoding is not supported: send Content-Length",
        ),
        (
            b"POST /v1/health HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
            b"Accept: application/json\r\n",
            "Transfer-Encoding is not supported: send Content-Length",
        ),
    ],
)
def test_parse_errors_have_one_text_and_a_binary_body(
    server: ServerProcess, head: bytes, text: str
) -> None:
    raw = exchange(server.url, head + b"\r\n")
    reply = Reply(raw)
    assert (reply.status, reply.error_code) == (400, ErrorCode.BAD_FRAME)
    assert reply.headers["content-type"] == "application/octet-stream"
    assert reply.error_body()[1] == text
    assert raw.startswith(
        b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/octet-stream\r\n"
        b"X-Transport-Error: 1\r\nContent-Length: "
    ), raw


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (post("/v1/health").replace(FP.encode(), b"0" * 16), 409),
        (post("/v1/step").replace(b"Content-Length: 0", b"Content-Length: 99999999"), 413),
        (b"POST /v1/hello HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", 400),
        (post("/v1/health", headers="Transfer-Encoding: chunked\r\n"), 400),
    ],
)
def test_closing_refusals_say_content_length_then_connection(
    server: ServerProcess, data: bytes, status: int
) -> None:
    head = exchange(server.url, data).partition(b"\r\n\r\n")[0].decode("latin-1")
    names = [line.partition(":")[0] for line in head.split("\r\n")[1:]]
    assert head.startswith(f"HTTP/1.1 {status} ")
    assert names == ["Content-Type", "X-Transport-Error", "Content-Length", "Connection"], head
    assert head.endswith("\r\nConnection: close")


# -- item 8: 100 Continue only for HTTP/1.1, only while a body is awaited -------------------------


EXPECT = "Expect: 100-continue\r\n"


@pytest.mark.parametrize(
    "data",
    [
        post("/v1/health", headers=EXPECT),  # no body
        post("/v1/reset_seed", b"\x01" * 8, headers=EXPECT),  # the body came with the head
    ],
    ids=["no body", "body with the head"],
)
def test_no_100_continue_when_no_body_is_awaited(server: ServerProcess, data: bytes) -> None:
    first, second = (
        Reply(r) for r in split_responses(exchange(server.url, data * 2, responses=2), data)[:2]
    )
    assert first.status == 200 and second.status == 200  # no 100, and the connection kept


def test_no_100_continue_to_http_1_0(server: ServerProcess) -> None:
    data = post("/v1/reset_seed", b"\x01" * 8, headers=EXPECT).replace(b"HTTP/1.1", b"HTTP/1.0")
    head, body = data[:-8], data[-8:]
    with connect(server.url) as sock:
        sock.sendall(head)
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(100)  # nothing: a 1.0 client knows no 100 Continue
        sock.settimeout(TIMEOUT)
        sock.sendall(body)
        reply, _ = read_reply(sock)
    assert reply.status == 200


def test_100_continue_while_the_body_is_awaited(server: ServerProcess) -> None:
    data = post("/v1/reset_seed", b"\x01" * 8, headers=EXPECT)
    with connect(server.url) as sock:
        sock.sendall(data[:-8])
        raw = b""
        while b"\r\n\r\n" not in raw:
            chunk = sock.recv(100)
            assert chunk
            raw += chunk
        assert raw.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), raw
        sock.sendall(data[-8:])
        reply, _ = read_reply(sock, raw[len(b"HTTP/1.1 100 Continue\r\n\r\n") :])
    assert reply.status == 200


# -- item 9: a refused connection lingers (FIN, not RST) -------------------------------------------


@pytest.mark.parametrize("refusal", ["head too large", "413"])
def test_a_refusal_is_read_while_the_client_keeps_sending(
    server: ServerProcess, refusal: str
) -> None:
    """The client sends 500 KB after what the server refused: it reads the refusal and a close,
    never a reset."""
    if refusal == "413":
        data = post("/v1/step").replace(b"Content-Length: 0", b"Content-Length: 99999999")
        start = data + b"b" * (100 << 10)  # the body begins in the same write
    else:
        start = b"POST /" + b"a" * (20 << 10)
    with connect(server.url) as sock:
        sock.sendall(start)
        time.sleep(0.2)  # the server refuses what it has
        sock.sendall(b"b" * (500 << 10))
        reply, _ = read_reply(sock)
        while sock.recv(65536):
            pass
    assert reply.status == (413 if refusal == "413" else 400)


# -- item 10: no user info in an http:// URL ------------------------------------------------------


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("userinfo", ["user@", "user:secret@"])
def test_a_url_with_user_info_is_refused(lang: str, userinfo: str) -> None:
    require_lang(lang)
    url = f"http://{userinfo}127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "transport.tools.serve_cli", url, "--env", "echo"]
    done = subprocess.run(
        [*command, "--lang", lang], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "ready" not in done.stdout
    assert USERINFO_TEXT in done.stderr, done.stderr
    assert "secret" not in done.stderr and "***@127.0.0.1" in done.stderr  # no password echoed


# -- item 11: a JSON body sent as form data (curl -d) ---------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "body", "hint"),
    [
        ("application/x-www-form-urlencoded", b'{"action":3}', True),
        (None, b'[{"action":3}]', True),
        ("application/octet-stream", b"\x01\x02", False),
    ],
)
def test_a_json_looking_body_without_its_type_gets_a_hint(
    server: ServerProcess, content_type: str | None, body: bytes, hint: bool
) -> None:
    headers = "" if content_type is None else f"Content-Type: {content_type}\r\n"
    reply = Reply(exchange(server.url, post("/v1/step", body, headers=headers)))
    assert (reply.status, reply.error_code) == (400, ErrorCode.BAD_BODY_SIZE)
    text = reply.error_body()[1]
    assert text.startswith(f"STEP_REQ body is {len(body)} bytes, expected 4"), text
    assert text.endswith(f"; {JSON_TYPE_HINT}") == hint, text
