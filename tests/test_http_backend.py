"""http:// with real sockets: in-process servers, raw HTTP clients, and a killed server process."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import transport.api as api
from transport.backends import http as http_backend
from transport.codec import Schema
from transport.envs.echo import EchoEnv
from transport.errors import (
    BadFrameError,
    ConnectError,
    FingerprintMismatchError,
    PeerGoneError,
    TransportTimeoutError,
)
from transport.generated import pac_env
from transport.protocol import ErrorCode, MessageIds
from transport.runtime.host import EnvHost
from transport.schema import compile_schema

ROOT = Path(__file__).resolve().parents[1]
IDS = MessageIds.from_schema(pac_env.SCHEMA.ir)
FP = f"{pac_env.SCHEMA.fingerprint:016x}"
TIMEOUT = 5.0


@pytest.fixture
def server() -> Iterator[api.Server]:
    with api.Server(EchoEnv, "http://127.0.0.1:0").start() as srv:
        yield srv


def host_port(url: str) -> tuple[str, int]:
    address = http_backend.parse_url(url)
    return address.host, address.port


def raw_connect(url: str) -> socket.socket:
    sock = socket.create_connection(host_port(url), timeout=TIMEOUT)
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while not data.endswith(b"\r\n\r\n"):  # byte by byte: never read into the next response
        chunk = sock.recv(1)
        if not chunk:
            raise EOFError(f"closed before a response head: {data!r}")
        data += chunk
    head, body = data[:-4], b""
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            raise EOFError("closed mid-body")
        body += chunk
    return status, headers, body


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def error_code(body: bytes) -> int:
    return int(struct.unpack_from("<H", body, 0)[0])


def post(
    url: str, method: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    host, port = host_port(url)
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    try:
        conn.request("POST", f"/v1/{method}", body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


# -- round trips ---------------------------------------------------------------------------------


def test_round_trip_echo(server: api.Server) -> None:
    assert server.bound_url.startswith("http://127.0.0.1:")
    assert not server.bound_url.endswith(":0")
    with api.connect(server.bound_url, timeout=TIMEOUT) as client:
        assert client.server_info["num_envs"] == 1
        assert client.server_info["server"] == "python"
        assert client.health()
        spaces = client.spaces()
        assert (spaces.obs_n, spaces.act_n) == (612, 92)
        first = client.reset(seed=3)
        assert first.observation.shape == (612,)
        assert first.action_mask.all()
        for step in range(1, 6):
            result = client.step(step)
            assert result.observation[0] == step
            assert result.observation[1] == step
            assert result.reward == pytest.approx(step / 4)
        assert client.reset().observation[1] == 0
        # views are aligned, in the channel buffer at BODY_OFFSET
        assert result.observation.ctypes.data % 16 == 0


def test_batched_server_step_batch() -> None:
    with api.Server(EchoEnv, "http://127.0.0.1:0", num_envs=4).start() as srv:
        with api.connect(srv.bound_url, timeout=TIMEOUT) as client:
            assert client.num_envs == 4
            assert client.reset(seed=1).observation.shape == (4, 612)
            result = client.step(np.array([1, 2, 3, 4]))
            assert result.observation.shape == (4, 612)
            assert list(result.observation[:, 0]) == [1, 2, 3, 4]
            assert list(result.reward) == pytest.approx([0.25, 0.5, 0.75, 1.0])
            resp_type, body = client.channel.request(IDS.STEP_REQ, b"\x00" * 4)  # 1-env only
            assert resp_type == IDS.ERROR and error_code(bytes(body)) == ErrorCode.BAD_BATCH
            with pytest.raises(ValueError):
                client.step([1, 2])
            assert list(client.step([5, 6, 7, 8]).observation[:, 0]) == [5, 6, 7, 8]


def test_bad_batch_is_422_and_kept() -> None:
    with api.Server(EchoEnv, "http://127.0.0.1:0", num_envs=4).start() as srv:
        status, headers, body = post(
            srv.bound_url, "step", b"\x00" * 4, {"X-Transport-Fingerprint": FP}
        )
        assert status == 422
        assert headers["x-transport-error"] == str(ErrorCode.BAD_BATCH)
        assert error_code(body) == ErrorCode.BAD_BATCH


def test_wrong_fingerprint_names_both(server: api.Server) -> None:
    text = (
        (ROOT / "schema" / "pac_env.toml")
        .read_text()
        .replace('"rank"', '"rank_other"')
        .replace('shm = "pac_shm"', "")
    )
    other = Schema(compile_schema(text))
    assert other.fingerprint != pac_env.SCHEMA.fingerprint
    with pytest.raises(FingerprintMismatchError) as info:
        api.connect(server.bound_url, schema=other, timeout=TIMEOUT)
    message = str(info.value)
    assert FP in message and f"{other.fingerprint:016x}" in message
    # raw: 409 with the ERROR body, and the connection is closed
    sock = raw_connect(server.bound_url)
    with sock:
        sock.sendall(
            b"POST /v1/health HTTP/1.1\r\nHost: x\r\nX-Transport-Fingerprint: 0123456789abcdef\r\n"
            b"Content-Length: 0\r\n\r\n"
        )
        status, headers, body = read_response(sock)
        assert status == 409
        assert headers["x-transport-error"] == str(ErrorCode.FINGERPRINT_MISMATCH)
        assert error_code(body) == ErrorCode.FINGERPRINT_MISMATCH
        assert b"0123456789abcdef" in body and FP.encode() in body
        assert closed_by_peer(sock)


def test_statuses_for_bad_requests(server: api.Server) -> None:
    url = server.bound_url
    fp = {"X-Transport-Fingerprint": FP}
    status, headers, body = post(url, "nope", b"", fp)
    assert status == 404 and error_code(body) == ErrorCode.UNKNOWN_MESSAGE
    status, headers, body = post(url, "health")  # no fingerprint header
    assert status == 400 and headers["x-transport-error"] == str(ErrorCode.HELLO_REQUIRED)
    status, headers, body = post(url, "health", b"", {"X-Transport-Fingerprint": "xyz"})
    assert status == 400 and error_code(body) == ErrorCode.BAD_FRAME
    status, headers, body = post(url, "spaces", b"123", fp)
    assert status == 400 and error_code(body) == ErrorCode.BAD_BODY_SIZE
    # a request with the right header on a fresh connection works without a hello
    status, headers, body = post(url, "spaces", b"", fp)
    assert status == 200
    assert headers["content-type"] == "application/octet-stream"
    assert headers["x-transport-msg-type"] == str(IDS.SPACES_RESP)
    assert struct.unpack("<ii", body) == (612, 92)
    # not POST: 405, connection kept
    host, port = host_port(url)
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    try:
        conn.request("GET", "/v1/health", headers=fp)
        resp = conn.getresponse()
        assert resp.status == 405 and resp.getheader("Allow") == "POST"
        resp.read()
        conn.request("POST", "/v1/health", headers=fp)
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read() == b"\x01"
    finally:
        conn.close()


def test_body_over_maximum_is_413_without_reading() -> None:
    with api.Server(EchoEnv, "http://127.0.0.1:0", max_body=1024).start() as srv:
        sock = raw_connect(srv.bound_url)
        with sock:
            # the head announces 1 GB and no body follows: the answer must not wait for it
            sock.sendall(
                f"POST /v1/step_batch HTTP/1.1\r\nHost: x\r\nX-Transport-Fingerprint: {FP}\r\n"
                f"Content-Length: {1 << 30}\r\n\r\n".encode()
            )
            status, headers, body = read_response(sock)
            assert status == 413
            assert headers["x-transport-error"] == str(ErrorCode.BODY_TOO_LARGE)
            assert headers.get("connection") == "close"
            assert error_code(body) == ErrorCode.BODY_TOO_LARGE
            assert closed_by_peer(sock)
        # through the client channel: a body over the server's maximum is a typed error
        with api.connect(srv.bound_url, timeout=TIMEOUT) as client:
            resp_type, resp = client.channel.request(IDS.STEP_BATCH_REQ, bytes(4096))
            assert resp_type == IDS.ERROR and error_code(bytes(resp)) == ErrorCode.BODY_TOO_LARGE
            with pytest.raises(PeerGoneError):  # Connection: close is honoured, no reconnect
                client.health()
        # a response over the client's maximum is refused before its body is read
        with api.connect(srv.bound_url, timeout=TIMEOUT, max_body=1024) as client:
            with pytest.raises(BadFrameError):
                client.reset()


def test_garbage_is_400_and_others_keep_being_served(server: api.Server) -> None:
    with api.connect(server.bound_url, timeout=TIMEOUT) as good:
        good.reset()
        garbage = raw_connect(server.bound_url)
        with garbage:
            garbage.sendall(b"\x00\x01\x02\xffgarbage that is no request")  # no CRLF at all
            status, _, body = read_response(garbage)
            assert status == 400 and error_code(body) == ErrorCode.BAD_FRAME
            assert closed_by_peer(garbage)
        assert good.step(7).observation[0] == 7
        bad_line = raw_connect(server.bound_url)
        with bad_line:
            bad_line.sendall(b"POST /v1/step SMTP/9\r\n\r\n")
            assert read_response(bad_line)[0] == 400
            assert closed_by_peer(bad_line)
        huge = raw_connect(server.bound_url)
        with huge:
            huge.sendall(b"POST /v1/step HTTP/1.1\r\nX-Long: " + b"a" * (64 << 10) + b"\r\n\r\n")
            assert read_response(huge)[0] == 400
        chunked = raw_connect(server.bound_url)
        with chunked:
            chunked.sendall(
                b"POST /v1/step HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
            )
            assert read_response(chunked)[0] == 400
        assert good.step(8).observation[0] == 8
        with api.connect(server.bound_url, timeout=TIMEOUT) as other:
            assert other.health()


def test_keep_alive_and_pipelining(server: api.Server) -> None:
    sock = raw_connect(server.bound_url)
    with sock:
        request = (
            f"POST /v1/health HTTP/1.1\r\nHost: x\r\nX-Transport-Fingerprint: {FP}\r\n"
            "Content-Length: 0\r\n\r\n"
        ).encode()
        sock.sendall(request * 3)  # three pipelined requests in one segment
        for _ in range(3):
            status, _, body = read_response(sock)
            assert status == 200 and body == b"\x01"
        sock.sendall(request)
        assert read_response(sock)[0] == 200


def test_json_rendering_for_curl(server: api.Server) -> None:
    url = server.bound_url
    fp = {"X-Transport-Fingerprint": FP, "Accept": "application/json"}
    status, headers, body = post(url, "reset", b"", fp)
    assert status == 200 and headers["content-type"] == "application/json"
    data = json.loads(body)
    assert data["message"] == "RESET_RESP"
    assert len(data["result"]["observation"]) == 612
    assert data["result"]["action_mask"] == [1] * 92
    status, headers, body = post(url, "hello", b"", fp)
    data = json.loads(body)
    assert data["fingerprint"] == FP and data["info"]["num_envs"] == 1
    # JSON request bodies too; a fresh connection per request: the header stands for HELLO
    host, port = host_port(url)
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    try:
        headers_json = {**fp, "Content-Type": "application/json"}
        conn.request("POST", "/v1/reset", headers=headers_json)
        conn.getresponse().read()
        conn.request("POST", "/v1/step", body=b'{"action": 5}', headers=headers_json)
        resp = conn.getresponse()
        data = json.loads(resp.read())
        assert resp.status == 200
        assert data["result"]["observation"][:2] == [5.0, 1.0]
        assert data["result"]["reward"] == 1.25
        conn.request("POST", "/v1/step", body=b'{"action": 500}', headers=headers_json)
        resp = conn.getresponse()
        data = json.loads(resp.read())
        assert resp.status == 422 and resp.getheader("X-Transport-Error") == "8"
        assert data["error"] == 8 and data["name"] == "INVALID_ACTION" and "500" in data["text"]
        conn.request("POST", "/v1/hello", headers=headers_json)  # curl -X POST, no body
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["fingerprint"] == FP
        conn.request("POST", "/v1/spaces", headers=fp)
        resp = conn.getresponse()
        assert json.loads(resp.read())["result"] == {"obs_n": 612, "act_n": 92}
    finally:
        conn.close()


def test_non_loopback_bind_refused() -> None:
    with pytest.raises(ConnectError, match="allow_remote"):
        api.Server(EchoEnv, "http://0.0.0.0:0")
    with pytest.raises(ConnectError, match="allow_remote"):
        api.Server(EchoEnv, "http://:0")
    sessions = EnvHost(pac_env.SCHEMA, EchoEnv)
    listener = http_backend.Listener("http://0.0.0.0:0", sessions, allow_remote=True)
    listener.start()
    try:
        assert not listener.url.endswith(":0")
    finally:
        listener.close()
    with api.Server(EchoEnv, "http://localhost:0").start() as srv:
        with api.connect(srv.bound_url, timeout=TIMEOUT) as client:
            assert client.health()


def test_bad_urls() -> None:
    with pytest.raises(ConnectError):
        api.connect("http://127.0.0.1", timeout=0.5)  # no port
    with pytest.raises(ConnectError):
        api.connect("http://127.0.0.1:1/some/path", timeout=0.5)


def test_nothing_listening_is_connect_error_after_retries() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(ConnectError):
        api.connect(f"http://127.0.0.1:{port}", timeout=0.4)
    assert time.monotonic() - started < 3.0


def test_silent_server_times_out() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        port = listening.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(TransportTimeoutError):
            api.connect(f"http://127.0.0.1:{port}", timeout=0.3)
        assert time.monotonic() - started < 3.0


def fake_server(reply: bytes) -> tuple[socket.socket, threading.Thread]:
    """Answers every request on one connection with ``reply`` (until the client closes)."""
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(1)

    def run() -> None:
        conn, _ = listening.accept()
        with conn:
            data = b""
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
                while b"\r\n\r\n" in data:
                    _, _, data = data.partition(b"\r\n\r\n")
                    conn.sendall(reply)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return listening, thread


def test_connection_close_is_honoured() -> None:
    reply = b"HTTP/1.1 200 OK\r\nX-Transport-Msg-Type: 10\r\nContent-Length: 1\r\n"
    reply += b"Connection: close\r\n\r\n\x01"
    listening, thread = fake_server(reply)
    with listening:
        url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        channel = http_backend.open_channel(url, timeout=TIMEOUT)
        try:
            resp_type, body = channel.request(IDS.HEALTH_REQ, b"")
            assert resp_type == IDS.HEALTH_RESP and bytes(body) == b"\x01"
            with pytest.raises(PeerGoneError, match="Connection: close"):
                channel.request(IDS.HEALTH_REQ, b"")
        finally:
            channel.close()
        thread.join(TIMEOUT)


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\nX-Transport-Msg-Type: 10\r\n\r\n",  # no Content-Length
        b"HTTP/1.1 200 OK\r\nBad Header\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"SPDY/3 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * (20 << 10) + b"\r\n\r\n",
    ],
)
def test_malformed_responses_are_protocol_errors(reply: bytes) -> None:
    from transport.errors import ProtocolError

    listening, thread = fake_server(reply)
    with listening:
        url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        channel = http_backend.open_channel(url, timeout=TIMEOUT)
        try:
            with pytest.raises(ProtocolError):
                channel.request(IDS.HEALTH_REQ, b"")
        finally:
            channel.close()
        thread.join(TIMEOUT)


def test_non_transport_error_status_is_typed() -> None:
    reply = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 5\r\n\r\noops!"
    listening, thread = fake_server(reply)
    with listening:
        url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        with pytest.raises(ConnectError, match="answered HTTP 502") as info:
            api.connect(url, timeout=TIMEOUT)
        assert "not a transport server" in str(info.value)
        thread.join(TIMEOUT)


def test_steady_state_steps_do_not_grow_memory(server: api.Server) -> None:
    with api.connect(server.bound_url, timeout=TIMEOUT) as client:
        client.reset()
        generation = client.channel.generation
        for i in range(500):  # warm-up: caches and views are built
            client.step(i % 92)
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot()
            for i in range(2000):
                client.step(i % 92)
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        growth = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
        assert growth < 16 << 10, f"memory grew by {growth} bytes over 2000 steps"
        assert client.channel.generation == generation


# -- a real server process -----------------------------------------------------------------------

SERVE = (
    "import sys; from transport.api import serve; from transport.envs.echo import EchoEnv; "
    "serve(EchoEnv, 'http://127.0.0.1:0', ready=lambda url: print('ready', url, flush=True))"
)


def test_expect_continue_gets_100_before_the_body() -> None:
    with api.Server(EchoEnv, "http://127.0.0.1:0", num_envs=4).start() as srv:
        sock = raw_connect(srv.bound_url)
        with sock:
            sock.sendall(
                f"POST /v1/reset HTTP/1.1\r\nHost: x\r\nX-Transport-Fingerprint: {FP}\r\n"
                "Content-Length: 0\r\n\r\n".encode()
            )
            assert read_response(sock)[0] == 200
            sock.sendall(
                f"POST /v1/step_batch HTTP/1.1\r\nHost: x\r\nX-Transport-Fingerprint: {FP}\r\n"
                "Expect: 100-continue\r\nContent-Length: 16\r\n\r\n".encode()
            )
            status, _, body = read_response(sock)
            assert status == 100 and body == b""
            sock.sendall(struct.pack("<4i", 1, 2, 3, 4))
            status, headers, body = read_response(sock)
            assert status == 200 and headers["x-transport-msg-type"] == str(IDS.STEP_BATCH_RESP)
            assert len(body) == 4 * pac_env.SCHEMA["StepResult"].size


def test_server_close_drops_connections_promptly() -> None:
    srv = api.Server(EchoEnv, "http://127.0.0.1:0").start()
    try:
        client = api.connect(srv.bound_url, timeout=TIMEOUT)
        client.reset()
        idle = raw_connect(srv.bound_url)  # an idle keep-alive connection too
    finally:
        started = time.monotonic()
        srv.close()
    assert time.monotonic() - started < 2.0
    with client, idle:
        with pytest.raises(PeerGoneError):
            client.step(1)
        assert closed_by_peer(idle)
    with pytest.raises(ConnectError):
        api.connect(srv.bound_url, timeout=0.3)
