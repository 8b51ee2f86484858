"""Step round trips over unix and http, next to raw baselines of the same sizes, in one run.

Run (writes the JSON that benchmarks/report.py turns into RESULTS.md tables):
  pytest benchmarks/test_transport_bench.py --benchmark-enable \
      --benchmark-json=benchmarks/transport.json

Every row is a Python client doing 4-byte request / 2557-byte response round trips:
  raw-socketpair   a forked process answering on a socketpair (the floor for unix)
  raw-http-node    http.client against a bare Node `http` server (the floor for http)
  unix/http x python/node   transport.connect(...).step(a) against transport-serve --env echo
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import transport.api as api

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.servers import ServerProcess, free_port, require_lang, unique_url

ROOT = Path(__file__).resolve().parents[1]
STEP_SIZE = 2557
ROUNDS = 5000
WARMUP = 500


def measure(benchmark: Any, run: Callable[[], object], warmup: int = WARMUP) -> None:
    """pedantic rounds of one call each, then p50/p99 from every sample into extra_info."""
    for _ in range(warmup):
        run()
    benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=0)
    data = np.array(benchmark.stats.stats.data) * 1e6
    benchmark.extra_info["p50_us"] = float(np.percentile(data, 50))
    benchmark.extra_info["p99_us"] = float(np.percentile(data, 99))


@pytest.fixture(scope="module")
def socketpair_peer() -> Iterator[socket.socket]:
    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child process
        parent.close()
        reply = bytes(STEP_SIZE)
        buf = bytearray(4)
        try:
            while child.recv_into(buf) == 4:
                child.sendall(reply)
        finally:
            os._exit(0)
    child.close()
    yield parent
    parent.close()
    os.waitpid(pid, 0)


@pytest.mark.benchmark(group="step round trip, 2557-byte result")
def test_raw_socketpair(benchmark: Any, socketpair_peer: socket.socket) -> None:
    buf = bytearray(STEP_SIZE)
    view = memoryview(buf)
    request = b"\x01\x00\x00\x00"

    def run() -> None:
        socketpair_peer.sendall(request)
        got = 0
        while got < STEP_SIZE:
            got += socketpair_peer.recv_into(view[got:])

    measure(benchmark, run)


@pytest.fixture(scope="module")
def bare_node_http() -> Iterator[int]:
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    port = free_port()
    proc = subprocess.Popen(
        ["node", str(ROOT / "benchmarks" / "bare_http_server.js"), str(port), str(STEP_SIZE)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
    yield port
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)


@pytest.mark.benchmark(group="step round trip, 2557-byte result")
def test_raw_http_client_bare_node(benchmark: Any, bare_node_http: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", bare_node_http)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    body = b"\x01\x00\x00\x00"
    headers = {"Content-Type": "application/octet-stream"}

    def run() -> None:
        conn.request("POST", "/v1/step", body, headers)
        conn.getresponse().read()

    measure(benchmark, run)
    conn.close()


@pytest.mark.parametrize("lang", ["python", "node"])
@pytest.mark.parametrize("backend", ["unix", "http"])
@pytest.mark.benchmark(group="step round trip, 2557-byte result")
def test_transport_step(benchmark: Any, backend: str, lang: str) -> None:
    require_lang(lang)
    with ServerProcess(unique_url(backend), env="echo", lang=lang) as server:
        with api.connect(server.url, timeout=10) as client:
            client.reset()
            run = lambda: client.step(5)  # noqa: E731
            measure(benchmark, run)
