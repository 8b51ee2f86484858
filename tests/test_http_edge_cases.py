"""Issue 17 item 6: HTTP edge cases get one behaviour from both servers, the documented one
(docs/protocol.md "HTTP mapping"): every refusal carries the ERROR contract, HEAD gets no body,
deep JSON is a 400, u64 integers in JSON bodies are exact.

Real servers (``transport-serve http://... --lang python|node``) and raw sockets.
"""

from __future__ import annotations

import json
import random
import re
import socket
from collections.abc import Iterator

import pytest

from transport.backends.http.wire import JSON_MAX_DEPTH
from transport.envs import env_schema
from transport.protocol import ErrorCode

from .servers import LANGS, ServerProcess, unique_url

FP = f"{env_schema('pac').fingerprint:016x}"
TIMEOUT = 10.0
U64_SEED = 2**53 + 1
"""The smallest integer a float64 (JSON.parse) cannot hold: it reads as 2**53."""


@pytest.fixture(scope="module", params=LANGS)
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    with ServerProcess(unique_url("http"), env="pac", lang=request.param, seed=1) as proc:
        yield proc


class Reply:
    """One raw HTTP response: status, lowercased headers, body bytes (and what followed)."""

    def __init__(self, raw: bytes, *, head_request: bool = False) -> None:
        head, sep, rest = raw.partition(b"\r\n\r\n")
        assert sep, f"no complete response head in {raw[:200]!r}"
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        length = 0 if head_request else int(self.headers.get("content-length", "0"))
        self.body = rest[:length]
        self.extra = rest[length:]

    @property
    def error_code(self) -> int | None:
        value = self.headers.get("x-transport-error")
        return None if value is None else int(value)

    def error_body(self) -> tuple[int, str]:
        """The ERROR body's code and text (the contract: u16 code, u16 len, UTF-8 text)."""
        code = int.from_bytes(self.body[0:2], "little")
        size = int.from_bytes(self.body[2:4], "little")
        assert len(self.body) == 4 + size, f"ERROR body of {len(self.body)} bytes says {size}"
        return code, self.body[4:].decode("utf-8")


def _complete(raw: bytes, responses: int, head_request: bool) -> bool:
    """Whether ``raw`` holds ``responses`` whole responses (the first to a HEAD, if so)."""
    for k in range(responses):
        head, sep, rest = raw.partition(b"\r\n\r\n")
        if not sep:
            return False
        match = re.search(rb"(?im)^content-length: *([0-9]+)", head)
        length = 0 if (head_request and k == 0) or match is None else int(match.group(1))
        if len(rest) < length:
            return False
        raw = rest[length:]
    return True


def exchange(url: str, data: bytes, *, wait: float = 1.0, responses: int = 1) -> bytes:
    """Send ``data`` on a new connection; what is received until ``responses`` whole responses
    arrived, the server closes, or it is silent for ``wait`` seconds."""
    host, _, port = url.partition("://")[2].rpartition(":")
    head_request = data.lstrip(b"\r\n").startswith(b"HEAD ")
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock:
        sock.sendall(data)
        sock.settimeout(wait)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
                if _complete(out, responses, head_request):
                    break
        except (TimeoutError, ConnectionResetError):
            pass
    return out


def post(path: str, body: bytes = b"", *, headers: str = "", host: bool = True) -> bytes:
    lines = f"POST {path} HTTP/1.1\r\n"
    if host:
        lines += "Host: x\r\n"
    lines += f"X-Transport-Fingerprint: {FP}\r\n{headers}Content-Length: {len(body)}\r\n\r\n"
    return lines.encode() + body


