"""zmq+ipc:// and zmq+tcp:// against real `transport-serve` processes and real ZeroMQ sockets.

Every server-side test runs against both server implementations (``lang`` is ``python`` or
``node``: pyzmq ROUTER or zeromq.js Router; Node cases skip when the Node server is not built).
Bad input from raw DEALER/REQ sockets, batches, dead and silent servers, stale replies,
pipelining, ipc socket files, port clashes, insecure binds, CURVE keys, and the 100-game pac
trace compared byte for byte with unix://. tests/test_zmq_node.py holds the Node-only part.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

import transport.api as api
from transport.backends import zmq as zmq_backend
from transport.errors import (
    ConnectError,
    PeerGoneError,
    RemoteError,
    TransportTimeoutError,
)
from transport.generated import pac_env
from transport.protocol import HEADER, ErrorCode, MessageIds, encode_hello

from .servers import (
    LANGS,
    ROOT,
    ServerProcess,
    free_port,
    require_lang,
    stop_process,
    unique_unix_url,
)
from .test_trace_equality import GAMES, play

IDS = MessageIds.from_schema(pac_env.SCHEMA.ir)
KINDS = ["ipc", "tcp"]
NODE_ZERO_COPY_THRESHOLD = 64 << 10  # node_bridge/src/backends/zmq.ts ZERO_COPY_THRESHOLD


def zmq_url(kind: str) -> str:
    if kind == "ipc":
        return f"zmq+ipc://{tempfile.gettempdir()}/transport-zmq-{uuid.uuid4().hex[:12]}.sock"
    return f"zmq+tcp://127.0.0.1:{free_port()}"


def ipc_path(url: str) -> str:
    return url.partition("://")[2].partition("?")[0]


def serve_command(url: str, lang: str) -> list[str]:
    """`transport-serve URL --env echo --lang LANG` (Node: serve_cli execs node in its place)."""
    return [sys.executable, "-m", "transport.tools.serve_cli", url, "--env", "echo", "--lang", lang]


def serve_once(
    url: str, lang: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the server to completion (for start failures)."""
    return subprocess.run(
        serve_command(url, lang), cwd=ROOT, capture_output=True, text=True, timeout=30, env=env
    )


class Raw:
    """A bare pyzmq socket speaking (or mangling) the protocol by hand."""

    def __init__(self, url: str, kind: int = zmq.DEALER) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.sock = self.ctx.socket(kind)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, 5000)
        self.sock.connect(zmq_backend.parse_url(url).endpoint)

    def send(self, *parts: bytes) -> None:
        self.sock.send_multipart(list(parts))

    def frame(self, msg_type: int, msg_id: int, body: bytes = b"") -> None:
        self.send(HEADER.pack(msg_type, msg_id, len(body)), body)

    def recv(self) -> tuple[int, int, bytes]:
        header, body = self.sock.recv_multipart()
        msg_type, msg_id, body_len = HEADER.unpack(header)
        assert body_len == len(body)
        return msg_type, msg_id, body

    def hello(self, msg_id: int = 100) -> None:
        self.frame(IDS.HELLO_REQ, msg_id, encode_hello(pac_env.FINGERPRINT))
        assert self.recv()[:2] == (IDS.HELLO_RESP, msg_id)

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def error_code(body: bytes) -> int:
    return int(struct.unpack_from("<H", body, 0)[0])


def assert_pac_traces_match_unix(lang: str) -> None:
    """100 pac games served by ``lang`` over zmq+ipc and zmq+tcp equal the Python unix:// ones."""
    require_lang(lang)
    with ServerProcess(unique_unix_url(), env="pac", lang="python") as proc:
        reference = play(proc.url)
    assert reference[1] > GAMES
    for kind in KINDS:
        with ServerProcess(zmq_url(kind), env="pac", lang=lang) as proc:
            assert play(proc.url) == reference, f"{lang} over zmq+{kind}"


