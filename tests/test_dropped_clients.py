"""Clients dropped without ``close()``, and zmq clients whose server went away.

- shm: a client dropped in a reference cycle used to keep the region's lease (the garbage
  collector cleared the channel's weak ``_LEASES`` entry before its ``__del__`` ran, which then
  took the lease for another channel's): an immediate reconnect failed "in use by this process".
- zmq: a dropped client used to leave its session (its envs) on the server until the server's
  idle timeout (600 s): only ``Client.close()`` said goodbye. Now the channel's finalizer does.
- zmq: after a PeerGoneError every later call waited for a reconnect (its whole timeout, or
  forever with ``timeout=None``); now it fails at once, as over unix and http.
- zmq: each channel's socket monitor has an inproc address of its own (pyzmq's default, named
  after the socket's fd, could still be bound by a dropped socket).
- Node: a client dropped without ``close()`` kept its socket (one fd per client) and its server
  session for as long as the process lived; now a FinalizationRegistry closes it, as Python's
  finalizer does.

Real server processes (``transport-serve``); the zmq server runs ``ClosingEcho`` (below), which
leaves a marker file when the server closes its env: the session was dropped.
"""

from __future__ import annotations

import gc
import glob
import json
import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq

import transport
from transport.backends.zmq.client import client_context
from transport.envs.echo import EchoEnv
from transport.errors import PeerGoneError

from .servers import ROOT, ServerProcess, require_lang, unique_url

MARKS_ENV = "TRANSPORT_TEST_CLOSE_MARKS"
BOUND_S = 5.0
"""What should take well under a second must take less than this."""


class ClosingEcho(EchoEnv):
    """EchoEnv that creates ``$TRANSPORT_TEST_CLOSE_MARKS-<pid>-<n>`` when it is closed."""

    def close(self) -> None:
        marks = os.environ.get(MARKS_ENV, "")
        if marks:
            with open(f"{marks}-{os.getpid()}-{time.monotonic_ns()}", "w"):
                pass
        closer = getattr(super(), "close", None)
        if closer is not None:
            closer()


def _connect_and_drop(url: str, *, cycle: bool) -> None:
    """Connect, reset, and forget the client without closing it: in a reference cycle (as a
    trainer's object graph often holds it: only the cyclic garbage collector finalizes it), or
    by its last reference."""
    client = transport.connect(url, timeout=5)
    client.reset(seed=1)
    if cycle:  # only the cycle holds the client now
        holder: list[Any] = [client]
        holder.append(holder)
        del holder
    del client
    gc.collect()


def test_shm_client_dropped_in_a_cycle_releases_its_lease_at_once() -> None:
    url = unique_url("shm")
    with ServerProcess(url, num_envs=2) as server:
        for _ in range(3):
            _connect_and_drop(server.url, cycle=True)
            # the lease is free now: not "in use by this process" until the server notices
            again = transport.connect(server.url, timeout=0.5)
            again.reset(seed=2)  # a new session: its envs are fresh
            assert again.step(np.array([3, 4])).observation[:, 0].tolist() == [3.0, 4.0]
            again.close()


