"""Closing an shm client while envs are in flight on a worker-pool server (both server
languages, Python client; the Node client: node_bridge/src/test/shm_close_in_flight.test.ts).

A trainer that stops mid-rollout (an exception, a Ctrl-C handler, ``RemoteAsyncVectorEnv.close``)
calls ``send`` without the matching ``recv``, then ``close()``. The server used to leave the
SHUTDOWN unanswered while the slots' envs were in its pool: the SHUTDOWN timed out (1 s) and the
next connect of the same process failed with "the server did not answer the previous client's
last request". Now the server answers SHUTDOWN at once (the in-flight envs are dropped with the
session's pool), the lease is free, and the next client connects and steps.

Real server processes (``transport-serve ... --workers 2``) running a gated echo env whose SLOW
action waits for a gate file that is absent until the test's client is gone: the envs stay in
flight for as long as the client looks, with no timing guess. Node servers need
``node_bridge/dist`` (the gated env: node_bridge/src/test/shm_close_in_flight_env.ts).
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

import transport.api as api
import transport.backends.shm.channel as shm_channel
from transport.backends.shm.channel import ShmChannel

from .servers import LANGS, ROOT, ServerProcess
from .shm_close_in_flight_env import GATE_ENV, SLOW

N = 4
NODE_GATED = ROOT / "node_bridge" / "dist" / "test" / "shm_close_in_flight_env.js"
GATE = os.path.join(tempfile.gettempdir(), f"transport-gate-{os.getpid()}-{uuid.uuid4().hex[:8]}")
"""The gate file: absent while a test's envs must stay in flight; created once the test's client
is gone, so that the dropped envs' workers end their step and the server's pool closes quickly."""


def _open_gate() -> None:
    with open(GATE, "w"):
        pass


def _shut_gate() -> None:
    for path in [GATE, *glob.glob(GATE + ".in-*")]:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _await_started(count: int) -> None:
    """Wait (10 s at most) until ``count`` SLOW steps began in the server's workers: the server
    read those SENDs (a close right after a SEND can overwrite a command the server has not read
    yet, and then no env is in flight)."""
    deadline = time.monotonic() + 10.0
    while len(glob.glob(GATE + ".in-*")) < count:
        assert time.monotonic() < deadline, f"{count} SLOW step(s) did not start within 10 s"
        time.sleep(0.005)


@pytest.fixture(scope="module", params=LANGS)
def served(request: pytest.FixtureRequest) -> Iterator[str]:
    """One gated server per language (4 envs, 2 worker processes) for the module."""
    lang = str(request.param)
    gate = GATE
    env = f"{NODE_GATED}:makeGated" if lang == "node" else "tests.shm_close_in_flight_env:GatedEcho"
    before = os.environ.get(GATE_ENV)
    os.environ[GATE_ENV] = gate  # the server and its workers inherit it
    try:
        url = f"shm://test-closefly-{uuid.uuid4().hex[:12]}?num_envs={N}"
        extra = ["--workers", "2"]
        if lang == "python":
            extra += ["--schema", "schema/pac_env.toml"]
        with ServerProcess(url, env=env, lang=lang, num_envs=N, extra=extra) as server:
            yield server.url
    finally:
        _shut_gate()
        if before is None:
            del os.environ[GATE_ENV]
        else:
            os.environ[GATE_ENV] = before


def _steps_fine(url: str) -> None:
    """A new client connects at once and its session works (lock-step and async)."""
    with api.connect(url, timeout=20) as client:
        assert isinstance(client.channel, ShmChannel)
        client.reset(seed=1)
        got = client.step(np.arange(N) + 1)
        assert got.observation[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]
        client.send([3], [2])
        assert client.recv().env_ids.tolist() == [2]


def _close_in_flight(url: str, sends: list[list[int]]) -> None:
    """Connect, SEND the SLOW action to each id list of ``sends`` (no RECV), close; the close's
    SHUTDOWN must be answered (else this process's next connect fails)."""
    client = api.connect(url, timeout=20)
    channel = client.channel
    assert isinstance(channel, ShmChannel)
    inode = channel.region.inode
    client.reset(seed=0)
    _shut_gate()
    for k, ids in enumerate(sends):
        client.send([SLOW] * len(ids), ids)
        _await_started(k + 1)  # envs 0, 1 on worker 0; envs 2, 3 on worker 1
    client.close()
    _open_gate()
    assert inode not in shm_channel._UNANSWERED, "the server left SHUTDOWN unanswered"


def test_close_with_envs_in_flight_then_reconnect(served: str) -> None:
    """Two of four envs in the pool (the other slots idle) at close, then every env in flight
    (two SENDs of subsets: the pool holds all four slots): each close is answered, each next
    client of this process connects and works."""
    _close_in_flight(served, [[0, 1]])
    _steps_fine(served)
    _close_in_flight(served, [[0], [1, 2, 3]])
    _steps_fine(served)


DEAD_CLIENT = f"""
import os, sys
import transport
c = transport.connect(sys.argv[1], timeout=20)
c.reset(seed=0)
c.send([{SLOW}, {SLOW}], [0, 3])
print("sent", flush=True)
sys.stdin.readline()
os._exit(0)  # no close: a trainer killed mid-rollout
"""


def test_a_dead_client_with_envs_in_flight_leaves_the_server_usable(served: str) -> None:
    """A client process that dies (no close) with envs in flight: the next client connects
    (the server reclaims the lease and drops the envs) and works."""
    _shut_gate()
    proc = subprocess.Popen(
        [sys.executable, "-c", DEAD_CLIENT, served],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "sent"
        _await_started(2)  # envs 0 and 3: one on each worker
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        _open_gate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    _steps_fine(served)