def test_head_gets_a_405_head_without_a_body(server: ServerProcess) -> None:
    # responses=2: wait until the server is silent, so that a body after the head is seen
    raw = exchange(server.url, b"HEAD /v1/health HTTP/1.1\r\nHost: x\r\n\r\n", responses=2)
    reply = Reply(raw, head_request=True)
    assert reply.status == 405 and reply.error_code == ErrorCode.UNKNOWN_MESSAGE
    assert reply.headers["allow"] == "POST"
    assert reply.extra == b"", f"a HEAD answer carries {len(reply.extra)} body bytes"
    # the connection stays usable: a HEAD then a POST on one connection
    both = b"HEAD /v1/health HTTP/1.1\r\nHost: x\r\n\r\n" + post("/v1/health")
    raw = exchange(server.url, both, responses=2)
    second = Reply(Reply(raw, head_request=True).extra)
    assert second.status == 200 and second.body == b"\x01"


@pytest.mark.parametrize("shape", ["array", "object"])
def test_deeply_nested_json_is_a_400_with_the_error_contract(
    server: ServerProcess, shape: str
) -> None:
    depth = 100_000
    text = (
        ("[" * depth + "]" * depth) if shape == "array" else ('{"a":' * depth + "1" + "}" * depth)
    )
    headers = "Content-Type: application/json\r\n"
    raw = exchange(server.url, post("/v1/reset_seed", text.encode(), headers=headers))
    reply = Reply(raw)
    assert reply.status == 400 and reply.error_code == ErrorCode.BAD_BODY_SIZE
    code, message = reply.error_body()
    assert code == ErrorCode.BAD_BODY_SIZE
    assert f"nests deeper than {JSON_MAX_DEPTH} arrays and objects" in message


def test_json_at_the_depth_limit_is_parsed(server: ServerProcess) -> None:
    """32 levels parse (and are then refused for what they hold, not for their depth)."""
    text = "[" * JSON_MAX_DEPTH + "]" * JSON_MAX_DEPTH
    headers = "Content-Type: application/json\r\n"
    reply = Reply(exchange(server.url, post("/v1/reset_seed", text.encode(), headers=headers)))
    assert reply.status == 400 and "nests deeper" not in reply.error_body()[1]


def test_a_missing_host_is_served(server: ServerProcess) -> None:
    reply = Reply(exchange(server.url, post("/v1/health", host=False)))
    assert (reply.status, reply.body) == (200, b"\x01")


def test_an_unknown_expectation_is_ignored(server: ServerProcess) -> None:
    reply = Reply(exchange(server.url, post("/v1/health", headers="Expect: something-else\r\n")))
    assert (reply.status, reply.body) == (200, b"\x01")


@pytest.mark.parametrize("value", ["0", "1"])
def test_duplicate_content_length_is_refused_as_such(server: ServerProcess, value: str) -> None:
    data = post("/v1/health", headers=f"Content-Length: {value}\r\n")
    reply = Reply(exchange(server.url, data))
    assert reply.status == 400 and reply.error_code == ErrorCode.BAD_FRAME
    code, message = reply.error_body()
    assert code == ErrorCode.BAD_FRAME and message == "duplicate Content-Length headers"
    assert reply.headers.get("connection") == "close"


def test_u64_seed_in_a_json_body_is_exact(server: ServerProcess) -> None:
    """A JSON reset_seed with 2**53 + 1 answers the same bytes as a binary one, not 2**53's."""
    binary = U64_SEED.to_bytes(8, "little")
    expected = Reply(exchange(server.url, post("/v1/reset_seed", binary))).body
    rounded = Reply(exchange(server.url, post("/v1/reset_seed", (2**53).to_bytes(8, "little"))))
    assert expected != rounded.body, "the env cannot tell the two seeds apart"
    body = json.dumps({"seed": U64_SEED}).encode()
    headers = "Content-Type: application/json\r\n"
    reply = Reply(exchange(server.url, post("/v1/reset_seed", body, headers=headers)))
    assert reply.status == 200 and reply.body == expected


