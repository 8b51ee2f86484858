"""Issue 22 item 6 (and item 8's last sentence): the Python and the Node HTTP servers answer the
same raw requests the same way (docs/protocol.md "HTTP mapping"):

- pipelined requests (several in one write) go through the async-state rules in order, as
  separate ones do (Node answered a RESET sent behind a SEND's body before the SEND);
- a valid request followed by garbage in the same write gets its answer, then the garbage its
  400 (Node dropped the answer when the request had a body);
- a head with a bare LF line ending is a 400 BAD_FRAME at once (Python waited for a CRLFCRLF
  until its read timeout);
- a Content-Length with any number of leading zeros is its value (Python refused more than 19
  digits); above 2**64 - 1 it is a 400, above --max-body a 413;
- SEND_REQ env ids that are not msgpack integers (true, 1.0, "a") and integers outside
  0..N-1 (negative, >= 2**63) are BAD_BATCH with the same text (Python: INTERNAL for >= 2**63);
- an async misuse names the request message and what to call instead.

Real servers (``transport-serve http://... --lang python|node``) and raw sockets.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator

import msgpack
import pytest

from transport.backends.http.wire import BARE_LF_TEXT
from transport.envs import env_schema
from transport.protocol import ErrorCode, RequestError
from transport.runtime.async_batches import check_idle, request_name

from .servers import LANGS, ServerProcess, unique_url

SCHEMA = env_schema("pac")
FP = f"{SCHEMA.fingerprint:016x}"
STEP = bytes(SCHEMA[SCHEMA.ir.messages["SEND_REQ"].body or ""].size)
"""One STEP request (action 0) of a SEND_REQ body."""
N = 2
ANSWER_WITHIN = 10.0
"""Seconds a refusal must come within: well under the servers' 30 s read timeout."""
RESPONSE = re.compile(rb"HTTP/1\.1 ([0-9]{3})[^\r\n]*\r\n((?:[^\r\n]+\r\n)*)\r\n")


@pytest.fixture(scope="module", params=LANGS)
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    with ServerProcess(unique_url("http"), env="pac", lang=request.param, num_envs=N) as proc:
        yield proc


def post(path: str, body: bytes = b"", *, length: str | None = None) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nX-Transport-Fingerprint: {FP}\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\n\r\n"
    )
    return head.encode() + body


def send_body(ids: list[object], requests: int | None = None) -> bytes:
    tail: bytes = msgpack.packb(ids)
    return STEP * (len(ids) if requests is None else requests) + tail


class Answer:
    """One response: status, its X-Transport-Error / X-Transport-Msg-Type, the body."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def code(self) -> int | None:
        """The ERROR code (X-Transport-Error), or None for a 200."""
        value = self.headers.get("x-transport-error")
        return None if value is None else int(value)

    @property
    def text(self) -> str:
        """The ERROR body's text (u16 code, u16 length, UTF-8)."""
        assert self.code is not None, f"not an ERROR: {self.status} {self.body[:60]!r}"
        assert int.from_bytes(self.body[:2], "little") == self.code, self.body[:60]
        return self.body[4:].decode("utf-8")

    def __repr__(self) -> str:
        return f"Answer({self.status}, {self.code}, {self.body[:80]!r})"


def parse(raw: bytes) -> list[Answer]:
    """Every whole response in ``raw``, in order."""
    out = []
    while (match := RESPONSE.match(raw)) is not None:
        headers = {}
        for line in match.group(2).decode("latin-1").split("\r\n"):
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        end = match.end() + int(headers.get("content-length", "0"))
        if len(raw) < end:
            break
        out.append(Answer(int(match.group(1)), headers, raw[match.end() : end]))
        raw = raw[end:]
    return out


