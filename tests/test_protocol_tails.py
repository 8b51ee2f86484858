"""The response tails' readers in the protocol layer (one per language; Node:
protocol_tails.test.ts): the client channel, async batches and the HTTP JSON renderer share them,
so a malformed tail is a ProtocolError everywhere and a result is never read as a tail."""

from __future__ import annotations

import struct

import msgpack
import pytest

from transport.errors import ProtocolError
from transport.protocol import read_final_tail, split_recv_tail

SIZE = 6


def _same_step(results: bytes, finals: list[tuple[int, bytes]]) -> bytes:
    tail = struct.pack("<I", len(finals))
    return results + tail + b"".join(struct.pack("<I", i) + data for i, data in finals)


def test_final_tail_offsets() -> None:
    body = _same_step(b"r" * (3 * SIZE), [(2, b"A" * SIZE), (0, b"B" * SIZE)])
    finals = read_final_tail(body, 3 * SIZE, SIZE, 3)
    assert [(i, body[at : at + SIZE]) for i, at in finals] == [(2, b"A" * SIZE), (0, b"B" * SIZE)]
    assert read_final_tail(_same_step(b"r" * SIZE, []), SIZE, SIZE, 1) == []


@pytest.mark.parametrize(
    "body, most, text",
    [
        (b"r" * SIZE + b"\x01\x00", 1, "lacks its final tail"),
        (_same_step(b"r" * SIZE, [(0, b"A" * SIZE)]) + b"x", 1, "final tail says 1"),
        (_same_step(b"r" * SIZE, [(0, b"A" * SIZE)])[:-1], 1, "final tail says 1"),
        (_same_step(b"r" * SIZE, [(0, b"A" * SIZE), (0, b"B" * SIZE)]), 1, "final tail says 2"),
    ],
)
def test_bad_final_tail(body: bytes, most: int, text: str) -> None:
    with pytest.raises(ProtocolError, match=text):
        read_final_tail(body, SIZE, SIZE, most)


def test_recv_tail_after_results_that_look_like_one() -> None:
    """A result whose first byte is 0x93 (a msgpack fixarray of 3) is still a result."""
    results = bytes([0x93]) + b"\x00" * (SIZE - 1) + b"r" * SIZE
    body = results + msgpack.packb([[4, 1], [1], b"F" * SIZE])
    tail = split_recv_tail(body, SIZE, 4)
    assert (tail.count, tail.env_ids, tail.ended) == (2, [4, 1], [1])
    assert tail.final_rows(SIZE) == [(1, b"F" * SIZE)]


@pytest.mark.parametrize(
    "tail",
    [
        msgpack.packb([[4], [], b""]),  # one env id for two results
        msgpack.packb([[4, 1], [1], b"F"]),  # a final result of the wrong size
        msgpack.packb([[4, 1], [], b""]) + b"x",  # bytes after the tail
        b"",  # no tail at all
    ],
)
def test_bad_recv_tail(tail: bytes) -> None:
    with pytest.raises(ProtocolError, match="no \\[env ids, ended, finals\\] tail"):
        split_recv_tail(b"r" * (2 * SIZE) + tail, SIZE, 2)


def test_recv_tail_past_most() -> None:
    """More results than the caller asked for is no answer to its request."""
    body = b"r" * (3 * SIZE) + msgpack.packb([[0, 1, 2], [], b""])
    assert split_recv_tail(body, SIZE, 3).count == 3
    with pytest.raises(ProtocolError):
        split_recv_tail(body, SIZE, 2)
