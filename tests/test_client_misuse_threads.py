"""A client used across threads or interrupted: ``close()`` from another thread while a call
is in flight, Ctrl-C in an http call (receive and send), ``serve()`` in a non-daemon thread.

Each scenario runs in a child process (a libzmq abort, a hang or a signal must not take the
test run with it) against a real server process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from transport.envs.echo import EchoEnv
from transport.generated import pac_env

from .servers import ROOT, ServerProcess, unique_unix_url, unique_url

STEP_S = 1.5
SCHEMA = pac_env.SCHEMA  # what SlowEcho's results follow (transport-serve --env reads it)


class SlowEcho(EchoEnv):
    """Echo whose step takes ``STEP_S`` (a call stays in flight long enough to act on it)."""

    def step_into(self, action: int, out: np.ndarray) -> None:
        time.sleep(STEP_S)
        super().step_into(action, out)


def run_child(code: str, *args: str, timeout: float = 60) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter; its last stdout line is a JSON object."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the child hung: {exc.stdout!r} {exc.stderr!r}") from None
    assert done.returncode == 0, f"child exited {done.returncode}: {done.stdout} {done.stderr}"
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


CLOSE_DURING_CALL = """
import json, sys, threading, time
import numpy as np, transport
url, timeout = sys.argv[1], (None if sys.argv[2] == "none" else float(sys.argv[2]))
client = transport.connect(url, timeout=timeout)
client.reset(seed=1)
out = {}
def call():
    try:
        out["step"] = float(np.asarray(client.step(7, copy=True).observation).flat[0])
    except BaseException as exc:
        out["step"] = f"{type(exc).__name__}: {exc}"
thread = threading.Thread(target=call)
thread.start()
until = time.monotonic() + 10
while not client._in_use.locked() and time.monotonic() < until:
    time.sleep(0.005)
time.sleep(0.2)  # inside the exchange: the server is stepping
started = time.monotonic()
try:
    client.close()
    out["close"] = "returned"
except transport.TransportError as exc:
    out["close"] = f"{type(exc).__name__}: {exc}"
out["close_s"] = time.monotonic() - started
thread.join(30)
out["alive"] = thread.is_alive()
client.close()  # the call is over: closes now
try:
    client.health()
    out["after"] = "worked"
except transport.TransportError as exc:
    out["after"] = str(exc)
print(json.dumps(out))
"""


@pytest.mark.parametrize(
    ("backend", "timeout"),
    [
        ("unix", "10"),
        ("http", "10"),
        ("zmq+ipc", "10"),
        ("zmq+tcp", "10"),
        ("shm", "10"),
        ("shm", "none"),
    ],
)
def test_close_from_another_thread_during_a_call_is_refused(backend: str, timeout: str) -> None:
    """Before: zmq aborted the process in libzmq (close under a blocked recv), shm hung or
    said "another thread is in a call" forever after, unix and http broke the call. Now the
    close is refused at once, the call goes on and returns its result, and a close after it
    closes the client."""
    with ServerProcess(
        unique_url(backend), env="tests.test_client_misuse_threads:SlowEcho"
    ) as server:
        out = run_child(CLOSE_DURING_CALL, server.url, timeout)
    assert out["alive"] is False
    close = str(out["close"])
    assert close.startswith("TransportError:"), out
    assert "another thread is in a call" in close and "after the call returns" in close, out
    assert float(str(out["close_s"])) < 5, out  # at once, not after the call
    assert out["step"] == 7.0, out  # the call was not disturbed
    assert "the client is closed" in str(out["after"]), out


HTTP_INTERRUPTED_RECEIVE = """
import json, os, signal, sys, threading
import numpy as np, transport
client = transport.connect(sys.argv[1], timeout=10)
client.reset(seed=1)
out = {}
threading.Timer(0.4, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    client.step(11)
    out["first"] = "not interrupted"
except KeyboardInterrupt:
    out["first"] = "interrupted"
out["second"] = float(np.asarray(client.step(21, copy=True).observation).flat[0])
out["third"] = float(np.asarray(client.step(31, copy=True).observation).flat[0])
client.close()
print(json.dumps(out))
"""


def test_http_ctrl_c_during_a_call_drops_the_late_response() -> None:
    """Before: the next call returned the interrupted call's response (observation 11 for
    action 21) and the connection stayed a response behind."""
    with ServerProcess(
        unique_url("http"), env="tests.test_client_misuse_threads:SlowEcho"
    ) as server:
        out = run_child(HTTP_INTERRUPTED_RECEIVE, server.url)
    assert out == {"first": "interrupted", "second": 21.0, "third": 31.0}, out


HTTP_INTERRUPTED_SEND = """
import json, os, signal, socket, threading
import numpy as np
from transport.backends.http.client import HttpChannel
from transport.backends.http.wire import parse_url
from transport.errors import PeerGoneError
from transport.generated import pac_env
listener = socket.create_server(("127.0.0.1", 0))
port = listener.getsockname()[1]
sock = socket.create_connection(("127.0.0.1", port))
peer, _ = listener.accept()  # never reads: the request's send blocks once the buffers are full
address = parse_url(f"http://127.0.0.1:{port}")
channel = HttpChannel(sock, address, pac_env.SCHEMA, timeout=10, max_body=1 << 30)
channel.url = f"http://127.0.0.1:{port}"
out = {}
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
body = bytes(64 << 20)
try:
    channel.request(channel.ids.STEP_BATCH_REQ, body)
    out["first"] = "sent"