def exchange(url: str, data: bytes, responses: int) -> tuple[list[Answer], float]:
    """Send ``data`` in one write on a new connection; the responses received until there are
    ``responses`` of them, the server closes, or ANSWER_WITHIN seconds passed; and how long
    it took."""
    host, _, port = url.partition("://")[2].rpartition(":")
    start = time.monotonic()
    raw = b""
    with socket.create_connection((host, int(port)), timeout=ANSWER_WITHIN) as sock:
        sock.sendall(data)
        try:
            while len(parse(raw)) < responses and (chunk := sock.recv(65536)):
                raw += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return parse(raw), time.monotonic() - start


def statuses(answers: list[Answer]) -> list[tuple[int, int | None]]:
    return [(a.status, a.code) for a in answers]


# -- pipelining ------------------------------------------------------------------------------------

SEND_RESP = SCHEMA.ir.messages["SEND_RESP"].id
RECV_REQUEST = (1).to_bytes(4, "little")
RESULT_SIZE = SCHEMA[SCHEMA.ir.messages["RECV_RESP"].body or ""].size
ASYNC_RESET = bytes(SCHEMA[SCHEMA.ir.messages["ASYNC_RESET_REQ"].body or ""].size)


def test_pipelined_requests_follow_the_async_state_rules(server: ServerProcess) -> None:
    """RESET, SEND env 0, RESET, RECV in one write: the second RESET is ASYNC_STATE (env 0 is in
    flight), and the RECV returns env 0's step, the bytes of the same requests sent apart."""
    requests = [
        post("/v1/reset_seed", (5).to_bytes(8, "little")),
        post("/v1/send", send_body([0])),
        post("/v1/reset"),
        post("/v1/recv", RECV_REQUEST),
    ]
    answers, _ = exchange(server.url, b"".join(requests), 4)
    assert statuses(answers) == [
        (200, None),
        (200, None),
        (409, ErrorCode.ASYNC_STATE),
        (200, None),
    ]
    assert answers[1].headers["x-transport-msg-type"] == str(SEND_RESP)
    assert "RESET_REQ while 1 env(s) are in flight" in answers[2].text
    apart = []
    host, _, port = server.url.partition("://")[2].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=ANSWER_WITHIN) as sock:
        for request in requests:
            sock.sendall(request)
            raw = b""
            while not parse(raw):
                raw += sock.recv(65536)
            apart.extend(parse(raw))
    assert statuses(apart) == statuses(answers)
    assert answers[3].body == apart[3].body


def test_a_pipelined_send_then_step_is_refused(server: ServerProcess) -> None:
    answers, _ = exchange(
        server.url,
        post("/v1/reset") + post("/v1/send", send_body([1])) + post("/v1/step_batch", STEP * N),
        3,
    )
    assert statuses(answers) == [(200, None), (200, None), (409, ErrorCode.ASYNC_STATE)]


# -- a valid request, then garbage in the same write -----------------------------------------------


@pytest.mark.parametrize(
    "request_bytes",
    [post("/v1/health"), post("/v1/reset_seed", (7).to_bytes(8, "little"))],
    ids=["no-body", "with-body"],
)
def test_a_valid_request_then_garbage_gets_its_answer_then_a_400(
    server: ServerProcess, request_bytes: bytes
) -> None:
    answers, _ = exchange(server.url, request_bytes + b"\x00garbage\r\n\r\n", 2)
    assert statuses(answers) == [(200, None), (400, ErrorCode.BAD_FRAME)]
    assert answers[1].headers.get("connection") == "close"


# -- bare LF line endings --------------------------------------------------------------------------

FPB = FP.encode()
BARE_LF_HEADS = [
    b"POST /v1/health HTTP/1.1\nHost: x\nX-Transport-Fingerprint: " + FPB + b"\n\n",
    b"POST /v1/health HTTP/1.1\nX-Transport-Fingerprint: " + FPB + b"\r\n\r\n",
    b"POST /v1/health HTTP/1.1\r\nHost: x\nX-Transport-Fingerprint: " + FPB + b"\r\n\r\n",
    b"POST /v1/health HTTP/1.1\r\nX-Transport-Fingerprint: " + FPB + b"\r\n\n",
    b"POST /v1/health HTTP/1.1\r\nX-Transport-Fingerprint: " + FPB + b"\n\r\n",
    b"POST /v1/health HTTP/1.1\r\nX-Transport-Fingerprint: " + FPB + b"\r\nX-A: b\n\r\n",
    b"POST /v1/health HTTP/1.1\n",  # the request line alone: no need to wait for more
]


