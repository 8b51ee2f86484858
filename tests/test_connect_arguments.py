"""``transport.connect``'s arguments are checked before anything connects (the Node client
keeps the same rule), and a URL whose peer is not a transport server says so."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Iterator
from fractions import Fraction

import numpy as np
import pytest

import transport
from transport.client import MAX_TIMEOUT, check_timeout
from transport.errors import ConnectError, RemoteError

from .servers import ServerProcess, free_port, unique_unix_url


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(unique_unix_url(), env="echo") as proc:
        yield proc


@pytest.mark.parametrize("url", [None, 42, b"unix:///tmp/x.sock", ["unix:///tmp/x.sock"]])
def test_a_url_that_is_not_a_str_is_a_type_error(url: object) -> None:
    """Before: ``AttributeError: ... has no attribute 'partition'``."""
    with pytest.raises(TypeError, match=r"connect\(url=.*\): url must be a str, such as 'unix://"):
        transport.connect(url)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [0, 0.0, -1, -0.5, math.nan, -math.inf])
def test_a_timeout_that_is_not_above_zero_is_a_value_error(timeout: float) -> None:
    """Before: accepted, and every request then timed out at once."""
    with pytest.raises(ValueError, match=r"connect\(timeout=.*\): timeout must be > 0 seconds"):
        transport.connect(unique_unix_url(), timeout=timeout)


@pytest.mark.parametrize("timeout", ["5", b"5", True, False, [5], object()])
def test_a_timeout_that_is_not_a_number_is_a_type_error(timeout: object) -> None:
    """Before: a raw TypeError from deep inside (or, for True, a timeout of 1 s)."""
    with pytest.raises(TypeError, match=r"connect\(timeout=.*\): timeout is seconds, a number"):
        transport.connect(unique_unix_url(), timeout=timeout)  # type: ignore[arg-type]


def test_the_timeout_rule() -> None:
    assert MAX_TIMEOUT == 2147483.647
    assert check_timeout(None) is None
    assert check_timeout(math.inf) is None
    assert check_timeout(MAX_TIMEOUT) == MAX_TIMEOUT
    assert check_timeout(MAX_TIMEOUT + 0.001) is None
    assert check_timeout(1e12) is None
    assert check_timeout(2) == 2.0
    assert check_timeout(np.float32(0.5)) == 0.5
    assert check_timeout(np.int64(3)) == 3.0
    assert check_timeout(Fraction(1, 4)) == 0.25


@pytest.mark.parametrize("timeout", [None, math.inf, 1e12, MAX_TIMEOUT + 1])
def test_no_deadline_timeouts_connect_and_step(server: ServerProcess, timeout: float) -> None:
    """Before: ``OverflowError: timestamp out of range`` for 1e12."""
    with transport.connect(server.url, timeout=timeout) as client:
        assert client.channel.timeout is None  # type: ignore[attr-defined]
        client.reset(seed=1)
        assert float(np.asarray(client.step(3, copy=True).observation).flat[0]) == 3.0


def test_a_finite_timeout_is_kept(server: ServerProcess) -> None:
    with transport.connect(server.url, timeout=np.float64(7.5)) as client:
        assert client.channel.timeout == 7.5  # type: ignore[attr-defined]
        assert client.health()


def test_an_http_peer_that_is_not_a_transport_server_is_a_connect_error() -> None:
    """Before: ``RemoteError INTERNAL (13): HTTP 501 without an ERROR body: <!DOCTYPE HTML>``,
    an error the peer never sent."""
    port = free_port()
    peer = subprocess.Popen(
        [sys.executable, "-u", "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert peer.stdout is not None
        peer.stdout.readline()  # "Serving HTTP on 127.0.0.1 port ..."
        url = f"http://127.0.0.1:{port}"
        with pytest.raises(ConnectError) as caught:
            transport.connect(url, timeout=10)
        assert not isinstance(caught.value, RemoteError)
        text = str(caught.value)
        assert f"the peer at {url} answered HTTP 501" in text, text
        assert "it is not a transport server" in text, text
    finally:
        peer.kill()
        peer.wait(10)
        if peer.stdout is not None:
            peer.stdout.close()


def test_a_transport_servers_error_is_still_a_remote_error() -> None:
    """The ERROR contract (``X-Transport-Error`` and an ERROR body) is the server's word."""
    with ServerProcess(f"http://127.0.0.1:{free_port()}", env="echo") as proc:
        with transport.connect(proc.url, timeout=10) as client:
            with pytest.raises(RemoteError):
                client.step(3)  # before any reset: the server refuses it
            client.reset(seed=1)
            assert client.health()


def test_a_url_without_a_backend_names_the_url() -> None:
    with pytest.raises(transport.ConnectError, match=r"^ftp://x: no backend for ftp://"):
        transport.connect("ftp://x", timeout=1)


def test_step_multi_with_the_wrong_count_names_the_method_the_url_and_the_seats() -> None:
    with ServerProcess(unique_unix_url(), env="echo") as proc:
        with transport.connect(proc.url, timeout=5) as client:
            client.reset(seed=1)
            with pytest.raises(transport.ActionError) as caught:
                client.step_multi([0, 1])
    text = str(caught.value)
    assert text.startswith(proc.url) and "step_multi() takes one action per seat: 8" in text
    assert text.endswith("got 2")


@pytest.mark.parametrize("lang", ["python", "node"])
def test_unix_url_on_a_zmq_servers_socket_file_is_a_connect_error(lang: str) -> None:
    """A unix:// client pointed at a zmq+ipc server's socket file: the peer closes mid-HELLO,
    which is no transport server on this backend (a ConnectError saying so, as Node's client
    says), not PeerGoneError "the server closed the connection or died"."""
    url = unique_unix_url().replace("unix://", "zmq+ipc://").replace(".sock", ".zmq")
    with ServerProcess(url, env="echo", lang=lang) as zmq_server:
        path = zmq_server.url.removeprefix("zmq+ipc://")
        with pytest.raises(ConnectError) as caught:
            transport.connect(f"unix://{path}", timeout=10)
    text = str(caught.value)
    assert "during the HELLO handshake (not a transport server on this backend?)" in text, text
    assert text.startswith(f"unix://{path}: "), text
    assert caught.value.__cause__ is not None