@pytest.fixture(scope="module", params=LANGS)
def lang(request: pytest.FixtureRequest) -> str:
    require_lang(request.param)
    return str(request.param)


@pytest.fixture(scope="module", params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def server(lang: str, kind: str) -> Iterator[ServerProcess]:
    """One echo server per (language, kind) for the module's tests: each test talks to it over
    sockets and sessions of its own, and the bad-input test checks that others stay served."""
    with ServerProcess(zmq_url(kind), env="echo", lang=lang) as proc:
        yield proc
    if proc.url.startswith("zmq+ipc"):
        assert not os.path.exists(ipc_path(proc.url)), "server left its ipc socket file"


def test_round_trip_and_ipc_file_mode(server: ServerProcess, lang: str) -> None:
    if server.url.startswith("zmq+ipc"):
        assert stat.S_IMODE(os.stat(ipc_path(server.url)).st_mode) == 0o600
    with api.connect(server.url, timeout=5) as client:
        assert client.server_info["server"] == lang
        assert client.health()
        assert client.spaces().act_n == 92
        client.reset()
        result = client.step(7)
        assert result.observation[0] == 7.0 and result.reward == 1.75
        assert result.observation.ctypes.data % 16 == 0  # body at BODY_OFFSET: aligned views


def test_bad_input_gets_error_and_others_keep_being_served(server: ServerProcess) -> None:
    good = api.connect(server.url, timeout=5)
    good.reset()

    def still_served() -> None:
        assert good.step(3).observation[0] == 3.0

    raw = Raw(server.url)
    try:
        # garbage: one 64-byte part is no [header, body] frame
        raw.send(b"\xff" * 64)
        msg_type, msg_id, body = raw.recv()
        assert (msg_type, error_code(body)) == (IDS.ERROR, ErrorCode.BAD_FRAME)
        still_served()

        # garbage parts: a 3-byte header part
        raw.send(b"abc", b"def")
        msg_type, msg_id, body = raw.recv()
        assert (msg_type, msg_id, error_code(body)) == (IDS.ERROR, 0, ErrorCode.BAD_FRAME)

        # a header whose body_len disagrees with the body part
        raw.send(HEADER.pack(IDS.HELLO_REQ, 4, 12), b"\x00\x01")
        msg_type, msg_id, body = raw.recv()
        assert (msg_type, msg_id, error_code(body)) == (IDS.ERROR, 4, ErrorCode.BAD_FRAME)
        still_served()

        # a header announcing a body, and no body part
        raw.send(HEADER.pack(IDS.STEP_REQ, 11, 4))
        msg_type, msg_id, body = raw.recv()
        assert (msg_type, msg_id, error_code(body)) == (IDS.ERROR, 11, ErrorCode.BAD_FRAME)

        # body_len of 4 GiB - 1: refused from the header alone, msg_id echoed
        raw.send(HEADER.pack(IDS.STEP_REQ, 9, 0xFFFFFFFF), b"")
        msg_type, msg_id, body = raw.recv()
        assert (msg_type, msg_id, error_code(body)) == (IDS.ERROR, 9, ErrorCode.BODY_TOO_LARGE)
        still_served()

        # three parts
        raw.send(HEADER.pack(IDS.HEALTH_REQ, 6, 0), b"", b"extra")
        msg_type, msg_id, body = raw.recv()
        assert (msg_type, msg_id, error_code(body)) == (IDS.ERROR, 6, ErrorCode.BAD_FRAME)

        # unknown msg_type: ERROR, and the session is dropped (HELLO again)
        raw.hello()
        raw.frame(0x77, 5)
        msg_type, msg_id, body = raw.recv()
        assert (msg_type, msg_id, error_code(body)) == (IDS.ERROR, 5, ErrorCode.UNKNOWN_MESSAGE)
        raw.frame(IDS.HEALTH_REQ, 7)
        assert error_code(raw.recv()[2]) == ErrorCode.HELLO_REQUIRED
        still_served()

        # STEP before HELLO: ERROR, session kept; HELLO then works
        raw.frame(IDS.STEP_REQ, 1, struct.pack("<i", 0))
        msg_type, msg_id, body = raw.recv()
        assert (msg_type, msg_id, error_code(body)) == (IDS.ERROR, 1, ErrorCode.HELLO_REQUIRED)
        raw.hello(2)
        raw.frame(IDS.HEALTH_REQ, 3)
        assert raw.recv() == (IDS.HEALTH_RESP, 3, b"\x01")

        # wrong fingerprint: ERROR naming both, session dropped
        raw.frame(IDS.HELLO_REQ, 8, encode_hello(pac_env.FINGERPRINT ^ 1))
        msg_type, msg_id, body = raw.recv()
        assert (msg_type, msg_id, error_code(body)) == (
            IDS.ERROR,
            8,
            ErrorCode.FINGERPRINT_MISMATCH,
        )
        assert pac_env.FINGERPRINT_HEX in body.decode("utf-8", "replace")
        raw.frame(IDS.HEALTH_REQ, 10)
        assert error_code(raw.recv()[2]) == ErrorCode.HELLO_REQUIRED
        still_served()
    finally:
        raw.close()

    # wrong body size for STEP_REQ, and a large (zero-copy) wrong body: ERROR, session kept
    with api.connect(server.url, timeout=5) as other:
        other.reset()
        resp_type, view = other.channel.request(IDS.STEP_REQ, b"\x00\x00")
        assert (resp_type, error_code(bytes(view))) == (IDS.ERROR, ErrorCode.BAD_BODY_SIZE)
        big = bytes(zmq_backend.ZERO_COPY_THRESHOLD + 4)
        resp_type, view = other.channel.request(IDS.STEP_BATCH_REQ, big)
        assert (resp_type, error_code(bytes(view))) == (IDS.ERROR, ErrorCode.BAD_BATCH)
        assert other.step(2).observation[0] == 2.0
    still_served()
    good.close()


def test_req_socket_clients_work(server: ServerProcess) -> None:
    raw = Raw(server.url, zmq.REQ)
    try:
        raw.frame(IDS.HELLO_REQ, 1, encode_hello(pac_env.FINGERPRINT))
        assert raw.recv()[:2] == (IDS.HELLO_RESP, 1)
        raw.frame(IDS.SPACES_REQ, 2)
        msg_type, msg_id, body = raw.recv()
        assert (msg_type, msg_id) == (IDS.SPACES_RESP, 2)
        assert struct.unpack("<ii", body) == (612, 92)
    finally:
        raw.close()


def test_second_hello_starts_a_fresh_session(server: ServerProcess) -> None:
    with api.connect(server.url, timeout=5) as client:
        client.reset()
        client.step(1)
        resp_type, _ = client.channel.request(IDS.HELLO_REQ, encode_hello(pac_env.FINGERPRINT))
        assert resp_type == IDS.HELLO_RESP
        with pytest.raises(RemoteError) as info:
            client.step(1)
        assert info.value.code == ErrorCode.NOT_RESET


def test_pipelined_requests_are_answered_in_order(server: ServerProcess) -> None:
    with api.connect(server.url, timeout=5) as client:
        client.reset()
        channel = client.channel
        assert isinstance(channel, zmq_backend.ZmqChannel)
        actions = (4, 5, 6, 7, 8, 9)
        ids = [channel.send_request(IDS.STEP_REQ, struct.pack("<i", a)) for a in actions]
        # every reply keeps its own bytes although the server answered from one session buffer
        for msg_id, action in zip(ids, actions, strict=True):
            resp_type, body = channel.recv_response(msg_id, time.monotonic() + 5)
            assert resp_type == IDS.STEP_RESP
            assert struct.unpack_from("<f", body, 0)[0] == float(action)
        ids = [channel.send_request(IDS.STEP_REQ, struct.pack("<i", a)) for a in (4, 5, 6)]
        first = channel.recv_response(ids[0], time.monotonic() + 5)
        assert first[0] == IDS.STEP_RESP
        # awaiting the last one discards the reply to the middle request
        resp_type, _ = channel.recv_response(ids[2], time.monotonic() + 5)
        assert resp_type == IDS.STEP_RESP
        ids = [channel.send_request(IDS.STEP_REQ, struct.pack("<i", a)) for a in (4, 5, 6)]
        resp_type, _ = channel.recv_response(ids[2], time.monotonic() + 5)  # discards 4 and 5
        assert resp_type == IDS.STEP_RESP
        assert client.step(8).observation[0] == 8.0


def test_large_batches_take_the_zero_copy_path(lang: str) -> None:
    url = zmq_url("ipc")
    envs = zmq_backend.ZERO_COPY_THRESHOLD // 2557 + 1  # above both sides' thresholds
    assert envs * 2557 >= NODE_ZERO_COPY_THRESHOLD
    with ServerProcess(url, env="echo", lang=lang, num_envs=envs) as proc:
        with api.connect(proc.url, timeout=10) as client:
            client.reset()
            channel = client.channel
            assert isinstance(channel, zmq_backend.ZmqChannel)
            # pipelined zero-copy replies: each must keep its own bytes (the session detaches)
            body = bytearray(4 * envs)
            ids = []
            for action in (1, 2, 3):
                struct.pack_into(f"<{envs}i", body, 0, *([action] * envs))
                ids.append(channel.send_request(IDS.STEP_BATCH_REQ, bytes(body)))
            for msg_id, action in zip(ids, (1, 2, 3), strict=True):
                resp_type, resp = channel.recv_response(msg_id, time.monotonic() + 10)
                assert resp_type == IDS.STEP_BATCH_RESP and len(resp) == envs * 2557
                obs0 = [struct.unpack_from("<f", resp, i * 2557)[0] for i in range(envs)]
                assert obs0 == [float(action)] * envs
            for action in (4, 5, 6):  # zero-copy replies in turn reuse the client's buffer
                result = client.step([action] * envs)
                assert result.observation.shape == (envs, 612)
                assert (result.observation[:, 0] == action).all()
            assert len(channel.buffer) >= 16 + envs * 2557


def test_body_over_the_maximum_disconnects_the_sender(lang: str) -> None:
    extra = ["--max-body", "4096"]
    with ServerProcess(zmq_url("ipc"), env="echo", lang=lang, extra=extra) as proc:
        client = api.connect(proc.url, timeout=3)
        client.reset()
        with pytest.raises(PeerGoneError):
            client.channel.request(IDS.STEP_BATCH_REQ, bytes(8192))
        # the DEALER reconnects by itself (same routing id: same session)
        deadline = time.monotonic() + 5
        while True:
            try:
                assert client.step(4).observation[0] == 4.0
                break
            except (PeerGoneError, TransportTimeoutError):
                assert time.monotonic() < deadline
        client.close()


def test_silent_server_times_out_and_client_stays_usable(lang: str, kind: str) -> None:
    with ServerProcess(zmq_url(kind), env="echo", lang=lang) as proc:
        client = api.connect(proc.url, timeout=0.5)
        client.reset()
        stop_process(proc.proc.pid)
        try:
            started = time.monotonic()
            with pytest.raises(TransportTimeoutError):
                client.step(3)
            assert time.monotonic() - started < 2.0
        finally:
            os.kill(proc.proc.pid, signal.SIGCONT)
        # the late reply to step(3) arrives now and is discarded by msg_id
        channel = client.channel
        assert isinstance(channel, zmq_backend.ZmqChannel)
        channel.timeout = 5
        assert client.step(5).observation[0] == 5.0
        assert client.step(6).observation[0] == 6.0
        client.close()


def test_stopped_heartbeats_are_peer_gone_before_a_long_timeout(lang: str) -> None:
    url = zmq_url("tcp") + "?heartbeat=0.1"
    with ServerProcess(url, env="echo", lang=lang) as proc:
        client = api.connect(proc.url, timeout=20)
        client.reset()
        stop_process(proc.proc.pid)
        try:
            started = time.monotonic()
            with pytest.raises(PeerGoneError):
                client.step(3)
            assert time.monotonic() - started < 5.0
        finally:
            os.kill(proc.proc.pid, signal.SIGCONT)
        client.close()


def test_stale_ipc_file_replaced_live_one_never_stolen(lang: str) -> None:
    url = zmq_url("ipc")
    path = ipc_path(url)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()  # the file stays, nothing listens: a dead server's leftover
    with ServerProcess(url, env="echo", lang=lang) as live:
        # a second server of the same language, and a Python one, never takes the live file
        for second_lang in dict.fromkeys([lang, "python"]):
            second = serve_once(url, second_lang)
            assert second.returncode != 0
            assert "in use by a live server" in second.stderr, second_lang
        with api.connect(live.url, timeout=5) as client:
            assert client.health()
    assert not os.path.exists(path)


def test_tcp_port_in_use_fails_clearly(lang: str) -> None:
    with ServerProcess(zmq_url("tcp"), env="echo", lang=lang) as live:
        second = serve_once(live.url, lang)
        assert second.returncode != 0
        assert "EADDRINUSE" in second.stderr
        with api.connect(live.url, timeout=5) as client:
            assert client.health()


def test_port_zero_reports_the_bound_port(lang: str) -> None:
    with ServerProcess("zmq+tcp://127.0.0.1:0", env="echo", lang=lang) as proc:
        assert not proc.url.endswith(":0")
        with api.connect(proc.url, timeout=5) as client:
            assert client.health()


def test_non_loopback_bind_needs_keys_or_explicit_consent(lang: str) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSPORT_ZMQ_")}
    refused = serve_once(f"zmq+tcp://0.0.0.0:{port}", lang, env=env)
    assert refused.returncode != 0 and "allow_insecure" in refused.stderr
    with ServerProcess(f"zmq+tcp://0.0.0.0:{port}?allow_insecure=1", env="echo", lang=lang):
        with api.connect(f"zmq+tcp://127.0.0.1:{port}", timeout=5) as client:
            assert client.health()


def test_bad_urls_fail_to_start(lang: str) -> None:
    for url in (
        "zmq+tcp://127.0.0.1",
        "zmq+tcp://127.0.0.1:http",
        "zmq+tcp://127.0.0.1:5000?bogus=1",
        "zmq+ipc:///tmp/x?server_key=/nope",
    ):
        done = serve_once(url, lang)
        assert done.returncode == 1, (url, done.stderr)
        assert "transport-serve: error:" in done.stderr


def test_serve_help_shows_zmq_urls_and_curve() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "transport.tools.serve_cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    for text in ("zmq+ipc://", "zmq+tcp://", "CURVE", "allow_insecure", "keygen"):
        assert text in done.stdout, text


# -- client side only (no server process, or an in-process Python api.Server) ------------------


def test_client_retries_connect_until_the_server_is_up() -> None:
    # python-only: the server starts late in this process (api.Server), there is no Node one
    from transport.envs.echo import EchoEnv

    url = zmq_url("ipc")
    server = api.Server(EchoEnv, url)
    timer = threading.Timer(0.3, server.start)
    timer.start()
    try:
        with api.connect(url, timeout=5) as client:
            assert client.health()
    finally:
        timer.join()
        server.close()
    assert not os.path.exists(ipc_path(url))


def test_nothing_listening_is_connect_error() -> None:
    with pytest.raises(ConnectError):
        api.connect(zmq_url("ipc"), timeout=0.3)


def test_bad_urls_are_connect_errors() -> None:
    for url in (
        "zmq+tcp://127.0.0.1",
        "zmq+tcp://127.0.0.1:http",
        "zmq+ipc://",
        "zmq+tcp://127.0.0.1:5000?bogus=1",
        "zmq+ipc:///tmp/x?server_key=/nope",
    ):
        with pytest.raises(ConnectError):
            api.connect(url, timeout=0.2)


# -- CURVE ----------------------------------------------------------------------------------------


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "transport.backends.zmq", "keygen", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert '"public_key"' in done.stdout
    assert stat.S_IMODE(os.stat(tmp_path / "server.key_secret").st_mode) == 0o600
    subprocess.run(
        [
            sys.executable,
            "-m",
            "transport.backends.zmq",
            "keygen",
            str(tmp_path),
            "--name",
            "other",
        ],
        check=True,
        timeout=30,
        capture_output=True,
    )
    clients = tmp_path / "clients"
    clients.mkdir()
    (clients / "client.key").write_text((tmp_path / "client.key").read_text())
    return tmp_path


def test_curve_admits_allowed_keys_only(keys: Path, lang: str) -> None:
    port = free_port()
    url = f"zmq+tcp://0.0.0.0:{port}?server_key={keys}/server.key_secret&clients={keys}/clients"
    with ServerProcess(url, env="echo", lang=lang):
        base = f"zmq+tcp://127.0.0.1:{port}?server_key={keys}/server.key"
        with api.connect(f"{base}&client_key={keys}/client.key_secret", timeout=5) as client:
            client.reset()
            assert client.step(9).observation[0] == 9.0
        with pytest.raises(ConnectError, match="refused this client's CURVE key"):
            api.connect(f"{base}&client_key={keys}/other.key_secret", timeout=3)
        with pytest.raises(ConnectError):  # no keys at all: the handshake never completes
            api.connect(f"zmq+tcp://127.0.0.1:{port}", timeout=1)
        with pytest.raises(ConnectError, match="own key pair"):
            api.connect(base, timeout=1)
        # the admitted client still works after the refusals
        with api.connect(f"{base}&client_key={keys}/client.key_secret", timeout=5) as client:
            assert client.health()


def test_curve_keys_from_environment_variables(
    keys: Path, lang: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import zmq.auth

    server_public, server_secret = zmq.auth.load_certificate(keys / "server.key_secret")
    client_public, client_secret = zmq.auth.load_certificate(keys / "client.key_secret")
    _, other_secret = zmq.auth.load_certificate(keys / "other.key_secret")
    assert server_secret is not None and client_secret is not None and other_secret is not None
    port = free_port()
    env = {
        **os.environ,
        zmq_backend.ENV_SERVER_SECRET: server_secret.decode(),  # public key derived
        zmq_backend.ENV_ALLOWED_CLIENTS: client_public.decode(),
    }
    proc = subprocess.Popen(
        serve_command(f"zmq+tcp://0.0.0.0:{port}", lang),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ready "), proc.stderr.read() if proc.stderr else line
        monkeypatch.setenv(zmq_backend.ENV_SERVER_PUBLIC, server_public.decode())
        monkeypatch.setenv(zmq_backend.ENV_CLIENT_SECRET, client_secret.decode())
        with api.connect(f"zmq+tcp://127.0.0.1:{port}", timeout=5) as client:
            assert client.health()
        monkeypatch.setenv(zmq_backend.ENV_CLIENT_SECRET, other_secret.decode())
        with pytest.raises(ConnectError, match="refused"):
            api.connect(f"zmq+tcp://127.0.0.1:{port}", timeout=3)
    finally:
        proc.terminate()
        proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


# -- trace equality -------------------------------------------------------------------------------


@pytest.mark.slow
def test_pac_traces_identical_over_zmq_and_unix() -> None:
    assert_pac_traces_match_unix("python")
