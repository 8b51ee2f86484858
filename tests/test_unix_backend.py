"""unix:// against real Python and Node server processes: bad input, dead peers, socket files."""

from __future__ import annotations

import os
import socket
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

import transport.api as api
from transport.generated import pac_env
from transport.protocol import HEADER, ErrorCode, MessageIds, encode_hello

from .servers import LANGS, ROOT, ServerProcess, require_lang, unique_unix_url

IDS = MessageIds.from_schema(pac_env.SCHEMA.ir)


def raw_connect(url: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(url.partition("://")[2])
    return sock


def read_frame(sock: socket.socket) -> tuple[int, int, bytes]:
    header = b""
    while len(header) < 9:
        chunk = sock.recv(9 - len(header))
        if not chunk:
            raise EOFError("closed")
        header += chunk
    msg_type, msg_id, body_len = HEADER.unpack(header)
    body = b""
    while len(body) < body_len:
        chunk = sock.recv(body_len - len(body))
        if not chunk:
            raise EOFError("closed mid-body")
        body += chunk
    return msg_type, msg_id, body


def error_code(body: bytes) -> int:
    return int(struct.unpack_from("<H", body, 0)[0])


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.fixture(params=LANGS)
def server(request: pytest.FixtureRequest) -> ServerProcess:
    with ServerProcess(unique_unix_url(), env="echo", lang=request.param) as proc:
        yield proc  # type: ignore[misc]


def test_socket_file_mode_and_round_trip(server: ServerProcess) -> None:
    path = server.url.partition("://")[2]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with api.connect(server.url, timeout=5) as client:
        assert client.health()
        assert client.spaces().act_n == 92
        client.reset()
        result = client.step(7)
        assert result.observation[0] == 7.0 and result.reward == 1.75


def test_bad_input_gets_error_and_others_keep_being_served(server: ServerProcess) -> None:
    good = api.connect(server.url, timeout=5)
    good.reset()

    def still_served() -> None:
        assert good.step(3).observation[0] == 3.0

    # garbage bytes: an impossible header -> ERROR, then the server closes
    sock = raw_connect(server.url)
    sock.sendall(b"\xff" * 64)
    msg_type, _, body = read_frame(sock)
    assert msg_type == IDS.ERROR and error_code(body) == ErrorCode.BODY_TOO_LARGE
    assert closed_by_peer(sock)
    sock.close()
    still_served()

    # a truncated frame, then close
    sock = raw_connect(server.url)
    sock.sendall(HEADER.pack(IDS.HELLO_REQ, 1, 12) + b"\x00\x01")
    sock.close()
    still_served()

    # body_len of 4 GiB - 1: refused before reading
    sock = raw_connect(server.url)
    sock.sendall(HEADER.pack(IDS.STEP_REQ, 9, 0xFFFFFFFF))
    msg_type, msg_id, body = read_frame(sock)
    assert (msg_type, msg_id, error_code(body)) == (IDS.ERROR, 9, ErrorCode.BODY_TOO_LARGE)
    sock.close()
    still_served()

    # unknown msg_type
    sock = raw_connect(server.url)
    sock.sendall(HEADER.pack(0x77, 5, 0))
    msg_type, msg_id, body = read_frame(sock)
    assert (msg_type, msg_id, error_code(body)) == (IDS.ERROR, 5, ErrorCode.UNKNOWN_MESSAGE)
    assert closed_by_peer(sock)
    sock.close()
    still_served()

    # STEP before HELLO: ERROR, connection kept; HELLO then works
    sock = raw_connect(server.url)
    sock.sendall(HEADER.pack(IDS.STEP_REQ, 1, 4) + struct.pack("<i", 0))
    msg_type, msg_id, body = read_frame(sock)
    assert (msg_type, msg_id, error_code(body)) == (IDS.ERROR, 1, ErrorCode.HELLO_REQUIRED)
    hello = encode_hello(pac_env.FINGERPRINT)
    sock.sendall(HEADER.pack(IDS.HELLO_REQ, 2, len(hello)) + hello)
    assert read_frame(sock)[0] == IDS.HELLO_RESP
    sock.close()
    still_served()

    # wrong body size for STEP_REQ: ERROR, connection kept
    with api.connect(server.url, timeout=5) as other:
        other.reset()
        resp_type, body = other.channel.request(IDS.STEP_REQ, b"\x00\x00")
        assert (resp_type, error_code(bytes(body))) == (IDS.ERROR, ErrorCode.BAD_BODY_SIZE)
        assert other.step(2).observation[0] == 2.0
    still_served()
    good.close()


@pytest.mark.parametrize("lang", LANGS)
def test_stale_socket_replaced_live_one_never_stolen(lang: str) -> None:
    require_lang(lang)
    url = unique_unix_url()
    path = url.partition("://")[2]
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()  # the file stays, nothing listens: a dead server's leftover
    with ServerProcess(url, env="echo", lang=lang) as live:
        second = subprocess.run(
            [sys.executable, "-m", "transport.tools.serve_cli", url, "--lang", lang],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert second.returncode != 0
        assert "in use" in second.stderr
        with api.connect(live.url, timeout=5) as client:
            assert client.health()


@pytest.mark.parametrize("backend", ["unix", "shm"])
def test_a_server_left_open_is_closed_at_interpreter_exit(backend: str) -> None:
    """transport.Server(...).start() without close(): the socket file or segment still goes."""
    name = f"atexit-{os.getpid()}"
    url = unique_unix_url() if backend == "unix" else f"shm://{name}"
    path = url.partition("://")[2] if backend == "unix" else f"/dev/shm/transport-{name}"
    script = (
        "import sys, transport\n"
        "from transport.envs import env_factory\n"
        "transport.Server(env_factory('echo'), sys.argv[1]).start()\n"
        "assert transport.connect(sys.argv[1], timeout=5).health()\n"
        "print('served', flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, url], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "served" in done.stdout, done.stderr
    assert not os.path.exists(path)


def test_client_retries_connect_until_the_server_is_up(tmp_path: Path) -> None:
    url = unique_unix_url()
    from transport.envs.echo import EchoEnv

    server = api.Server(EchoEnv, url)
    import threading

    threading.Timer(0.3, server.start).start()
    try:
        with api.connect(url, timeout=5) as client:
            assert client.health()
    finally:
        time.sleep(0.05)
        server.close()