@pytest.mark.parametrize("data", BARE_LF_HEADS, ids=range(len(BARE_LF_HEADS)))
def test_a_bare_lf_head_is_a_400_at_once(server: ServerProcess, data: bytes) -> None:
    """As Node's parser (llhttp) answers: a LF without its CR ends no line (RFC 9112 2.2)."""
    answers, took = exchange(server.url, data, 1)
    assert statuses(answers) == [(400, ErrorCode.BAD_FRAME)], f"{took:.1f} s: {answers}"
    assert answers[0].headers.get("connection") == "close"
    assert answers[0].text == BARE_LF_TEXT


def test_blank_lf_lines_before_the_request_line_are_still_ignored(server: ServerProcess) -> None:
    answers, _ = exchange(server.url, b"\n\r\n" + post("/v1/health"), 1)
    assert statuses(answers) == [(200, None)] and answers[0].body == b"\x01"


# -- Content-Length --------------------------------------------------------------------------------

SEED = (9).to_bytes(8, "little")


@pytest.mark.parametrize(
    ("length", "body", "path", "expected"),
    [
        ("0" * 20, b"", "/v1/health", (200, None)),
        ("0" * 40, b"", "/v1/health", (200, None)),
        ("0" * 19 + "8", SEED, "/v1/reset_seed", (200, None)),
        ("10000000000000000000", b"", "/v1/health", (413, ErrorCode.BODY_TOO_LARGE)),
        (str(2**64 - 1), b"", "/v1/health", (413, ErrorCode.BODY_TOO_LARGE)),
        ("000" + str(2**64 - 1), b"", "/v1/health", (413, ErrorCode.BODY_TOO_LARGE)),
        (str(2**64), b"", "/v1/health", (400, ErrorCode.BAD_FRAME)),
        ("9" * 30, b"", "/v1/health", (400, ErrorCode.BAD_FRAME)),
    ],
    ids=[
        "20-zeros",
        "40-zeros",
        "zeros-then-8",
        "1e19",
        "u64-max",
        "zeros-u64-max",
        "2^64",
        "30-nines",
    ],
)
def test_content_length_with_leading_zeros_is_its_value(
    server: ServerProcess, length: str, body: bytes, path: str, expected: tuple[int, int | None]
) -> None:
    answers, _ = exchange(server.url, post(path, body, length=length), 1)
    assert statuses(answers) == [expected], answers
    if length == "0" * 19 + "8":
        reference, _ = exchange(server.url, post(path, body), 1)
        assert answers[0].body == reference[0].body


# -- SEND_REQ env ids ------------------------------------------------------------------------------

