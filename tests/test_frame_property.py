"""Property tests of the frame parser: random byte streams, split anywhere, never crash it.

``FramedSocket`` is fed from a socket stand-in that hands out the stream in chunks of random
sizes (the parser is pure logic over ``recv_into``); its output is compared with a reference
model of seed 000 Appendix A framing. Then random bytes go to live Python and Node servers
over a real Unix socket: the server answers with well-formed frames or closes, never hangs, and
keeps serving the next client.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import transport.api as api
from transport.backends.stream import FramedSocket
from transport.errors import BadFrameError, PeerGoneError
from transport.generated import pac_env
from transport.protocol import HEADER, HEADER_SIZE, ErrorCode, encode_hello

from .servers import LANGS, ServerProcess, unique_url

Frame = tuple[int, int, bytes]


class ChunkedSocket:
    """Hands out ``data`` to ``recv_into`` in the given chunk sizes, then end of stream."""

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        self.data = data
        self.sizes = sizes or [len(data) or 1]
        self.at = 0
        self.calls = 0

    def settimeout(self, timeout: float | None) -> None:
        pass

    def setsockopt(self, *option: Any) -> None:
        """FramedSocket sets its timeouts in the kernel (SO_RCVTIMEO/SO_SNDTIMEO)."""

    def recv_into(self, view: Any) -> int:
        size = self.sizes[self.calls % len(self.sizes)]
        self.calls += 1
        n = min(size, len(view), len(self.data) - self.at)
        view[:n] = self.data[self.at : self.at + n]
        self.at += n
        return n

    def close(self) -> None:
        pass


def reference_parse(data: bytes, max_body: int) -> tuple[list[Frame], type[Exception], int]:
    """Appendix A framing: the frames, then the error that ends the stream and its msg_id."""
    frames: list[Frame] = []
    at = 0
    while len(data) - at >= HEADER_SIZE:
        msg_type, msg_id, body_len = HEADER.unpack_from(data, at)
        if body_len > max_body:
            return frames, BadFrameError, msg_id
        end = at + HEADER_SIZE + body_len
        if end > len(data):
            break
        frames.append((msg_type, msg_id, data[at + HEADER_SIZE : end]))
        at = end
    return frames, PeerGoneError, -1


def parse_all(data: bytes, sizes: list[int], max_body: int, capacity: int) -> Iterator[Any]:
    """Everything ``FramedSocket`` makes of the stream: frames, then the exception that ends it."""
    framed = FramedSocket(
        ChunkedSocket(data, sizes),  # type: ignore[arg-type]
        max_body=max_body,
        capacity=capacity,
    )
    while True:
        try:
            msg_type, msg_id, body = framed.recv_frame()
        except (BadFrameError, PeerGoneError) as exc:
            yield exc
            return
        yield (msg_type, msg_id, bytes(body))


def frame_bytes(msg_type: int, msg_id: int, body: bytes, body_len: int | None = None) -> bytes:
    return HEADER.pack(msg_type, msg_id, len(body) if body_len is None else body_len) + body


frames_strategy = st.lists(
    st.tuples(st.integers(0, 255), st.integers(0, 2**32 - 1), st.binary(max_size=300)),
    max_size=12,
)
chunk_sizes = st.lists(st.integers(1, 700), min_size=1, max_size=20)


@settings(max_examples=300, deadline=None)
@given(frames=frames_strategy, sizes=chunk_sizes, capacity=st.sampled_from([1, 16, 4096]))
def test_valid_frames_come_out_whole_however_the_stream_is_split(
    frames: list[Frame], sizes: list[int], capacity: int
) -> None:
    data = b"".join(frame_bytes(*frame) for frame in frames)
    *got, end = parse_all(data, sizes, max_body=300, capacity=capacity)
    assert got == frames
    assert isinstance(end, PeerGoneError) and "middle" not in str(end)


@st.composite
def hostile_streams(draw: st.DrawFn) -> tuple[bytes, int]:
    """(stream, max_body): valid frames, frames at and just over the limit, truncated frames
    and raw noise, in any order (plain random bytes alone almost always claim ~2 GiB bodies)."""
    max_body = draw(st.integers(0, 400))
    parts = []
    for kind in draw(st.lists(st.sampled_from("frame limit over cut noise".split()), max_size=8)):
        msg_type, msg_id = draw(st.integers(0, 255)), draw(st.integers(0, 2**32 - 1))
        if kind == "frame":
            body = draw(st.binary(max_size=max_body))
            parts.append(frame_bytes(msg_type, msg_id, body))
        elif kind == "limit":
            parts.append(frame_bytes(msg_type, msg_id, bytes(max_body)))
        elif kind == "over":
            parts.append(frame_bytes(msg_type, msg_id, bytes(max_body + 1)))
        elif kind == "cut":
            whole = frame_bytes(msg_type, msg_id, draw(st.binary(max_size=max_body)))
            parts.append(whole[: draw(st.integers(0, len(whole) - 1))])
        else:
            parts.append(draw(st.binary(max_size=40)))
    return b"".join(parts), max_body


@settings(max_examples=500, deadline=None)
@given(stream=hostile_streams(), sizes=chunk_sizes)
def test_hostile_streams_give_frames_then_a_typed_error(
    stream: tuple[bytes, int], sizes: list[int]
) -> None:
    data, max_body = stream
    expected, error_type, msg_id = reference_parse(data, max_body)
    *got, end = parse_all(data, sizes, max_body=max_body, capacity=64)
    assert got == expected
    assert type(end) is error_type  # never struct.error, IndexError or a hang
    if isinstance(end, BadFrameError):
        assert end.msg_id == msg_id and f"maximum {max_body}" in str(end)


@settings(max_examples=200, deadline=None)
@given(
    frames=frames_strategy,
    garbage=st.binary(min_size=HEADER_SIZE, max_size=HEADER_SIZE),
    sizes=chunk_sizes,
)
def test_an_oversized_header_is_refused_before_its_body_is_read(
    frames: list[Frame], garbage: bytes, sizes: list[int]
) -> None:
    msg_type, msg_id, _ = HEADER.unpack(garbage)
    oversized = frame_bytes(msg_type, msg_id, b"", body_len=2**32 - 1)  # no body follows
    data = b"".join(frame_bytes(*frame) for frame in frames) + oversized
    *got, end = parse_all(data, sizes, max_body=300, capacity=16)
    assert got == frames
    assert isinstance(end, BadFrameError) and end.msg_id == msg_id


# -- live servers -----------------------------------------------------------------------------


@pytest.fixture(scope="module", params=LANGS)
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    with ServerProcess(unique_url("unix"), env="echo", lang=request.param) as proc:
        yield proc


def read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


hello = encode_hello(pac_env.SCHEMA.fingerprint)
MsgType = pac_env.MsgType
RESPONSES = {t for t in MsgType if t.name.endswith("_RESP")} | {MsgType.ERROR}


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    garbage=st.binary(max_size=600),
    after_hello=st.booleans(),
)
def test_a_live_server_survives_random_bytes(
    server: ServerProcess, garbage: bytes, after_hello: bool
) -> None:
    path = server.url.removeprefix("unix://")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(path)
        prefix = frame_bytes(MsgType.HELLO_REQ, 1, hello) if after_hello else b""
        sock.sendall(prefix + garbage)
        sock.shutdown(socket.SHUT_WR)
        answer = read_until_closed(sock, timeout=5)  # the server closes: never a hang
    # every byte it sent is a well-formed frame: HELLO_RESP, ERROR or an echo result
    frames, end, _ = reference_parse(answer, max_body=1 << 20)
    assert end is PeerGoneError and sum(HEADER_SIZE + len(b) for *_, b in frames) == len(answer)
    if after_hello:
        assert frames and frames[0][:2] == (MsgType.HELLO_RESP, 1)
    for msg_type, _, body in frames:
        assert msg_type in RESPONSES
        if msg_type == MsgType.ERROR:
            code, text_len = struct.unpack_from("<HH", body)
            assert code in {int(c) for c in ErrorCode} and len(body) == 4 + text_len
    with api.connect(server.url, timeout=5) as client:  # and it serves the next client
        client.reset()
        assert client.step(7).observation[0] == 7
