"""Raw floors: a row's bytes over the row's own socket stack, with no protocol at all.

A transport row is a Python client and a server in Python or Node. Its raw floor
(``raw-<scheme>``, server ``python`` or ``node``) is a bare Python loop that sends the row's
request bytes and reads its response bytes, against a bare echo server of the same language and
socket library (transport/probe/raw_server.py, node_bridge/src/tools/raw_echo.ts):

    raw-unix      AF_UNIX stream socket (Python ``socket``, Node ``net``)
    raw-zmq+ipc   ZeroMQ DEALER -> ROUTER over ipc (pyzmq, zeromq.js)
    raw-zmq+tcp   the same over loopback TCP
    raw-http      a keep-alive HTTP/1.1 POST -> 200 (Node ``http`` only: the standard library
                  of Python has no server that is a floor; Python http rows keep the C TCP floor)

A row's ``x floor`` is its p50 over the p50 of the raw floor of its scheme and server language
at the same point when there is one (what the transport adds to the stack it runs on; issue 17
item 9 asks for at most 1.2x), else over the C floor (transport/probe/floor.py).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack

from transport.probe.histogram import LogHistogram
from transport.probe.loops import LoopStats, closed_loop, warm_up
from transport.probe.servers import NODE_SERVER, ROOT, ServerStartError, _free_port

RAW_SCHEMES: dict[str, tuple[str, ...]] = {
    "unix": ("python", "node"),
    "zmq+ipc": ("python", "node"),
    "zmq+tcp": ("python", "node"),
    "http": ("node",),
}
"""The schemes with a raw floor, and the server languages it exists in."""
NODE_RAW_ECHO = NODE_SERVER.parent.parent / "tools" / "raw_echo.js"


def raw_name(scheme: str) -> str:
    return f"raw-{scheme}"


class RawServer:
    """The bare echo server of one raw floor, as a child process (stopped by ``close``)."""

    def __init__(
        self, scheme: str, lang: str, tag: str, request_bytes: int, response_bytes: int
    ) -> None:
        kind = "zmq" if scheme.startswith("zmq") else scheme
        if scheme == "unix":
            address = f"{tempfile.gettempdir()}/{tag}.raw.sock"
        elif scheme == "zmq+ipc":
            address = f"ipc://{tempfile.gettempdir()}/{tag}.raw.ipc"
        elif scheme == "zmq+tcp":
            address = f"tcp://127.0.0.1:{_free_port()}"
        else:
            address = str(_free_port())
        sizes = [str(request_bytes), str(response_bytes)]
        if lang == "python":
            argv = [sys.executable, "-m", "transport.probe.raw_server", kind, address, *sizes]
        else:
            argv = ["node", str(NODE_RAW_ECHO), kind, address, *sizes]
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode("utf-8", "replace").strip()
        if not line.startswith("ready "):
            self.close()
            raise ServerStartError(f"the {lang} raw {scheme} server did not start ({line!r})")
        self.address = line.split(" ", 1)[1]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        # the server removes its socket file itself, but a SIGTERM that lands while it is
        # already cleaning up (its client just left) can cut that short: the parent finishes it
        path = getattr(self, "address", "").removeprefix("ipc://")
        if path.startswith("/"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _read_exactly(sock: socket.socket, buf: memoryview, size: int) -> None:
    got = 0
    while got < size:
        n = sock.recv_into(buf[got:size])
        if n == 0:
            raise ConnectionError("the raw server closed the connection")
        got += n


def _unix_call(
    stack: ExitStack, address: str, request: bytes, response_bytes: int
) -> Callable[[], None]:
    sock = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
    sock.connect(address)
    buf = memoryview(bytearray(response_bytes))

    def call() -> None:
        sock.sendall(request)
        _read_exactly(sock, buf, response_bytes)

    return call


def _zmq_call(stack: ExitStack, address: str, request: bytes) -> Callable[[], None]:
    import zmq

    context = zmq.Context()
    stack.callback(context.term)
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    stack.callback(dealer.close)
    dealer.connect(address)

    def call() -> None:
        dealer.send(request, copy=False)
        dealer.recv(copy=False)

    return call


def _http_call(
    stack: ExitStack, address: str, body: bytes, response_bytes: int
) -> Callable[[], None]:
    host, _, port = address.removeprefix("http://").partition(":")
    sock = stack.enter_context(socket.create_connection((host, int(port))))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    request = (
        f"POST /v1/step HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    buf = bytearray(64 * 1024 + response_bytes)
    view = memoryview(buf)

    def call() -> None:
        sock.sendall(request)
        got = 0
        while True:  # the head, then Content-Length bytes of body
            n = sock.recv_into(view[got:])
            if n == 0:
                raise ConnectionError("the raw server closed the connection")
            got += n
            end = buf.find(b"\r\n\r\n", 0, got)
            if end >= 0:
                break
        head = bytes(buf[:end]).lower()
        length = int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        _read_exactly(sock, view[end + 4 :], length - (got - end - 4))

    return call


def measure_raw(
    scheme: str,
    lang: str,
    tag: str,
    request_bytes: int,
    response_bytes: int,
    count: int,
    warmup: int,
    duration: float,
) -> tuple[LogHistogram, LoopStats]:
    """Start the raw server, run the bare client loop (warm-up, then ``count`` recorded round
    trips or ``duration`` seconds), stop it."""
    server = RawServer(scheme, lang, tag, request_bytes, response_bytes)
    try:
        with ExitStack() as stack:
            request = bytes(request_bytes)
            if scheme == "unix":
                call = _unix_call(stack, server.address, request, response_bytes)
            elif scheme.startswith("zmq"):
                call = _zmq_call(stack, server.address, request)
            else:
                call = _http_call(stack, server.address, request, response_bytes)
            clock = time.perf_counter_ns
            warm_up(call, warmup, int(duration * 0.5e9), clock)
            hist = LogHistogram()
            stats = closed_loop(call, count, hist, max_ns=int(duration * 1e9))
        return hist, stats
    finally:
        server.close()
