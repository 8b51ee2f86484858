"""http:// clients (Python and Node) against real TCP peers that are not transport servers:
an SSH banner, a web page without Content-Length, a chunked answer, a peer that closes or
resets during the HELLO, and a peer that turns into garbage after the handshake.

Before: over Python the SSH banner waited out the whole timeout and said
``TransportTimeoutError: no complete response within 5.0 s`` (the status line was read only
after CRLFCRLF), a 200 without Content-Length and a chunked answer were ``ProtocolError`` and a
close or reset during the HELLO a ``PeerGoneError`` (Node and docs/node.md: ``ConnectError``);
Node said "the server closed the connection (HPE_INVALID_CONSTANT)" for a peer that sent bytes
that are not HTTP, and garbage after the handshake was a ``PeerGoneError`` there (Python: a
timeout)."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import transport.api as api
from tests.servers import require_lang
from transport.envs.echo import EchoEnv
from transport.errors import (
    ConnectError,
    PeerGoneError,
    ProtocolError,
    TransportError,
    TransportTimeoutError,
)

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 20.0
"""Long enough that a client waiting it out (the bug) fails on the error's type, not a clock."""
BANNER = b"SSH-2.0-OpenSSH_8.9\r\n"

Handler = Callable[[socket.socket], None]


def read_head(conn: socket.socket) -> bytes:
    """A request's head (its body, if any, stays unread), or what came before EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    return data


def read_request(conn: socket.socket) -> bytes:
    """A whole request (head and Content-Length body), or b"" at EOF."""
    data = read_head(conn)
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return b""
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(length - len(body))
        if not chunk:
            return b""
        body += chunk
    return head + sep + body


def read_response(sock: socket.socket) -> bytes:
    """A whole response with a Content-Length body (the transport server's)."""
    return read_request(sock)  # the same framing: a head and a Content-Length body


def drain(conn: socket.socket) -> None:
    """Stay silent until the client closes."""
    try:
        while conn.recv(65536):
            pass
    except OSError:
        pass


def banner(conn: socket.socket) -> None:
    conn.sendall(BANNER)
    drain(conn)


def answers(reply: bytes) -> Handler:
    def handle(conn: socket.socket) -> None:
        read_head(conn)
        conn.sendall(reply)
        drain(conn)

    return handle


def closes(conn: socket.socket) -> None:
    read_head(conn)


def resets(conn: socket.socket) -> None:
    read_head(conn)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def garbage_after_hello(upstream: str, gate: threading.Event | None = None) -> Handler:
    """Relays the HELLO to a real transport server, then answers the next request with bytes
    that are not HTTP (once ``gate`` is set, if given) and stays silent."""
    host, _, port = upstream.removeprefix("http://").rpartition(":")

    def handle(conn: socket.socket) -> None:
        with socket.create_connection((host, int(port)), timeout=TIMEOUT) as server:
            request = read_request(conn)
            assert request.startswith(b"POST /v1/hello "), request[:40]
            server.sendall(request)
            conn.sendall(read_response(server))
        if read_head(conn) and (gate is None or gate.wait(3 * TIMEOUT)):
            conn.sendall(b"\x00\x17garbage\xff\r\n")
        drain(conn)

    return handle


def trickle(upstream: str) -> Handler:
    """Relays every request to a real transport server and its response back one byte per send
    (after an interim ``100 Continue``): a head that comes in pieces is still read."""
    host, _, port = upstream.removeprefix("http://").rpartition(":")

    def handle(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with socket.create_connection((host, int(port)), timeout=TIMEOUT) as server:
            while request := read_request(conn):
                server.sendall(request)
                response = b"HTTP/1.1 100 Continue\r\n\r\n" + read_response(server)
                for i in range(len(response)):
                    conn.sendall(response[i : i + 1])

    return handle


class FakePeer:
    """A TCP listener on 127.0.0.1 that hands every connection to ``handler`` in a thread."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.listening = socket.create_server(("127.0.0.1", 0))
        self.listening.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.listening.getsockname()[1]}"
        self.stopped = threading.Event()
        self.threads: list[threading.Thread] = []
        self.accepting = threading.Thread(target=self._accept, daemon=True)
        self.accepting.start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listening.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(3 * TIMEOUT)  # outlasts a client waiting out its timeout
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                self.handler(conn)
            except OSError:
                pass

    def close(self) -> None:
        self.stopped.set()
        self.accepting.join(TIMEOUT)
        self.listening.close()
        for thread in self.threads:
            thread.join(TIMEOUT)


HANDSHAKE_PEERS: dict[str, tuple[Handler, str, type[TransportError]]] = {
    # name: (the peer, words the error says, the type of the error it was caused by)
    "ssh banner": (banner, "does not speak HTTP", ProtocolError),
    "200 web page without Content-Length": (
        answers(b"HTTP/1.0 200 OK\r\nContent-Type: text/html\r\n\r\n<html>"),
        "without Content-Length",
        ProtocolError,
    ),
    "chunked 200": (
        answers(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
        "",
        ProtocolError,
    ),
    "close during the HELLO": (closes, "closed the connection", PeerGoneError),
    "reset during the HELLO": (resets, "", PeerGoneError),
}


@pytest.fixture
def upstream() -> Iterator[api.Server]:
    with api.Server(EchoEnv, "http://127.0.0.1:0").start() as srv:
        yield srv


@pytest.mark.parametrize("name", list(HANDSHAKE_PEERS))
def test_python_handshake_with_a_peer_that_is_not_a_transport_server(name: str) -> None:
    handler, words, cause = HANDSHAKE_PEERS[name]
    peer = FakePeer(handler)
    try:
        with pytest.raises(TransportError) as caught:
            api.connect(peer.url, timeout=TIMEOUT)
    finally:
        peer.close()
    error = caught.value
    assert type(error) is ConnectError, repr(error)
    text = str(error)
    assert text.startswith(f"{peer.url}: "), text
    assert "during the HELLO handshake (not a transport server on this backend?)" in text, text
    assert words in text, text
    assert isinstance(error.__cause__, cause), repr(error.__cause__)


def test_python_garbage_after_the_handshake_is_a_protocol_error(upstream: api.Server) -> None:
    peer = FakePeer(garbage_after_hello(upstream.bound_url))
    try:
        with api.connect(peer.url, timeout=TIMEOUT) as client:
            with pytest.raises(TransportError) as caught:
                client.reset(seed=1)
            assert type(caught.value) is ProtocolError, repr(caught.value)
            assert not isinstance(caught.value, TransportTimeoutError)
            assert "does not speak HTTP" in str(caught.value), str(caught.value)
            with pytest.raises(PeerGoneError, match="open a new client"):
                client.reset(seed=1)  # the connection was abandoned
    finally:
        peer.close()


def test_python_garbage_in_place_of_a_late_response_is_a_protocol_error(
    upstream: api.Server,
) -> None:
    """The late response to a timed-out request is read before the next request: garbage there
    is a ``ProtocolError`` at once (before: that request's timeout ran out, waiting for a head)."""
    gate = threading.Event()
    peer = FakePeer(garbage_after_hello(upstream.bound_url, gate))
    try:
        with api.connect(peer.url, timeout=3.0) as client:
            with pytest.raises(TransportTimeoutError):
                client.reset(seed=1)  # the peer is silent until the gate opens
            gate.set()
            with pytest.raises(TransportError) as caught:
                client.reset(seed=1)
            assert type(caught.value) is ProtocolError, repr(caught.value)
            assert "does not speak HTTP" in str(caught.value), str(caught.value)
    finally:
        gate.set()
        peer.close()


def test_python_reads_a_head_that_comes_one_byte_at_a_time(upstream: api.Server) -> None:
    """The early status-line check takes every prefix of a real status line."""
    peer = FakePeer(trickle(upstream.bound_url))
    try:
        with api.connect(peer.url, timeout=TIMEOUT) as client:
            client.reset(seed=1)
            client.step(3)
            assert client.health()
    finally:
        peer.close()


NODE_CLIENT = r"""
const { connect } = require("./node_bridge/dist/index.js");
const cases = JSON.parse(require("fs").readFileSync(0, "utf8"));
(async () => {
  const out = {};
  for (const [name, url, after] of cases) {
    let client = null;
    try {
      client = await connect(url, { timeoutMs: TIMEOUT_MS });
      if (after) await client.reset(1n);
      out[name] = { type: "none", message: "" };
    } catch (error) {
      out[name] = { type: error.constructor.name, message: error.message };
    } finally {
      if (client !== null) await client.close().catch(() => {});
    }
  }
  process.stdout.write(JSON.stringify(out));
})();
""".replace("TIMEOUT_MS", str(int(TIMEOUT * 1000)))


def test_node_clients_agree(upstream: api.Server) -> None:
    require_lang("node")
    peers = {name: FakePeer(handler) for name, (handler, _, _) in HANDSHAKE_PEERS.items()}
    after = FakePeer(garbage_after_hello(upstream.bound_url))
    cases = [[name, peer.url, False] for name, peer in peers.items()]
    cases.append(["garbage after the handshake", after.url, True])
    try:
        done = subprocess.run(
            ["node", "-e", NODE_CLIENT],
            input=json.dumps(cases),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=len(cases) * TIMEOUT + 30,
            check=True,
        )
    finally:
        for peer in [*peers.values(), after]:
            peer.close()
    got = json.loads(done.stdout)
    for name, peer in peers.items():
        words = HANDSHAKE_PEERS[name][1]
        result = got[name]
        assert result["type"] == "ConnectError", (name, result)
        text = result["message"]
        assert text.startswith(f"{peer.url}: "), (name, text)
        assert "during the HELLO handshake (not a transport server on this backend?)" in text
        assert words in text, (name, text)
    banner_text = got["ssh banner"]["message"]
    assert "closed the connection" not in banner_text, banner_text
    result = got["garbage after the handshake"]
    assert result["type"] == "ProtocolError", result
    assert "does not speak HTTP" in result["message"], result
