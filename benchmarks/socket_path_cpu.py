"""CPU time of one batched step round trip, client and server in ONE process (issue 24 item 3).

    python benchmarks/socket_path_cpu.py --before /tmp/before --backends unix,http,zmq+ipc \
        --envs null,vector-echo --batch 64,256 --rounds 3

Envs: ``fixed`` (unix only: one prepared response, no runtime: the transport alone), ``null``
(a vector env whose step writes nothing: transport + runtime), ``vector-echo``, ``echo``.
Each round trip runs the real client (``transport.Client`` over the backend's channel) and the
real server code for that request inline, in this thread: the channel's receive is wrapped so
that the server part (unix: ``FramedSocket`` + ``Session``; http: the connection's head
parsing and ``_answer``; zmq: the listener's ``_serve_one``) answers first. ``process_time``
(every thread of the process: libzmq's I/O threads too) over N round trips is the CPU both
sides spend per step: unlike wall time on a shared machine, other jobs' load hardly moves it.
``raw`` rows move the same bytes with bare ``sendall``/``recv_into`` (unix, http over TCP)
or DEALER/ROUTER (zmq). ``--before DIR`` runs every cell under that tree too, alternating.
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
_FILES: list[str] = []  # ipc socket files this cell made: removed before it exits
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _host(env: str, n: int) -> Any:
    from socket_path_bench import NullVectorEnv

    from transport.envs.echo import EchoEnv
    from transport.envs.vector_echo import VectorEchoEnv
    from transport.generated import pac_env
    from transport.runtime.host import EnvHost

    factory: Any = {
        "null": functools.partial(NullVectorEnv, n),
        "vector-echo": functools.partial(VectorEchoEnv, n),
        "echo": EchoEnv,
    }[env]
    return EnvHost(pac_env.SCHEMA, factory, num_envs=n)


def _big_buffers(*socks: socket.socket) -> None:
    for s in socks:  # one thread sends a whole response before it reads: it must fit
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)


def unix_step(env: str, n: int) -> Callable[[], object]:
    from transport.backends.socket_listener import ConnectionWatch, ServerLimits
    from transport.backends.stream import FramedSocket, StreamChannel
    from transport.client import Client
    from transport.generated import pac_env
    from transport.runtime.session import Session

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    _big_buffers(a, b)
    session = Session(_host("null" if env == "fixed" else env, n))
    session.hello_done = True
    session.runtime.reset()
    server = FramedSocket(b, capacity=4096, timeout=None, watch=ConnectionWatch(ServerLimits()))
    channel = StreamChannel(FramedSocket(a, timeout=10.0), 10.0)
    channel.info = {"num_envs": n, "autoreset": "disabled"}
    receive = channel.framed.recv_frame
    # "fixed": the server answers every step with one prepared response (no runtime, no env):
    # what the transport alone costs over the raw bytes
    fixed = session.handle(session.ids.STEP_BATCH_REQ, memoryview(bytearray(n * 4)))

    def recv_frame(deadline: float | None = None) -> tuple[int, int, memoryview]:
        msg_type, msg_id, body = server.recv_frame()
        resp_type, resp = fixed if env == "fixed" else session.handle(msg_type, body)
        server.send_raw(session.frame(resp_type, msg_id, resp))
        return receive(deadline)

    channel.framed.recv_frame = recv_frame  # type: ignore[method-assign]
    client = Client(channel, pac_env.SCHEMA, "unix://inline")
    actions = np.arange(n, dtype=np.uint8) % 92
    return functools.partial(client.step, actions)


def http_step(env: str, n: int) -> Callable[[], object]:
    from transport.backends.http import client as http_client
    from transport.backends.http import server as http_server
    from transport.backends.socket_listener import ConnectionWatch, ServerLimits
    from transport.client import Client
    from transport.generated import pac_env
    from transport.runtime.session import Session

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(1)
    port = listening.getsockname()[1]
    channel = http_client.open_channel(f"http://127.0.0.1:{port}", timeout=10.0)
    conn, _ = listening.accept()
    listening.close()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    assert channel.sock is not None
    _big_buffers(conn, channel.sock)
    session = Session(_host(env, n))
    session.hello_done = True
    session.runtime.reset()
    served = http_server._Connection(conn, session, 64 << 20, ConnectionWatch(ServerLimits()))
    channel.info = {"num_envs": n, "autoreset": "disabled"}
    receive = channel._receive

    def serve_one() -> None:  # the body of _Connection.serve for one request
        head, body_start = served._read_head()
        end = body_start + head.content_length
        while served.have < end:
            if served.have == len(served.buffer):
                served._grow(min(end, 2 * len(served.buffer)))
            served._recv()
        body_view = getattr(served, "_body_view", None)  # (a tree from before it)
        body = served.view[body_start:end] if body_view is None else body_view(body_start, end)
        served._answer(head, body)
        served.have -= end

    def _receive(sock: socket.socket, deadline: float | None) -> tuple[int, memoryview]:
        serve_one()
        return receive(sock, deadline)

    channel._receive = _receive  # type: ignore[method-assign]
    client = Client(channel, pac_env.SCHEMA, "http://inline")
    actions = np.arange(n, dtype=np.uint8) % 92
    return functools.partial(client.step, actions)


def zmq_step(env: str, n: int, scheme: str) -> Callable[[], object]:
    from transport.backends.zmq import client as zmq_client
    from transport.backends.zmq.server import Listener
    from transport.client import Client, handshake
    from transport.generated import pac_env

    if scheme == "zmq+ipc":
        path = f"{tempfile.gettempdir()}/spc-{os.getpid()}-{uuid.uuid4().hex[:6]}.ipc"
        _FILES.append(path)
        url = f"zmq+ipc://{path}"
    else:
        from transport.probe.servers import _free_port

        url = f"zmq+tcp://127.0.0.1:{_free_port()}"
    listener = Listener(url, _host(env, n))
    listener.start()
    sock = listener._sock
    assert sock is not None
    channel = zmq_client.open_channel(listener.url, timeout=10.0)
    channel.info = {"num_envs": n, "autoreset": "disabled"}
    receive = channel.recv_response

    def recv_response(msg_id: int, deadline: float | None = None) -> tuple[int, memoryview]:
        identity = sock.recv()
        listener._serve_one(sock, identity)
        return receive(msg_id, deadline)

    channel.recv_response = recv_response  # type: ignore[method-assign]
    handshake(channel, pac_env.SCHEMA)  # through the server: it makes the session
    client = Client(channel, pac_env.SCHEMA, url)
    client.reset()
    actions = np.arange(n, dtype=np.uint8) % 92
    return functools.partial(client.step, actions)


def raw_step(scheme: str, n: int) -> Callable[[], object]:
    request = bytes(9 + n * 4)
    response = bytes(9 + n * 2557)
    if scheme.startswith("zmq"):
        import zmq

        ctx = zmq.Context(io_threads=1)
        router = ctx.socket(zmq.ROUTER)
        dealer = ctx.socket(zmq.DEALER)
        if scheme == "zmq+ipc":
            path = f"{tempfile.gettempdir()}/spcr-{os.getpid()}.ipc"
            _FILES.append(path)
            address = f"ipc://{path}"
        else:
            router.bind("tcp://127.0.0.1:0")
            address = router.getsockopt_string(zmq.LAST_ENDPOINT)
        if scheme == "zmq+ipc":
            router.bind(address)
        dealer.connect(address)

        def zstep() -> None:
            dealer.send(request, copy=False)
            identity, _ = router.recv_multipart(copy=False)
            router.send_multipart([identity, response], copy=False)
            dealer.recv(copy=False)

        return zstep
    if scheme == "unix":
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        listening = socket.socket()
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        a = socket.create_connection(listening.getsockname())
        b, _ = listening.accept()
        for s in (a, b):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _big_buffers(a, b)
    qb = memoryview(bytearray(len(request)))
    rb = memoryview(bytearray(len(response)))

    def step() -> None:
        a.sendall(request)
        got = 0
        while got < len(request):
            got += b.recv_into(qb[got:])
        b.sendall(response)
        got = 0
        while got < len(response):
            got += a.recv_into(rb[got:])

    return step


def measure(scheme: str, env: str, n: int, count: int) -> float:
    """CPU us per round trip (median of 5 slices of ``count`` / 5)."""
    if env == "raw":
        step = raw_step(scheme, n)
    elif scheme == "unix":
        step = unix_step(env, n)
    elif scheme == "http":
        step = http_step(env, n)
    else:
        step = zmq_step(env, n, scheme)
    for _ in range(200):
        step()
    slices = []
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(count // 5):
            step()
        slices.append((time.process_time() - t0) / (count // 5) * 1e6)
    return statistics.median(slices)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--cell":
        try:
            print(f"{measure(argv[1], argv[2], int(argv[3]), int(argv[4])):.2f}", flush=True)
        finally:
            for path in _FILES:
                if os.path.exists(path):
                    os.unlink(path)
        os._exit(0)  # libzmq sockets left open: do not wait on them
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", default=None)
    parser.add_argument("--backends", default="unix,http,zmq+ipc,zmq+tcp")
    parser.add_argument("--envs", default="null,vector-echo")
    parser.add_argument("--batch", default="64,256")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--raw", action="store_true")
    args = parser.parse_args(argv)
    trees = {"after": str(ROOT)}
    if args.before:
        trees = {"before": args.before, "after": str(ROOT)}
    envs = args.envs.split(",") + (["raw"] if args.raw else [])
    unknown = sorted(set(envs) - {"fixed", "null", "vector-echo", "echo", "raw"})
    if unknown:
        parser.error(f"unknown env {', '.join(unknown)} (fixed, null, vector-echo, echo)")
    if "fixed" in envs and args.backends.split(",") != ["unix"]:
        parser.error("--envs fixed (one prepared response, no runtime) exists for unix only")
    got: dict[tuple[str, str, str, str], list[float]] = {}
    print(f"load {os.getloadavg()[0]:.2f}", flush=True)
    me = str(Path(__file__).resolve())
    for _ in range(args.rounds):
        for scheme in args.backends.split(","):
            for env in envs:
                for batch in args.batch.split(","):
                    for name, tree in trees.items():
                        if env == "raw" and name == "before":
                            continue
                        child_env = dict(os.environ, PYTHONPATH=tree)
                        out = subprocess.run(
                            [sys.executable, me, "--cell", scheme, env, batch, str(args.count)],
                            env=child_env,
                            cwd=tempfile.gettempdir(),
                            capture_output=True,
                            text=True,
                            check=True,
                        ).stdout
                        got.setdefault((scheme, env, batch, name), []).append(float(out))
    print(f"load {os.getloadavg()[0]:.2f}", flush=True)
    print("cell  CPU us per round trip, client + server (median of rounds; each round)")
    for key, values in got.items():
        runs = " ".join(f"{v:.1f}" for v in values)
        print(f"{' '.join(key):36s} {statistics.median(values):7.1f}  ({runs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
