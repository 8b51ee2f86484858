"""Issue 17 item 7 (Python side): bad input is refused the same way on both sides.

Start-up limits (``check_server_limits``: the API raises ValueError, the CLI exits 2 naming the
numbers), the shm name pattern (``\\Z``: no trailing newline; a bad URL is a ConnectError, CLI
exit 1 as before) and the HELLO msgpack tail rules. The tables here are the ones
docs/decisions.md gives the Node side.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any

import msgpack
import pytest

import transport.api as api
from transport.backends.shm.region import parse_url
from transport.envs import env_schema
from transport.envs.echo import EchoEnv
from transport.errors import BadFrameError, ConnectError
from transport.generated import pac_env
from transport.protocol import HEADER, ErrorCode, MessageIds, decode_hello, encode_hello

from .servers import ROOT, ServerProcess, unique_unix_url

IDS = MessageIds.from_schema(pac_env.SCHEMA.ir)
PAC = env_schema("pac")

# (argv after the URL, the text stderr must hold); every row exits 2 before anything is created
CLI_REFUSED = [
    (["--max-body", "0"], "--max-body must be 1..4294967295 bytes, not 0"),
    (["--max-body", "-1"], "--max-body must be 1..4294967295 bytes, not -1"),
    (["--max-body", "4294967296"], "not 4294967296"),
    (["--num-envs", "0"], "--num-envs must be 1..65536, not 0"),
    (["--num-envs", "65537"], "--num-envs must be 1..65536, not 65537"),
    (["--num-envs", "30000"], "153540004 bytes, over 67108864"),
    (
        ["--num-envs", "2", "--max-body", "16"],
        "a HELLO request is 33 bytes; raise max_body to at least 33",
    ),
    (["--num-envs", "2", "--lang", "node", "--max-body", "0"], "not 0"),  # before exec
]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "transport.tools.serve_cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(("extra", "message"), CLI_REFUSED)
def test_cli_refuses_limits_at_start(extra: list[str], message: str) -> None:
    url = unique_unix_url()
    done = run_cli(url, "--env", "pac", *extra)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not os.path.exists(url.partition("://")[2])


def test_cli_refuses_an_shm_name_ending_in_a_newline() -> None:
    done = run_cli("shm://pyrobust-newline\n", "--env", "echo")
    assert done.returncode == 1, done.stderr  # a bad URL, as every other (Node: the same)
    assert "region name must be" in done.stderr
    assert not os.path.exists("/dev/shm/transport-pyrobust-newline\n")


@pytest.mark.parametrize(
    "name", ["name\n", "name\r", "na\nme", "-name", ".name", "", "a" * 202, "na me", "né"]
)
def test_shm_names_are_matched_whole(name: str) -> None:
    with pytest.raises(ConnectError, match="region name must be"):
        parse_url(f"shm://{name}")


def test_shm_names_accepted() -> None:
    for name in ("a", "A.b_c-9", "a" * 201):
        assert parse_url(f"shm://{name}").name == name


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"max_body": 0}, ValueError, "max_body must be 1..4294967295 bytes, not 0"),
        ({"max_body": -1}, ValueError, "not -1"),
        ({"num_envs": 0}, ValueError, "num_envs must be 1..65536, not 0"),
        ({"num_envs": 65537}, ValueError, "not 65537"),
        ({"num_envs": 30000}, ValueError, "153540004 bytes"),
        ({"num_envs": 30000, "max_body": 153540003}, ValueError, "153540004 bytes"),
    ],
)
def test_api_refuses_limits_at_start(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    url = unique_unix_url()
    with pytest.raises(error, match=message):
        api.Server(EchoEnv, url, schema=PAC, **kwargs)
    assert not os.path.exists(url.partition("://")[2])


def test_api_refuses_an_shm_name_ending_in_a_newline() -> None:
    with pytest.raises(ConnectError, match="region name must be"):
        api.Server(EchoEnv, "shm://pyrobust-newline\n", schema=PAC)


def test_limits_at_the_boundary_are_accepted() -> None:
    # the HELLO_REQ: 12 bytes + msgpack {"schema_name": "pac_env"} (21) = 33 > STEP_MULTI's 32
    api.check_server_limits(PAC, "unix:///x.sock", num_envs=1, max_body=33)
    api.check_server_limits(PAC, "unix:///x.sock", num_envs=30000, max_body=153540004)
    api.check_server_limits(PAC, "shm://x", num_envs=65536, max_body=1)  # no frames in shm
    with pytest.raises(
        ValueError, match="a HELLO request is 33 bytes; raise max_body to at least 33"
    ):
        api.check_server_limits(PAC, "unix:///x.sock", num_envs=1, max_body=32)


def test_cli_with_a_raised_max_body_starts_a_large_server() -> None:
    with ServerProcess(unique_unix_url(), extra=["--max-body", "1024"]) as server:
        with api.connect(server.url, timeout=10) as client:
            client.reset(seed=1)


# -- the HELLO msgpack tail ---------------------------------------------------------------------

HEAD = encode_hello(pac_env.FINGERPRINT)
TAIL_ACCEPTED: list[tuple[bytes, dict[str, Any] | None]] = [
    (b"", {}),
    (msgpack.packb({}), {}),
    (msgpack.packb({"a": 1, "b": [None, True, 1.5, b"x", {"c": "é"}]}), None),
    (b"\x81\xa1a" + b"\x91" * 30 + b"\x01", None),  # 32 levels: the map and 31 arrays
]
TAIL_REFUSED = [
    (b"\x81\x01\x01", "every key must be a string"),  # integer key
    (b"\x81\xc4\x01a\x01", "every key must be a string"),  # bin key
    (b"\x81\xc0\x01", "every key must be a string"),  # nil key
    (b"\x81\x80\x01", "every key must be a string"),  # map key
    (b"\x81\xa1a\xa1\xff", "not UTF-8"),  # invalid UTF-8 value
    (b"\x81\xa1\xff\x01", "not UTF-8"),  # invalid UTF-8 key
    (b"\x81\xa1a\xa3\xed\xa0\x80", "not UTF-8"),  # a UTF-16 surrogate is not UTF-8
    (b"\x82\xa1a\x01\xa1a\x02", "twice"),  # duplicate key
    (b"\x91\x01", "expected a map"),
    (b"\xc0", "expected a map"),
    (b"\x01", "expected a map"),
    (msgpack.packb({}) + b"\x00", "not one msgpack value"),  # bytes after the map
    (b"\x81\xa1a", "not one msgpack value"),  # truncated
    (b"\xc1", "not one msgpack value"),  # never-used byte
    (b"\x81\xa1a\xd4\x01\x00", "ext types are refused"),
    (b"\x81\xa1a\xd6\xff\x00\x00\x00\x01", "ext types are refused"),  # timestamp
    (b"\x81\xa1a" + b"\x91" * 32 + b"\x01", "deeper than 32"),
]


@pytest.mark.parametrize(("tail", "info"), TAIL_ACCEPTED)
def test_hello_tail_accepted(tail: bytes, info: dict[str, Any] | None) -> None:
    hello = decode_hello(HEAD + tail)
    if info is not None:
        assert hello.info == info


@pytest.mark.parametrize(("tail", "message"), TAIL_REFUSED)
def test_hello_tail_refused(tail: bytes, message: str) -> None:
    with pytest.raises(BadFrameError, match=message):
        decode_hello(HEAD + tail)


def read_frame(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while len(data) < HEADER.size:
        chunk = sock.recv(HEADER.size - len(data))
        assert chunk, "server closed"
        data += chunk
    msg_type, _, body_len = HEADER.unpack(data)
    body = b""
    while len(body) < body_len:
        chunk = sock.recv(body_len - len(body))
        assert chunk, "server closed mid-body"
        body += chunk
    return msg_type, body


def hello_over(path: str, tail: bytes) -> tuple[int, bytes]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    with sock:
        sock.connect(path)
        body = HEAD + tail
        sock.sendall(HEADER.pack(IDS.HELLO_REQ, 7, len(body)) + body)
        return read_frame(sock)


def test_a_real_server_refuses_bad_hello_tails_and_keeps_serving() -> None:
    with ServerProcess(unique_unix_url(), env="pac") as server:
        path = server.url.partition("://")[2]
        for tail, _ in TAIL_REFUSED[:8]:
            msg_type, resp = hello_over(path, tail)
            assert msg_type == IDS.ERROR
            assert int.from_bytes(resp[:2], "little") == ErrorCode.BAD_FRAME
        assert hello_over(path, msgpack.packb({"client": "test"}))[0] == IDS.HELLO_RESP