NOT_INTEGERS = "SEND_REQ env ids must be integers"
NOT_K = (
    "SEND_REQ of {size} bytes is not K requests of {step} bytes and a msgpack array of K env "
    "ids (1 <= K <= num_envs)"
)
SEND_ID_CASES: list[tuple[str, bytes, str]] = [
    ("true", send_body([True]), NOT_INTEGERS),
    ("false", send_body([False]), NOT_INTEGERS),
    ("float", send_body([1.0]), NOT_INTEGERS),
    ("float32", STEP + b"\x91\xca\x00\x00\x00\x00", NOT_INTEGERS),
    ("string", send_body(["a"]), NOT_INTEGERS),
    ("nil", send_body([None]), NOT_INTEGERS),
    ("not-utf8-string", STEP + b"\x91\xa1\xff", NOT_INTEGERS),
    ("map", STEP + b"\x91\x81\x01\x02", NOT_INTEGERS),
    ("int-then-bool", send_body([0, True]), NOT_INTEGERS),
    ("2^63", send_body([2**63]), f"env id {2**63} is outside 0..{N - 1}"),
    ("u64-max", send_body([2**64 - 1]), f"env id {2**64 - 1} is outside 0..{N - 1}"),
    ("2^53+1", send_body([2**53 + 1]), f"env id {2**53 + 1} is outside 0..{N - 1}"),
    ("negative", send_body([-1]), f"env id -1 is outside 0..{N - 1}"),
    ("i64-min", send_body([-(2**63)]), f"env id {-(2**63)} is outside 0..{N - 1}"),
    ("u8-encoded-2", STEP + b"\x91\xcc\x02", f"env id 2 is outside 0..{N - 1}"),
    ("too-many", send_body([0, 1, 0]), NOT_K.format(size=3 * len(STEP) + 4, step=len(STEP))),
    ("k-mismatch", send_body([0, 1], requests=1), NOT_K.format(size=len(STEP) + 3, step=len(STEP))),
]


@pytest.mark.parametrize(("what", "body", "text"), SEND_ID_CASES, ids=[c[0] for c in SEND_ID_CASES])
def test_send_env_ids_are_refused_as_bad_batch(
    server: ServerProcess, what: str, body: bytes, text: str
) -> None:
    """Never INTERNAL, never accepted: the same 422 BAD_BATCH and text from both servers."""
    answers, _ = exchange(server.url, post("/v1/reset") + post("/v1/send", body), 2)
    assert statuses(answers) == [(200, None), (422, ErrorCode.BAD_BATCH)], (what, answers)
    assert answers[1].text == text


def test_integer_ids_of_any_encoding_are_accepted(server: ServerProcess) -> None:
    """A u8 / u64 / i8 encoding of an in-range id is that id (msgpack's width is the encoder's)."""
    for tail in (b"\x91\xcc\x01", b"\x91\xcf" + (1).to_bytes(8, "big"), b"\x91\xd0\x01"):
        data = post("/v1/reset") + post("/v1/send", STEP + tail) + post("/v1/recv", RECV_REQUEST)
        answers, _ = exchange(server.url, data, 3)
        assert statuses(answers) == [(200, None)] * 3, (tail, answers)
        ids, _, _ = msgpack.unpackb(answers[2].body[RESULT_SIZE:])
        assert ids == [1], tail


# -- async misuse texts (item 8) -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "name"),
    [
        ("/v1/reset", b"", "RESET_REQ"),
        ("/v1/step_batch", STEP * N, "STEP_BATCH_REQ"),
        ("/v1/observe", b"", "OBSERVE_REQ"),
        ("/v1/async_reset", ASYNC_RESET, "ASYNC_RESET_REQ"),
    ],
)
def test_async_misuse_names_the_request_and_what_to_call(
    server: ServerProcess, path: str, body: bytes, name: str
) -> None:
    data = post("/v1/reset") + post("/v1/send", send_body([0, 1])) + post(path, body)
    answers, _ = exchange(server.url, data, 3)
    assert statuses(answers)[2] == (409, ErrorCode.ASYNC_STATE), answers
    expected = f"{name} while 2 env(s) are in flight: call recv() for their results first"
    assert answers[2].text == expected


def test_check_idle_names_messages_not_hex_ids() -> None:
    for request in (0x11, "STEP_BATCH_REQ"):
        with pytest.raises(RequestError) as caught:
            check_idle(3, request)
        assert caught.value.code == ErrorCode.ASYNC_STATE
        assert caught.value.text == (
            "STEP_BATCH_REQ while 3 env(s) are in flight: call recv() for their results first"
        )
    check_idle(0, 0x11)
    assert request_name(0x77) == "msg_type 0x77"
    assert request_name("ASYNC_RESET_REQ") == "ASYNC_RESET_REQ"
