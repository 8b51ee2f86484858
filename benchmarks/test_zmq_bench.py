"""zmq+ipc / zmq+tcp round trips next to a raw pyzmq DEALER/ROUTER ping-pong, in one run.

Run:
  pytest benchmarks/test_zmq_bench.py --benchmark-enable --benchmark-json=benchmarks/zmq.json

Rows (client in this process, server in another; p50/p99 in extra_info):
  raw-pyzmq       a DEALER sends [9-byte header, request body] and waits for
                  [9-byte header, result body] from a bare ROUTER (no decoding, no env)
  transport       transport.connect(url).step(...) against transport-serve --env echo --lang
                  python|node, over zmq+ipc, zmq+tcp and (for reference) unix
for one env (4-byte request, 2557-byte result) and 64 envs (256-byte request, 163648-byte
result: above the Node server's 64 KiB zero-copy threshold, below the Python server's 1 MiB).
The goal is transport p50 within 1.3x of raw-pyzmq for one env; the 64-env rows also pay 64 env
steps on the server (compare with unix).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

import transport.api as api

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.test_transport_bench import measure
from tests.servers import ServerProcess, free_port, require_lang, unique_unix_url

ROOT = Path(__file__).resolve().parents[1]
STEP_SIZE = 2557
SIZES = {"1env": (4, STEP_SIZE), "64envs": (4 * 64, STEP_SIZE * 64)}
KINDS = ["ipc", "tcp"]
WARMUP = {"python": 500, "node": 3000}

RAW_SERVER = r"""
import sys, zmq
endpoint, size = sys.argv[1], int(sys.argv[2])
ctx = zmq.Context()
sock = ctx.socket(zmq.ROUTER)
sock.bind(endpoint)
print("ready", flush=True)
header, body = bytes(9), bytes(size)
while True:
    identity, _, request = sock.recv_multipart()
    if request == b"stop":
        break
    sock.send_multipart([identity, header, body], copy=size < 65536)
"""


def _url(kind: str) -> tuple[str, str]:
    """(transport URL, raw pyzmq endpoint) of a fresh address."""
    if kind == "ipc":
        path = f"{tempfile.gettempdir()}/transport-zbench-{uuid.uuid4().hex[:10]}.sock"
        return f"zmq+ipc://{path}", f"ipc://{path}"
    port = free_port()
    return f"zmq+tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port}"


@pytest.fixture(params=list(SIZES))
def size(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def raw_server(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    kind, size = request.param
    _, endpoint = _url(kind)
    reply = SIZES[size][1]
    proc = subprocess.Popen(
        [sys.executable, "-c", RAW_SERVER, endpoint, str(reply)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
    yield endpoint, reply
    proc.kill()
    proc.wait(10)
    proc.stdout.close()
    if endpoint.startswith("ipc://"):  # a killed ZeroMQ process leaves its ipc file
        Path(endpoint.removeprefix("ipc://")).unlink(missing_ok=True)


@pytest.mark.parametrize(
    "raw_server", [(k, s) for k in KINDS for s in SIZES], indirect=True, ids=lambda p: "-".join(p)
)
@pytest.mark.benchmark(group="zmq round trip")
def test_raw_pyzmq(benchmark: Any, raw_server: tuple[str, int]) -> None:
    endpoint, reply = raw_server
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    request_size = next(req for req, rep in SIZES.values() if rep == reply)
    header, body = bytes(9), bytes(request_size)

    def run() -> None:
        sock.send_multipart([header, body])
        got = sock.recv_multipart()
        assert len(got[1]) == reply

    measure(benchmark, run)
    sock.close(0)
    ctx.term()


@pytest.mark.parametrize("lang", ["python", "node"])
@pytest.mark.parametrize("kind", [*KINDS, "unix"])
@pytest.mark.benchmark(group="zmq round trip")
def test_transport(benchmark: Any, kind: str, size: str, lang: str) -> None:
    require_lang(lang)
    num_envs = 64 if size == "64envs" else 1
    url = unique_unix_url() if kind == "unix" else _url(kind)[0]
    with ServerProcess(url, env="echo", lang=lang, num_envs=num_envs) as server:
        with api.connect(server.url, timeout=10) as client:
            client.reset()
            actions = 5 if num_envs == 1 else [5] * num_envs
            # a fresh Node server needs a few thousand requests before V8 has optimised it
            measure(benchmark, lambda: client.step(actions), WARMUP[lang])