@pytest.fixture
def closing_marks(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The marker prefix ClosingEcho envs of a server started in this test write to."""
    marks = os.path.join(tempfile.gettempdir(), f"transport-closed-{uuid.uuid4().hex[:12]}")
    monkeypatch.setenv(MARKS_ENV, marks)  # the server inherits it
    try:
        yield marks
    finally:
        for path in glob.glob(marks + "-*"):
            os.unlink(path)


@pytest.fixture
def closing_zmq(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, ServerProcess]]:
    """A zmq server of ClosingEcho envs; (its URL, the marker prefix, the server)."""
    marks = os.path.join(tempfile.gettempdir(), f"transport-closed-{uuid.uuid4().hex[:12]}")
    monkeypatch.setenv(MARKS_ENV, marks)  # the server inherits it
    try:
        with ServerProcess(
            unique_url("zmq+ipc"),
            env="tests.test_dropped_clients:ClosingEcho",
            num_envs=2,
            extra=["--schema", "schema/pac_env.toml"],
        ) as server:
            yield server.url, marks, server
    finally:
        for path in glob.glob(marks + "-*"):
            os.unlink(path)


def _await_marks(marks: str, count: int) -> bool:
    deadline = time.monotonic() + BOUND_S
    while len(glob.glob(marks + "-*")) < count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_zmq_client_dropped_without_close_says_goodbye(
    closing_zmq: tuple[str, str, ServerProcess],
) -> None:
    url, marks, _ = closing_zmq
    closed = transport.connect(url, timeout=5)
    closed.reset(seed=1)
    closed.close()
    assert _await_marks(marks, 2), "close() did not end the session (the test's premise)"
    _connect_and_drop(url, cycle=True)
    assert _await_marks(marks, 4), "the dropped client's session is still on the server"
    _connect_and_drop(url, cycle=False)
    assert _await_marks(marks, 6), "the dropped client's session is still on the server"


@pytest.mark.parametrize("timeout", [30.0, None], ids=["timeout", "no-timeout"])
def test_zmq_every_call_after_peer_gone_fails_at_once(
    closing_zmq: tuple[str, str, ServerProcess], timeout: float | None
) -> None:
    url, _, server = closing_zmq
    client = transport.connect(url, timeout=timeout)
    try:
        client.reset(seed=1)
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)
        os.unlink(url.removeprefix("zmq+ipc://"))  # a killed server leaves its socket file
        for call in range(3):
            started = time.monotonic()
            with pytest.raises(PeerGoneError) as caught:
                _bounded_step(client)
            took = time.monotonic() - started
            assert took < BOUND_S, f"call {call} failed after {took:.1f} s"
        assert "open a new client" in str(caught.value)
    finally:
        client.close()


def _bounded_step(client: Any) -> None:
    """``client.step`` that cannot hang the test: a SIGALRM after ``2 * BOUND_S`` ends it."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"the call still waited after {2 * BOUND_S} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 2 * BOUND_S)
    try:
        client.step(np.array([1, 2]))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_zmq_monitor_address_is_the_channels_own(
    closing_zmq: tuple[str, str, ServerProcess],
) -> None:
    """Every pyzmq default monitor address (``inproc://monitor.s-<fd>``) already bound in the
    clients' context, as a dropped socket's can be: connecting still works."""
    url, _, _ = closing_zmq
    squatter = client_context().socket(zmq.PULL)
    try:
        for fd in range(1024):
            squatter.bind(f"inproc://monitor.s-{fd}")
        client = transport.connect(url, timeout=5)
        client.reset(seed=1)
        client.close()
    finally:
        squatter.close(0)


def test_a_second_client_of_a_leased_region_is_told_the_region_is_in_use() -> None:
    """Not "is a server serving this URL?": a server serves it, and another client holds it."""
    url = unique_url("shm")
    with ServerProcess(url, num_envs=2) as server, transport.connect(server.url, timeout=5):
        with pytest.raises(transport.RegionInUseError) as caught:
            transport.connect(server.url, timeout=5)
    assert caught.value.holder == os.getpid()
    text = str(caught.value)
    assert "in use by this process" in text and "close that client first" in text
    assert "is a server serving this URL" not in text


# Node: connect, reset and drop (no close()) DROPS clients one after another, collecting garbage
# after each; prints this process's open fds before and after.
NODE_DROPS = """
const { connect } = require(process.argv[1]);
const fs = require("fs");
const fds = () => fs.readdirSync("/proc/self/fd").length;
const settle = async () => {
  for (let i = 0; i < 5; i++) {
    global.gc();
    await new Promise((resolve) => setTimeout(resolve, 40));
  }
};
(async () => {
  const [url, drops] = [process.argv[2], Number(process.argv[3])];
  const warm = await connect(url, { timeoutMs: 5000 });
  await warm.reset(1);
  await warm.close();
  await settle();
  const before = fds();
  const dropOne = async () => {
    const client = await connect(url, { timeoutMs: 5000 });
    await client.reset(1);
  };
  for (let i = 0; i < drops; i++) {
    await dropOne();
    await settle(); // the client is out of scope: collected, so the next may take the lease
  }
  console.log(JSON.stringify({ before, after: fds() }));
})().catch((error) => { console.error(error); process.exit(1); });
"""


@pytest.mark.parametrize("backend", ["unix", "zmq+ipc", "shm"])
def test_node_client_dropped_without_close_frees_its_socket_and_session(
    closing_marks: str, backend: str
) -> None:
    require_lang("node")
    drops = 4
    with ServerProcess(
        unique_url(backend),
        env="tests.test_dropped_clients:ClosingEcho",
        num_envs=2,
        extra=["--schema", "schema/pac_env.toml"],
    ) as server:
        index = str(ROOT / "node_bridge" / "dist" / "index.js")
        done = subprocess.run(
            ["node", "--expose-gc", "-e", NODE_DROPS, "--", index, server.url, str(drops)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        fds = json.loads(done.stdout.strip().splitlines()[-1])
        # the warm-up client's session (closed) and each dropped one's: 2 envs closed per session
        assert _await_marks(closing_marks, 2 * (1 + drops)), "a dropped client's session stays"
    assert fds["after"] - fds["before"] < drops, fds  # one fd per dropped client before
