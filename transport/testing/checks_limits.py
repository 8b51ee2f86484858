"""Contract checks of the server limits (issue 17 item 1; docs/server.md "Limits"): a declared
but unsent body costs the server no memory, a connection over ``--max-connections`` is refused
clearly while the open ones keep working, and idle or trickling connections are closed after
their timeout. They apply to the socket servers (unix://, http://): zmq messages arrive whole
(ZMQ_MAXMSGSIZE is set from max_body) and shm:// has no connections.

The raw-socket helpers here are the ones tests/test_server_limits.py uses too.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import transport
from transport.errors import RemoteError
from transport.protocol import HEADER, MESSAGE_IDS, decode_error
from transport.testing.checks import TIMEOUT, CheckContext, NotApplicable, _check
from transport.testing.servers import RunningServer, ServerOptions

MIB = 1 << 20
LIMITED = ("--max-connections", "2", "--idle-timeout", "1", "--read-timeout", "1")
"""The limits of the contract's limited server: small enough to trip in a second."""
GROWTH_BOUND_MIB = 100
"""How much a server may grow while 16 connections declare 32 MiB each (before the fix: 512)."""


def rss_mib(pid: int) -> float:
    """The resident set of ``pid`` in MiB (VmRSS of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def raw_connect(url: str, timeout: float = 10.0) -> socket.socket:
    """A bare socket to the server at ``url`` (unix:// or http://)."""
    scheme, _, rest = url.partition("://")
    if scheme == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(rest)
        return sock
    host, _, port = rest.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def declare_body(url: str, size: int) -> bytes:
    """The first bytes of a request that declares a ``size``-byte body (and one byte of it)."""
    if url.startswith("unix://"):
        return HEADER.pack(MESSAGE_IDS.STEP_REQ, 1, size) + b"x"
    head = f"POST /v1/step HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n"
    return head.encode("ascii") + b"x"


def read_until_closed(sock: socket.socket, limit: float = 10.0) -> bytes | None:
    """Everything the server sends until it closes; None if it did not close within ``limit``
    seconds (a reset counts as closed)."""
    sock.settimeout(0.1)
    data = b""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk
    return None


def connection_error(url: str, data: bytes) -> RemoteError:
    """The typed error of an ERROR frame with msg_id 0 (unix) or an HTTP error response that
    closes the connection (http)."""
    if url.startswith("unix://"):
        msg_type, msg_id, length = HEADER.unpack_from(data, 0)
        assert (msg_type, msg_id) == (MESSAGE_IDS.ERROR, 0), f"frame {msg_type:#x} id {msg_id}"
        error = decode_error(data[HEADER.size : HEADER.size + length])
    else:
        head, _, body = data.partition(b"\r\n\r\n")
        assert b"\r\nConnection: close" in head, f"no Connection: close in {head!r}"
        error = decode_error(body)
    assert isinstance(error, RemoteError), f"not an ERROR: {error}"
    return error


def _socket_server(ctx: CheckContext, options: ServerOptions) -> RunningServer:
    """A server with ``options``, once the shared one has shown the scheme has connections."""
    if ctx.server().url.partition("://")[0] not in ("unix", "http"):
        raise NotApplicable("no connections to limit: zmq messages arrive whole, shm has slots")
    return ctx.factory(ctx.schema, 1, options)


@_check(per_schema=False)
def check_declared_bodies_cost_no_memory(ctx: CheckContext) -> None:
    """16 connections that declare a 32 MiB body and send one byte do not grow the server by
    what they declared (it reads bodies as they arrive); it serves a client afterwards."""
    server = _socket_server(ctx, ServerOptions(max_body=64 * MIB))
    with ctx.connect(server) as client:
        client.reset()
    before = rss_mib(server.pid)
    socks = [raw_connect(server.url) for _ in range(16)]
    try:
        for sock in socks:
            sock.sendall(declare_body(server.url, 32 * MIB))
        time.sleep(0.5)
        grown = rss_mib(server.pid) - before
    finally:
        for sock in socks:
            sock.close()
    assert grown < GROWTH_BOUND_MIB, f"16 declared 32 MiB bodies grew the server by {grown:.0f} MiB"
    with ctx.connect(server) as client:
        assert client.health()


@_check(per_schema=False)
def check_connection_cap(ctx: CheckContext) -> None:
    """With --max-connections 2, a third client is refused with a typed "server busy" error
    (RemoteError; on the wire an ERROR frame with msg_id 0, or an HTTP 503 with the ERROR body)
    and closed, while the two open clients keep working."""
    server = _socket_server(ctx, ServerOptions(limits=LIMITED[:2]))
    with ctx.connect(server) as first, ctx.connect(server) as second:
        first.reset()
        with raw_connect(server.url) as extra:
            if server.url.startswith("http://"):
                extra.sendall(b"POST /v1/health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            data = read_until_closed(extra)
        assert data is not None, "a connection over the cap was left open"
        if server.url.startswith("http://"):
            assert data.startswith(b"HTTP/1.1 503 "), f"answered {data[:40]!r}, expected a 503"
        error = connection_error(server.url, data)
        assert "max_connections" in error.text, error.text
        try:
            ctx.connect(server, timeout=TIMEOUT).close()
        except RemoteError as exc:
            assert "server busy" in exc.text, exc.text
        else:
            raise AssertionError("a third client was served with --max-connections 2")
        assert first.health() and second.health(), "an open client stopped working"


@_check(per_schema=False)
def check_idle_and_trickling_connections_closed(ctx: CheckContext) -> None:
    """With --idle-timeout 1 --read-timeout 1, a connection that sends nothing and one that
    trickles a request a byte every 0.2 s (each gap under the timeout) are both closed; the
    trickler is told why when the server gets to say it (ERROR / HTTP 408 naming read_timeout)."""
    server = _socket_server(ctx, ServerOptions(limits=LIMITED[2:]))
    idle = raw_connect(server.url)
    trickler = raw_connect(server.url)
    try:
        data = declare_body(server.url, 1000) + b"y" * 100
        deadline = time.monotonic() + 20  # a server with no read timeout keeps it for 30 s
        at = 0
        while at < len(data) and time.monotonic() < deadline:
            try:
                trickler.send(data[at : at + 1])
            except OSError:
                break  # closed by the server
            at += 1
            time.sleep(0.2)
            if _answered(trickler):
                break
        got = read_until_closed(trickler, limit=5)
        assert got is not None, "a request trickled for 20 s was never cut"
        if got:
            error = connection_error(server.url, got)
            assert "read_timeout" in error.text, error.text
            if server.url.startswith("http://"):
                assert got.startswith(b"HTTP/1.1 408 "), f"answered {got[:40]!r}"
        assert read_until_closed(idle, limit=10) == b"", "an idle connection was never closed"
    finally:
        idle.close()
        trickler.close()
    with transport.connect(server.url, ctx.schema, timeout=TIMEOUT) as client:
        for _ in range(3):  # a client that keeps talking is served across the idle timeout
            assert client.health()
            time.sleep(0.4)


def _answered(sock: socket.socket) -> bool:
    """Whether the server has sent something or closed (nothing is consumed)."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True