def test_u64_fingerprint_in_a_json_hello_is_accepted(server: ServerProcess) -> None:
    body = json.dumps({"protocol_version": 256, "flags": 0, "fingerprint": int(FP, 16)})
    data = (
        "POST /v1/hello HTTP/1.1\r\nHost: x\r\nAccept: application/json\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    ).encode()
    reply = Reply(exchange(server.url, data))
    assert reply.status == 200, reply.body
    assert json.loads(reply.body)["fingerprint"] == FP


def test_strict_json_refuses_nan(server: ServerProcess) -> None:
    headers = "Content-Type: application/json\r\n"
    reply = Reply(exchange(server.url, post("/v1/reset_seed", b'{"seed": NaN}', headers=headers)))
    assert reply.status == 400 and reply.error_code == ErrorCode.BAD_BODY_SIZE


BASE_REQUESTS = [
    post("/v1/health", headers="Accept: application/octet-stream\r\n"),
    post("/v1/reset_seed", b"\x01" * 8),
    post("/v1/step", b"\x00" * 4, headers="Connection: keep-alive\r\n"),
]
"""Well-formed requests the fuzz damages (their bodies kept)."""
SEPARATORS = b" \t:\r\n-0aZ,\x00\x7f"


def _mutations(seed: int, count: int) -> list[bytes]:
    """Requests whose head was damaged 1-3 times: a byte replaced (at random or by a
    separator), deleted or inserted, or a line doubled (seeded: the same list every run)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        head, _, body = rng.choice(BASE_REQUESTS).partition(b"\r\n\r\n")
        data = bytearray(head)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(data))
            kind = rng.randrange(5)
            if kind == 0:
                data[i] = rng.randrange(256)
            elif kind == 1:
                data[i] = rng.choice(SEPARATORS)
            elif kind == 2:
                del data[i]
            elif kind == 3:
                data.insert(i, rng.choice(SEPARATORS))
            else:
                lines = bytes(data).split(b"\r\n")
                j = rng.randrange(len(lines))
                lines.insert(j, lines[j])
                data = bytearray(b"\r\n".join(lines))
        out.append(bytes(data) + b"\r\n\r\n" + body)
    return out


def test_every_answer_to_a_mutated_head_keeps_the_contract(server: ServerProcess) -> None:
    """No built-in 400/417 without a body: an answer is a 200 or carries X-Transport-Error and
    an ERROR body with that code (or, when not even a request line is left, a 400 BAD_FRAME)."""
    for data in _mutations(seed=17, count=60):
        raw = exchange(server.url, data, wait=0.3)
        if not raw:
            continue  # waiting for more bytes (a mutated Content-Length): silence is allowed
        reply = Reply(raw)
        if reply.status == 200:
            continue
        assert reply.error_code is not None, f"{data!r} answered {raw[:200]!r}"
        assert reply.error_body()[0] == reply.error_code, f"{data!r} answered {raw[:200]!r}"


def split_responses(raw: bytes, data: bytes) -> list[bytes]:
    """The whole responses in ``raw`` (the first answers ``data``'s first request), each as its
    bytes; what follows them (a response cut short) as a last item."""
    out = []
    head_request = data.lstrip(b"\r\n").startswith(b"HEAD ")
    while raw:
        head, sep, rest = raw.partition(b"\r\n\r\n")
        match = re.search(rb"(?im)^content-length: *([0-9]+)", head)
        length = (
            0
            if (head_request and not out) or match is None or head.startswith(b"HTTP/1.1 1")
            else int(match.group(1))
        )
        if not sep or len(rest) < length:
            break
        end = len(head) + len(sep) + length
        out.append(raw[:end])
        raw = raw[end:]
    return [*out, raw] if raw else out


EDGE_REQUESTS = [
    b"HEAD /v1/health HTTP/1.1\r\nHost: x\r\n\r\n",
    post("/v1/health", host=False),
    post("/v1/health", headers="Expect: nope\r\n"),
    post("/v1/health", headers="Content-Length: 0\r\n"),
    post("/v1/health", headers="Transfer-Encoding: chunked\r\n"),
    post("/v1/reset_seed", b"[" * 40 + b"]" * 40, headers="Content-Type: application/json\r\n"),
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v1/health HTTP/1.1\r\nBad Header\r\n\r\n",
    b"CONNECT x:1 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
    b"COST /v1/health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    b"POST /v1/health HTTP/2.0\r\nHost: x\r\n\r\n",
    b"POST http://x/v1/health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    post("/v1/health", headers=f"X-Transport-Fingerprint: {FP}\r\n"),
    b"\r\n" + post("/v1/health"),  # an empty line before the request line is ignored
    post("/v1/health").replace(b" HTTP/1.1", b"   HTTP/1.1"),  # spaces: word boundaries
    post("/v1/health").replace(b" HTTP/1.1", b"\tHTTP/1.1"),  # a tab is not one
    post("/v1/health", headers="X-A: b\r\n" * 61),  # 64 header lines: served
    post("/v1/health", headers="X-A: b\r\n" * 62),  # 65: refused
    post("/v1/health").replace(b"Fingerprint: ", b"Fingerprint:\xa0"),  # not whitespace
    # parse errors: Python's texts from both, quoting only the line (or value) that failed
    *(
        post("/v1/health").replace(b"Content-Length: 0", b"Content-Length: " + value)
        for value in (b"-4", b"+4", b"0x4", b"4, 4", b"99999999999999999999999", b"")
    ),
    b"POST /v1/health HTTP/1.1\r\nContent-Length : 0\r\n\r\n",
    b"POST /v1/health HTTP/1.1\r\nX-A: b\r\n c\r\n\r\n",  # obs-fold
    b"POST /v1/health HTTP/1.2\r\nHost: x\r\n\r\n",
    b"post /v1/health HTTP/1.1\r\nHost: x\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello: no line at all
    post("/v1/health", headers="Transfer-Encoding: chunked\r\n").replace(
        b"Content-Length: 0\r\n", b""
    ),
    post("/v1/health", headers="Transfer-Encoding: chunked\r\nAccept: application/json\r\n"),
    post("/v1/health", headers="Content-Length: 4\r\nTransfer-Encoding: chunked\r\n"),
    # a valid request, then bytes that are not one: its answer, then the 400 quoting them alone
    post("/v1/step", b"WXYZ") + b"junk here\r\n\r\n",
    post("/v1/step", b"WXYZ") + b"\r\nPOST /v1/health HTTP/1.2\r\n\r\n",
    post("/v1/health") + b"POST /v1/health HTTP/1.1\r\nBad Header\r\n\r\n",
    # closing refusals: Content-Length before Connection: close
    post("/v1/health").replace(FP.encode(), b"0" * 16),
    post("/v1/step").replace(b"Content-Length: 0", b"Content-Length: 9007199254740993"),
    post("/v1/step").replace(b"Content-Length: 0", b"Content-Length: 018446744073709551615"),
    b"POST /v1/hello HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
    *_mutations(seed=5, count=150),
]
"""Edge-case requests both servers must answer with the same bytes."""


def test_both_servers_answer_the_same() -> None:
    """The same edge-case requests to a Python and a Node server: the same response bytes
    (status line, headers in order, body), each on a new connection."""
    answers: dict[str, list[bytes]] = {}
    for lang in LANGS:
        with ServerProcess(unique_url("http"), env="pac", lang=lang) as proc:
            responses = [
                2 if b"junk" in data or data.count(b"HTTP/1.") > 1 else 1 for data in EDGE_REQUESTS
            ]
            answers[lang] = [
                split_responses(exchange(proc.url, data, wait=0.3, responses=count), data)[:count]
                for data, count in zip(EDGE_REQUESTS, responses, strict=True)
            ]
    differences = [
        (data[:120], py, node)
        for data, py, node in zip(EDGE_REQUESTS, answers["python"], answers["node"], strict=True)
        if py != node
    ]
    assert not differences, differences