except KeyboardInterrupt:
    out["first"] = "interrupted"
try:
    channel.request(channel.ids.HEALTH_REQ, b"")
    out["second"] = "sent on a half-written connection"
except PeerGoneError as exc:
    out["second"] = f"PeerGoneError: {exc}"
except BaseException as exc:
    out["second"] = f"{type(exc).__name__}: {exc}"
channel.close()
peer.close()
listener.close()
print(json.dumps(out))
"""


def test_http_ctrl_c_while_a_request_is_sent_closes_the_connection() -> None:
    """Half a request may be on the wire: the stream cannot be put back in step, so the
    connection is closed and the next call says so (before: it was sent after the half)."""
    out = run_child(HTTP_INTERRUPTED_SEND)
    assert out["first"] == "interrupted", out
    second = str(out["second"])
    assert second.startswith("PeerGoneError:"), out
    assert "interrupted (KeyboardInterrupt) while its request was being sent" in second, out
    assert "open a new client" in second, out


SERVE_IN_A_THREAD = """
import json, sys, threading
import transport
from transport.envs.echo import EchoEnv
out = {}
def run():
    try:
        transport.serve(EchoEnv, sys.argv[1])
        out["serve"] = "returned"
    except BaseException as exc:
        out["serve"] = f"{type(exc).__name__}: {exc}"
thread = threading.Thread(target=run)  # not a daemon: the process waits for it at exit
thread.start()
thread.join(20)
out["alive"] = thread.is_alive()
print(json.dumps(out), flush=True)
"""


def test_serve_in_a_non_daemon_thread_is_refused_at_once() -> None:
    """Before: it served, no signal could stop it, and the process never exited."""
    url = unique_unix_url()
    out = run_child(SERVE_IN_A_THREAD, url, timeout=40)
    assert out["alive"] is False, out
    text = str(out["serve"])
    assert text.startswith("RuntimeError:"), out
    assert "transport.Server(env, url, ...).start()" in text and "main thread" in text, out
    assert not os.path.exists(url.removeprefix("unix://"))  # nothing was bound


WITH_BLOCK_FAILS_DURING_CALL = """
import json, sys, threading, time
import transport
out = {}
try:
    with transport.connect(sys.argv[1], timeout=10) as client:
        client.reset(seed=1)
        thread = threading.Thread(target=lambda: client.step(5))
        thread.start()
        until = time.monotonic() + 10
        while not client._in_use.locked() and time.monotonic() < until:
            time.sleep(0.005)
        raise ValueError("the trainer's own error")
except BaseException as exc:
    out["raised"] = f"{type(exc).__name__}: {exc}"
thread.join(30)
client.close()
print(json.dumps(out))
"""


def test_a_with_block_that_fails_during_another_threads_call_keeps_its_error() -> None:
    """``__exit__``'s close is refused (another thread is in a call): the block's own
    exception goes on, not replaced by the refusal."""
    with ServerProcess(
        unique_url("unix"), env="tests.test_client_misuse_threads:SlowEcho"
    ) as server:
        out = run_child(WITH_BLOCK_FAILS_DURING_CALL, server.url)
    assert out == {"raised": "ValueError: the trainer's own error"}, out


def test_connect_many_close_during_a_batch_closes_every_client_in_the_end() -> None:
    """A MultiClient's close() while its batch is in flight on another thread: the busy client
    refuses (as Client.close does) and the others close; before, the MultiClient marked itself
    closed first, so the busy client was never closed, not even by a later close()."""
    import threading

    import transport

    with (
        ServerProcess(unique_url("unix"), env="tests.test_client_misuse_threads:SlowEcho") as slow,
        ServerProcess(unique_url("unix"), env="echo") as fast,
    ):
        multi = transport.connect_many([slow.url, fast.url], timeout=30)
        multi.reset(seed=1)
        batch = threading.Thread(target=lambda: multi.step([1, 2]))
        batch.start()
        time.sleep(0.5)  # the slow server is stepping
        with pytest.raises(transport.TransportError, match="another thread is in a call"):
            multi.close()
        batch.join(30)
        multi.close()
        assert all(client._closed for client in multi.clients)
