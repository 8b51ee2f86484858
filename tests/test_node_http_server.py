"""http:// against a real Node server process (node_bridge/dist/cli/serve.js via transport-serve).

The key checks of tests/test_http_backend.py, run against `transport-serve URL --lang node`:
round trips, batches, fingerprint mismatch (409 naming both), out-of-range actions (422, client
still usable), 413 before the body is read, garbage (400, others served), keep-alive and
pipelining, JSON rendering for curl, and a SIGKILLed server as PeerGoneError in bounded time.
"""

from __future__ import annotations

import http.client
import json
import socket
import struct
from collections.abc import Iterator

import numpy as np
import pytest

import transport.api as api
from transport.backends import http as http_backend
from transport.codec import Schema
from transport.errors import (
    BadFrameError,
    FingerprintMismatchError,
    PeerGoneError,
    RemoteError,
)
from transport.generated import pac_env
from transport.protocol import ErrorCode, MessageIds
from transport.schema import compile_schema

from .servers import ROOT, ServerProcess, require_lang

IDS = MessageIds.from_schema(pac_env.SCHEMA.ir)
FP = f"{pac_env.SCHEMA.fingerprint:016x}"
TIMEOUT = 5.0
URL = "http://127.0.0.1:0"


def node_server(**kwargs: object) -> ServerProcess:
    require_lang("node")
    return ServerProcess(URL, lang="node", **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    with node_server(env="echo") as proc:
        yield proc


def host_port(url: str) -> tuple[str, int]:
    address = http_backend.parse_url(url)
    return address.host, address.port


def raw_connect(url: str) -> socket.socket:
    return socket.create_connection(host_port(url), timeout=TIMEOUT)


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


def test_round_trip_echo(server: ServerProcess) -> None:
    assert server.url.startswith("http://127.0.0.1:") and not server.url.endswith(":0")
    with api.connect(server.url, timeout=TIMEOUT) as client:
        info = client.server_info
        assert (info["num_envs"], info["env"], info["server"]) == (1, "echo", "node")
        assert client.health()
        spaces = client.spaces()
        assert (spaces.obs_n, spaces.act_n) == (612, 92)
        first = client.reset(seed=3)
        assert first.observation.shape == (612,) and first.action_mask.all()
        for step in range(1, 6):
            result = client.step(step)
            assert result.observation[0] == step and result.observation[1] == step
            assert result.reward == pytest.approx(step / 4)
        assert client.reset().observation[1] == 0


def test_batched_server_step_batch() -> None:
    with node_server(env="echo", num_envs=4) as srv:
        with api.connect(srv.url, timeout=TIMEOUT) as client:
            assert client.num_envs == 4
            assert client.reset(seed=1).observation.shape == (4, 612)
            result = client.step(np.array([1, 2, 3, 4]))
            assert list(result.observation[:, 0]) == [1, 2, 3, 4]
            assert list(result.reward) == pytest.approx([0.25, 0.5, 0.75, 1.0])
            resp_type, body = client.channel.request(IDS.STEP_REQ, b"\x00" * 4)  # 1-env only
            assert resp_type == IDS.ERROR and error_code(bytes(body)) == ErrorCode.BAD_BATCH
            assert list(client.step([5, 6, 7, 8]).observation[:, 0]) == [5, 6, 7, 8]
        status, headers, body = post(srv.url, "step", b"\x00" * 4, {"X-Transport-Fingerprint": FP})
        assert status == 422 and headers["x-transport-error"] == str(ErrorCode.BAD_BATCH)
        assert error_code(body) == ErrorCode.BAD_BATCH


def test_wrong_fingerprint_is_409_naming_both(server: ServerProcess) -> None:
    text = (
        (ROOT / "schema" / "pac_env.toml")
        .read_text()
        .replace('"rank"', '"rank_other"')
        .replace('shm = "pac_shm"', "")
    )
    other = Schema(compile_schema(text))
    with pytest.raises(FingerprintMismatchError) as info:
        api.connect(server.url, schema=other, timeout=TIMEOUT)
    message = str(info.value)
    assert FP in message and f"{other.fingerprint:016x}" in message
    sock = raw_connect(server.url)
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


def test_out_of_range_action_is_422_and_client_stays_usable(server: ServerProcess) -> None:
    with api.connect(server.url, timeout=TIMEOUT) as client:
        with pytest.raises(RemoteError) as not_reset:
            client.step(1)
        assert not_reset.value.code == ErrorCode.NOT_RESET
        client.reset()
        with pytest.raises(RemoteError) as info:
            client.step(92)
        assert info.value.code == ErrorCode.INVALID_ACTION and "92" in info.value.text
        assert client.step(91).observation[0] == 91.0
        with pytest.raises(RemoteError) as negative:
            client.step(-1)
        assert negative.value.code == ErrorCode.INVALID_ACTION
        assert client.health()
    status, _headers, body = post(
        server.url, "step", struct.pack("<i", 92), {"X-Transport-Fingerprint": FP}
    )
    assert status == 422 and error_code(body) == ErrorCode.NOT_RESET  # fresh connection


def test_statuses_for_bad_requests(server: ServerProcess) -> None:
    url = server.url
    fp = {"X-Transport-Fingerprint": FP}
    status, _, body = post(url, "nope", b"", fp)
    assert status == 404 and error_code(body) == ErrorCode.UNKNOWN_MESSAGE
    status, headers, _ = post(url, "health")
    assert status == 400 and headers["x-transport-error"] == str(ErrorCode.HELLO_REQUIRED)
    status, _, body = post(url, "health", b"", {"X-Transport-Fingerprint": "xyz"})
    assert status == 400 and error_code(body) == ErrorCode.BAD_FRAME
    status, _, body = post(url, "spaces", b"123", fp)
    assert status == 400 and error_code(body) == ErrorCode.BAD_BODY_SIZE
    status, headers, body = post(url, "spaces", b"", fp)  # the header stands for the hello
    assert status == 200 and headers["content-type"] == "application/octet-stream"
    assert headers["x-transport-msg-type"] == str(IDS.SPACES_RESP)
    assert struct.unpack("<ii", body) == (612, 92)
    host, port = host_port(url)
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    try:
        conn.request("GET", "/v1/health", headers=fp)
        resp = conn.getresponse()
        assert resp.status == 405 and resp.getheader("Allow") == "POST"
        resp.read()
        conn.request("POST", "/v1/health", headers=fp)  # the connection was kept
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read() == b"\x01"
    finally:
        conn.close()


def test_body_over_maximum_is_413_before_the_body_is_read() -> None:
    with node_server(env="echo", extra=["--max-body", "1024"]) as srv:
        sock = raw_connect(srv.url)
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
        with api.connect(srv.url, timeout=TIMEOUT) as client:
            resp_type, resp = client.channel.request(IDS.STEP_BATCH_REQ, bytes(4096))
            assert resp_type == IDS.ERROR and error_code(bytes(resp)) == ErrorCode.BODY_TOO_LARGE
            with pytest.raises(PeerGoneError):  # Connection: close is honoured
                client.health()
        with api.connect(srv.url, timeout=TIMEOUT, max_body=1024) as client:
            with pytest.raises(BadFrameError):  # a response over the client's maximum
                client.reset()


def test_garbage_is_400_and_others_keep_being_served(server: ServerProcess) -> None:
    with api.connect(server.url, timeout=TIMEOUT) as good:
        good.reset()
        garbage = raw_connect(server.url)
        with garbage:
            garbage.sendall(b"\x00\x01\x02\xffgarbage that is no request")
            status, _, body = read_response(garbage)
            assert status == 400 and error_code(body) == ErrorCode.BAD_FRAME
            assert closed_by_peer(garbage)
        assert good.step(7).observation[0] == 7
        bad_line = raw_connect(server.url)
        with bad_line:
            bad_line.sendall(b"POST /v1/step SMTP/9\r\n\r\n")
            assert read_response(bad_line)[0] == 400
            assert closed_by_peer(bad_line)
        huge = raw_connect(server.url)
        with huge:
            huge.sendall(b"POST /v1/step HTTP/1.1\r\nX-Long: " + b"a" * (64 << 10) + b"\r\n\r\n")
            assert read_response(huge)[0] == 400
        chunked = raw_connect(server.url)
        with chunked:
            chunked.sendall(
                b"POST /v1/step HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
            )
            assert read_response(chunked)[0] == 400
        assert good.step(8).observation[0] == 8
        with api.connect(server.url, timeout=TIMEOUT) as other:
            assert other.health()


def test_keep_alive_and_pipelining(server: ServerProcess) -> None:
    sock = raw_connect(server.url)
    with sock:
        request = (
            f"POST /v1/health HTTP/1.1\r\nHost: x\r\nX-Transport-Fingerprint: {FP}\r\n"
            "Content-Length: 0\r\n\r\n"
        ).encode()
        sock.sendall(request * 3)
        for _ in range(3):
            status, _, body = read_response(sock)
            assert status == 200 and body == b"\x01"
        sock.sendall(request)
        assert read_response(sock)[0] == 200


def test_pipelined_steps_keep_their_own_results() -> None:
    """Responses still being written must not be overwritten by the next request's results."""
    with node_server(env="echo") as srv:
        sock = raw_connect(srv.url)
        with sock:
            head = f"Host: x\r\nX-Transport-Fingerprint: {FP}\r\n"
            reset = f"POST /v1/reset HTTP/1.1\r\n{head}Content-Length: 0\r\n\r\n".encode()
            steps = b"".join(
                f"POST /v1/step HTTP/1.1\r\n{head}Content-Length: 4\r\n\r\n".encode()
                + struct.pack("<i", a)
                for a in range(1, 60)
            )
            sock.sendall(reset + steps)
            assert read_response(sock)[0] == 200
            for a in range(1, 60):
                status, _, body = read_response(sock)
                assert status == 200
                assert struct.unpack_from("<2f", body, 0) == (float(a), float(a))


def test_json_rendering_for_curl(server: ServerProcess) -> None:
    url = server.url
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
    assert data["info"]["server"] == "node" and data["protocol_version"] == "1.0"
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
        conn.request("POST", "/v1/step", body=b'{"nope": 1}', headers=headers_json)
        resp = conn.getresponse()
        assert resp.status == 400 and json.loads(resp.read())["error"] == 3
        conn.request("POST", "/v1/hello", headers=headers_json)  # curl -X POST, no body
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["fingerprint"] == FP
        conn.request("POST", "/v1/spaces", headers=fp)
        resp = conn.getresponse()
        assert json.loads(resp.read())["result"] == {"obs_n": 612, "act_n": 92}
    finally:
        conn.close()


def test_non_loopback_bind_refused() -> None:
    require_lang("node")
    with pytest.raises(RuntimeError, match="allow_remote"):
        ServerProcess("http://0.0.0.0:0", lang="node")
    with node_server(env="echo") as srv:  # localhost is loopback
        with api.connect(srv.url, timeout=TIMEOUT) as client:
            assert client.health()
