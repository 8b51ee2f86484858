"""Issue 17 item 3: a server that stops serving must not stay alive. A stray write of CLOSED to a
real Python shm server's state word (held 300 ms, or until the server saw it, then put back)
makes the server process exit non-zero with a line saying why; its region is gone (or reads
stale), and a replacement server on the same URL starts."""

from __future__ import annotations

import mmap
import os
import select
import struct
import subprocess
import time
import uuid

import pytest

import transport.api as api
from transport import native
from transport.backends.shm.region import CB, RegionState, inspect_segment, parse_url
from transport.envs import env_factory
from transport.errors import ConnectError, TransportError

from .servers import ServerProcess


def write_state(path: str, value: int) -> None:
    with open(path, "r+b") as fh, mmap.mmap(fh.fileno(), 0) as mapped:
        struct.pack_into("<i", mapped, CB["state"].offset, value)


def unlink(url: str) -> None:
    try:
        native.shm_unlink(parse_url(url).segment)
    except FileNotFoundError:
        pass


def said(fd: int, text: str, at_least: float, within: float) -> str:
    """What the process wrote on ``fd`` until it wrote ``text`` (waiting at least ``at_least``
    and at most ``within`` seconds, or until it closed ``fd``)."""
    got = b""
    start = time.monotonic()
    while time.monotonic() - start < within:
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            got += chunk
        if text.encode() in got and time.monotonic() - start >= at_least:
            break
    return got.decode(errors="replace")


def test_a_stray_closed_state_makes_the_server_exit_and_say_why() -> None:
    url = f"shm://test-{uuid.uuid4().hex[:12]}"
    path = parse_url(url).path
    server = ServerProcess(url)
    try:
        write_state(path, RegionState.CLOSED)
        # held 300 ms, or until the server says it saw it: it looks every 50 ms, but a loaded
        # 2-core machine may not run it for longer, and a READY put back before it looked
        # would leave nothing to see (CI: the test's race, not the server's)
        assert server.proc.stderr is not None
        err = said(server.proc.stderr.fileno(), "state word was set", at_least=0.3, within=20)
        if os.path.exists(path):
            write_state(path, RegionState.READY)  # the stray writer puts it back
        try:
            rc = server.proc.wait(20)
        except subprocess.TimeoutExpired:
            pytest.fail("the server stopped serving but its process stays alive")
        assert rc == 1
        err += server.proc.stderr.read()
        assert "state word was set to 2 (CLOSED)" in err, err
        assert "transport-serve: error:" in err, err
        assert not os.path.exists(path) or inspect_segment(path).stale
        with ServerProcess(url) as replacement:  # not refused as "in use by a live server"
            with api.connect(replacement.url, timeout=10) as client:
                client.reset(seed=1)
    finally:
        server.kill()
        unlink(url)
    assert not os.path.exists(path)


def test_serve_raises_when_the_region_is_closed_under_it() -> None:
    """The API: ``serve()`` returns only by a signal; a server that stops raises."""
    import threading

    url = f"shm://test-{uuid.uuid4().hex[:12]}"
    path = parse_url(url).path
    ready = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            api.serve(env_factory("echo"), url, ready=lambda _: ready.set())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert ready.wait(20)
        write_state(path, RegionState.CLOSED)
        thread.join(20)
        assert not thread.is_alive(), "serve() kept waiting after its server stopped"
        assert len(errors) == 1 and isinstance(errors[0], api.ServerStoppedError), errors
        assert isinstance(errors[0], TransportError)
        assert not isinstance(errors[0], ConnectError)
        assert not os.path.exists(path)
    finally:
        unlink(url)


def test_a_socket_server_whose_accept_loop_fails_reports_it() -> None:
    """Any backend: a serve loop that raises without close() is recorded, not silent."""
    import socket as socket_module

    from transport.envs.echo import EchoEnv

    from .servers import unique_unix_url

    def broken(conn: socket_module.socket) -> None:
        raise RuntimeError("injected: the accept loop breaks")

    server = api.Server(EchoEnv, unique_unix_url()).start()
    try:
        server.listener.configure = broken  # runs in the accept loop, outside any handler
        with socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(server.listener.path)
        assert server.stopped.wait(10), "the serving thread did not end"
        assert server.failure is not None and "injected" in server.failure
        with pytest.raises(api.ServerStoppedError, match="the server loop failed"):
            server.check()
    finally:
        server.close()
    assert not os.path.exists(server.listener.path)
