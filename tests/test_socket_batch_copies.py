"""Issue 24 item 3: a batch goes out of a socket backend without being copied in user space.

A frame's header and body are sent with one scatter/gather ``sendmsg``; when the kernel takes
only part of it (a full socket buffer), the rest is sent from views of the same parts, never
from a joined copy (``transport.backends.sockets.send_parts``). And a real batch over a real
Unix socket pair arrives whole into the receiver's reused buffer."""

from __future__ import annotations

import fcntl
import select
import socket
import sys
import termios
import threading
import time
from typing import Any

from transport.backends.http import client as http_client
from transport.backends.sockets import send_parts
from transport.backends.stream import FramedSocket
from transport.client import resolve_schema
from transport.protocol import BODY_OFFSET, HEADER_SIZE, MessageIds


class TrickleSocket:
    """A socket stand-in whose kernel takes at most ``most`` bytes per call; it records the
    objects behind the buffers it was handed (a copy would show as a new object)."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.data = bytearray()
        self.sources: set[int] = set()
        self.joined = 0  # calls of sendall / send with a buffer of their own

    def sendmsg(self, buffers: list[Any]) -> int:
        room = self.most
        for buffer in buffers:
            view = memoryview(buffer)
            self.sources.add(id(view.obj))
            take = min(room, view.nbytes)
            self.data += view[:take]
            room -= take
            if not room:
                break
        return self.most - room

    def sendall(self, data: Any) -> None:
        self.joined += 1
        self.data += data

    def settimeout(self, value: float | None) -> None:
        pass

    def setsockopt(self, *args: Any) -> None:
        pass


def test_send_parts_finishes_a_partial_send_from_views() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"
    body = bytearray(range(256)) * 400
    sock = TrickleSocket(7000)
    send_parts(sock, (head, memoryview(body)))  # type: ignore[arg-type]
    assert bytes(sock.data) == head + bytes(body)
    assert sock.joined == 0
    assert sock.sources <= {id(head), id(body)}, "a part was copied before sending"


def test_a_frame_sent_in_pieces_is_never_joined() -> None:
    """FramedSocket.send_frame (every stream client's request path) under a trickling kernel."""
    sock = TrickleSocket(4096)
    framed = FramedSocket(sock, timeout=None)  # type: ignore[arg-type]
    body = bytearray(b"\x07" * 50_000)
    framed.send_frame(3, 9, memoryview(body))
    assert len(sock.data) == HEADER_SIZE + len(body) and sock.data[HEADER_SIZE:] == body
    assert sock.joined == 0, "the rest of a partial send was joined into a copy"
    assert sock.sources <= {id(framed._header), id(body)}


def test_a_batch_bigger_than_the_socket_buffer_arrives_whole() -> None:
    """Two 2 MB bodies over a real Unix socket pair with small buffers (many partial sends):
    each arrives whole, the second into the receiver's same (reused) buffer."""
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 << 10)
    sender = FramedSocket(left, timeout=20.0)
    receiver = FramedSocket(right, timeout=20.0, capacity=4096)
    body = bytearray((i * 7) & 0xFF for i in range(2 << 20))

    def send_two() -> None:
        sender.send_frame(5, 11, memoryview(body))
        sender.send_frame(5, 12, memoryview(body))

    thread = threading.Thread(target=send_two)
    thread.start()
    try:
        msg_type, msg_id, got = receiver.recv_frame()
        assert (msg_type, msg_id) == (5, 11) and got == body
        buffer = receiver.buffer
        _, msg_id, got = receiver.recv_frame()
        assert msg_id == 12 and got == body and receiver.buffer is buffer
    finally:
        thread.join(20)
        sender.close()
        receiver.close()


class CountingSocket:
    """A client socket that waits until most of the response is readable before its first
    read (``whole`` bytes: the worst case for a head read) and counts the bytes read into
    buffers other than the body's (those are copied into place afterwards)."""

    def __init__(self, sock: socket.socket, body_buffer: Any, whole: int) -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.sock = sock
        self.body_buffer = body_buffer
        self.whole = whole
        self.outside = 0
        self.first = True

    def recv_into(self, view: memoryview) -> int:
        if self.first:
            self.first = False
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                select.select([self.sock], [], [], 1.0)
                queued = bytearray(4)
                fcntl.ioctl(self.sock.fileno(), termios.FIONREAD, queued)
                if int.from_bytes(queued, sys.byteorder) >= self.whole:
                    break
        n = self.sock.recv_into(view)
        if view.obj is not self.body_buffer:
            self.outside += n
        return n

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


def test_an_http_response_body_is_received_in_place() -> None:
    """Python http client: of a 200 KB response that is all there at the first read, only a few
    KiB (the head's read window) land outside the body buffer (before: up to 80 KiB)."""
    schema = resolve_schema(None)
    step_resp = MessageIds.from_schema(schema.ir).STEP_BATCH_RESP
    body = bytes((i * 13) & 0xFF for i in range(200_000))
    head = (
        f"HTTP/1.1 200 OK\r\nX-Transport-Msg-Type: {step_resp}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)  # the request (small)
            conn.sendall(head + body)
            conn.recv(1)  # until the client closes

    thread = threading.Thread(target=answer)
    thread.start()
    try:
        port = listener.getsockname()[1]
        channel = http_client.open_channel(f"http://127.0.0.1:{port}", timeout=30.0, schema=schema)
        try:
            channel._buffer = bytearray(BODY_OFFSET + len(body))  # big enough: no regrowth
            channel._view = memoryview(channel._buffer)
            real = channel.sock
            assert real is not None
            counting = CountingSocket(real, channel._buffer, len(head) + 100_000)
            channel.sock = counting  # type: ignore[assignment]
            msg_type, got = channel.request(MessageIds.from_schema(schema.ir).STEP_BATCH_REQ, b"x")
            assert msg_type == step_resp and got == body
            assert counting.outside <= 4096, f"{counting.outside} bytes read outside the body"
        finally:
            channel.sock = real
            channel.close()
    finally:
        thread.join(10)
        listener.close()
