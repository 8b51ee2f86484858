"""Server limits (issue 17 item 1): bodies are read as bytes arrive, connections are capped with
a clear refusal, idle and trickling connections are closed; Python and Node servers, unix and
http, real processes and sockets. Memory is the server's RSS from /proc/PID/status."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import transport
from transport import RemoteError
from transport.protocol import HEADER, MESSAGE_IDS, decode_error
from transport.testing import ServeProcess, unique_url

MIB = 1 << 20


def rss_mib(pid: int) -> float:
    """The resident set of ``pid`` in MiB (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def raw_connect(url: str) -> socket.socket:
    """A bare socket to the server at ``url`` (unix:// or http://)."""
    scheme, _, rest = url.partition("://")
    if scheme == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(rest)
    else:
        host, _, port = rest.rpartition(":")
        sock = socket.create_connection((host, int(port)))
    sock.settimeout(10)
    return sock


def declare_body(url: str, size: int) -> bytes:
    """The first bytes of a request that declares a ``size``-byte body and never sends it."""
    if url.startswith("unix://"):
        return HEADER.pack(MESSAGE_IDS.STEP_REQ, 1, size) + b"x"
    head = f"POST /v1/step HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n"
    return head.encode("ascii") + b"x"


def read_until_closed(sock: socket.socket, limit: float = 10.0) -> bytes:
    """Everything the server sends until it closes (bounded by ``limit`` seconds)."""
    sock.settimeout(limit)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return data


def error_of(url: str, data: bytes) -> RemoteError:
    """The typed error an ERROR frame (unix) or an HTTP error response carries."""
    if url.startswith("unix://"):
        msg_type, msg_id, length = HEADER.unpack_from(data, 0)
        assert msg_type == MESSAGE_IDS.ERROR and msg_id == 0, (msg_type, msg_id)
        error = decode_error(data[HEADER.size : HEADER.size + length])
    else:
        head, _, body = data.partition(b"\r\n\r\n")
        assert b"Connection: close" in head, head
        error = decode_error(body)
    assert isinstance(error, RemoteError), error
    return error


CASES = [
    ("unix", "python"),
    ("http", "python"),
    ("unix", "node"),
    ("http", "node"),
]


@pytest.fixture(params=CASES, ids=["-".join(case) for case in CASES])
def case(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param  # type: ignore[no-any-return]


def start(scheme: str, lang: str, *flags: str, max_body: int = 64 * MIB) -> ServeProcess:
    return ServeProcess(
        unique_url(scheme),
        "pac_env",
        lang=lang,
        seed=1,
        max_body=max_body,
        extra_args=flags,
    )


@pytest.fixture
def stopper() -> Iterator[list[ServeProcess]]:
    servers: list[ServeProcess] = []
    yield servers
    for server in servers:
        server.stop()
        assert not server.leftovers()


def test_declared_bodies_cost_no_memory(case: tuple[str, str], stopper: list[ServeProcess]) -> None:
    """24 connections that each declare a 60 MiB body and send one byte of it do not grow the
    server by their declared sizes (before the fix: +1.4 GB on the Python servers)."""
    scheme, lang = case
    server = start(scheme, lang)
    stopper.append(server)
    with transport.connect(server.url) as client:  # warm up: one session, one step
        client.reset()
    before = rss_mib(server.pid)
    socks = [raw_connect(server.url) for _ in range(24)]
    for sock in socks:
        sock.sendall(declare_body(server.url, 60 * MIB))
    time.sleep(1.0)
    grown = rss_mib(server.pid) - before
    for sock in socks:
        sock.close()
    assert grown < 100, f"24 declared 60 MiB bodies grew the server by {grown:.0f} MiB"
    with transport.connect(server.url) as client:
        client.reset()


def test_memory_does_not_ratchet(case: tuple[str, str], stopper: list[ServeProcess]) -> None:
    """300 connections in turn, each declaring 1-60 MiB and closing: RSS stays flat."""
    scheme, lang = case
    server = start(scheme, lang)
    stopper.append(server)
    with transport.connect(server.url) as client:
        client.reset()
    before = rss_mib(server.pid)
    for i in range(300):
        with raw_connect(server.url) as sock:
            sock.sendall(declare_body(server.url, (1 + i % 60) * MIB))
    time.sleep(0.5)
    grown = rss_mib(server.pid) - before
    assert grown < 100, f"300 closed connections left the server {grown:.0f} MiB larger"


def test_connection_cap_refuses_clearly(case: tuple[str, str], stopper: list[ServeProcess]) -> None:
    """With --max-connections 2, a third connection gets a "server busy" ERROR (HTTP 503) and
    is closed; the two open ones keep working; once one closes, a new client is served."""
    scheme, lang = case
    server = start(scheme, lang, "--max-connections", "2")
    stopper.append(server)
    first = transport.connect(server.url)
    second = transport.connect(server.url)
    first.reset()
    with raw_connect(server.url) as extra:
        if scheme == "http":
            extra.sendall(b"POST /v1/health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        data = read_until_closed(extra)
    if scheme == "http":
        assert data.startswith(b"HTTP/1.1 503 "), data[:80]
    error = error_of(server.url, data)
    assert "max_connections" in error.text, error.text
    with pytest.raises(RemoteError, match="server busy"):
        transport.connect(server.url, timeout=5)
    assert first.health() and second.health()
    first.close()
    deadline = time.monotonic() + 10
    while True:  # the server notices the close a moment later
        try:
            with transport.connect(server.url, timeout=5) as third:
                assert third.health()
            break
        except RemoteError:
            assert time.monotonic() < deadline, "the freed slot was never reused"
            time.sleep(0.05)
    second.close()


def test_idle_connection_is_closed(case: tuple[str, str], stopper: list[ServeProcess]) -> None:
    """--idle-timeout 1: a connection that sends nothing is closed by the server."""
    scheme, lang = case
    server = start(scheme, lang, "--idle-timeout", "1")
    stopper.append(server)
    with raw_connect(server.url) as sock:
        started = time.monotonic()
        assert read_until_closed(sock, limit=15) == b""
        assert time.monotonic() - started < 15, "the idle connection was never closed"
    with transport.connect(server.url) as client:  # a client that keeps talking is served
        for _ in range(3):
            client.health()
            time.sleep(0.3)


def test_trickling_request_is_closed(case: tuple[str, str], stopper: list[ServeProcess]) -> None:
    """--read-timeout 1: a request trickled one byte every 0.2 s (slowloris) is answered with
    a timeout ERROR (HTTP 408) and closed, although every gap is shorter than the timeout."""
    scheme, lang = case
    server = start(scheme, lang, "--read-timeout", "1")
    stopper.append(server)
    data = declare_body(server.url, 1000)
    with raw_connect(server.url) as sock:
        closed = False
        for byte in data + b"y" * 200:
            try:
                sock.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.2)
            if _closed(sock):
                closed = True
                break
        assert closed, "a request trickled for 40 s was never cut"
        got = read_until_closed(sock, limit=5)
    if got:
        error = error_of(server.url, got)
        assert "read_timeout" in error.text, error.text
        if scheme == "http":
            assert got.startswith(b"HTTP/1.1 408 "), got[:80]


def _closed(sock: socket.socket) -> bool:
    """Whether the server has answered or closed (without consuming what it sent)."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)) or True
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.mark.parametrize("lang", ["python", "node"])
@pytest.mark.parametrize(
    "flag,value", [("--max-connections", "0"), ("--idle-timeout", "-1"), ("--read-timeout", "0")]
)
def test_non_positive_limits_exit_2(lang: str, flag: str, value: str) -> None:
    """A non-positive limit is refused at start: exit 2, one line naming the flag."""
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "transport.tools.serve_cli",
            unique_url("unix"),
            "--lang",
            lang,
            flag,
            value,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc
    assert flag in proc.stderr.strip().splitlines()[-1], proc.stderr


def test_server_limits_validate() -> None:
    """ServerLimits refuses non-positive values with a ValueError naming the field."""
    for field in ("max_connections", "idle_timeout", "read_timeout"):
        with pytest.raises(ValueError, match=field):
            transport.ServerLimits(**{field: 0})
