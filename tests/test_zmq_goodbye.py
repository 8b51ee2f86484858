"""A zmq client that closes says goodbye, and the server closes its envs then.

A ROUTER is not told when a DEALER goes, so a zmq server kept every client's session and envs
until its 1024-session LRU dropped them or the server closed: a trainer that reconnected 100
times left 100 sets of envs alive. Now ``Client.close`` sends a HELLO_REQ with
``GOODBYE_FLAG`` (docs/protocol.md "Goodbye") and the server ends that session, closing its
envs, and answers nothing. Python and Node servers, Python clients (Node clients:
node_bridge/src/test/zmq_goodbye.test.ts), real ZeroMQ sockets."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

import transport.api as api
from transport.envs.echo import EchoEnv
from transport.protocol import encode_goodbye, encode_hello, is_goodbye

from .servers import ROOT, ServerProcess, free_port, require_lang
from .test_zmq_backend import IDS, Raw

NUM_ENVS = 3


def zmq_url(kind: str) -> str:
    if kind == "ipc":
        return f"zmq+ipc://{tempfile.gettempdir()}/goodbye-{uuid.uuid4().hex[:12]}.sock"
    return f"zmq+tcp://127.0.0.1:{free_port()}"


class ClosedEcho(EchoEnv):
    """The echo env, counting (per process) the envs closed."""

    closed = 0

    def close(self) -> None:
        type(self).closed += 1


def reaches(count: Callable[[], int], want: int, seconds: float = 10.0) -> bool:
    """Whether ``count()`` is ``want`` within ``seconds`` (a goodbye is handled in the server's
    own time)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if count() == want:
            return True
        time.sleep(0.02)
    return count() == want


def test_the_goodbye_body() -> None:
    body = encode_goodbye()
    assert is_goodbye(body) and len(body) == 12
    assert not is_goodbye(body[:11])
    assert not is_goodbye(encode_hello(0x1234, {"schema_name": "pac_env"}))


@pytest.mark.parametrize("kind", ["ipc", "tcp"])
def test_a_closed_client_has_its_envs_closed(kind: str) -> None:
    ClosedEcho.closed = 0
    server = api.Server(ClosedEcho, zmq_url(kind), num_envs=NUM_ENVS).start()
    try:
        url = server.bound_url
        # the env made at start serves the first client: N envs per client from then on
        staying = api.connect(url, timeout=10)
        staying.reset(seed=1)
        for round_ in range(1, 4):
            with api.connect(url, timeout=10) as client:
                client.reset(seed=round_)
                client.step([1] * NUM_ENVS)
            assert reaches(lambda: ClosedEcho.closed, round_ * NUM_ENVS), ClosedEcho.closed
        # the other client's session is untouched
        assert staying.step([2] * NUM_ENVS)["observation"][0, 0] == 2
        staying.close()
        assert reaches(lambda: ClosedEcho.closed, 4 * NUM_ENVS), ClosedEcho.closed
    finally:
        server.close()
    assert ClosedEcho.closed == 4 * NUM_ENVS


def test_a_goodbye_is_not_answered_and_needs_no_session() -> None:
    """A goodbye from a peer without a session (or after its session ended) makes no session
    and gets no answer; the same peer may say hello again afterwards."""
    ClosedEcho.closed = 0
    server = api.Server(ClosedEcho, zmq_url("ipc"), num_envs=1).start()
    raw = Raw(server.bound_url)
    try:
        raw.sock.setsockopt(zmq.RCVTIMEO, 300)
        raw.frame(IDS.HELLO_REQ, 1, encode_goodbye())
        with pytest.raises(zmq.Again):
            raw.recv()
        raw.sock.setsockopt(zmq.RCVTIMEO, 5000)
        raw.hello(2)
        raw.frame(IDS.HELLO_REQ, 3, encode_goodbye())
        assert reaches(lambda: ClosedEcho.closed, 1)
        raw.hello(4)  # a fresh session
    finally:
        raw.close()
        server.close()


def test_a_node_server_closes_the_envs_of_a_client_that_left(tmp_path: Path) -> None:
    require_lang("node")
    marks = tmp_path / "closed"
    marks.mkdir()
    module = tmp_path / "closes.js"
    echo = ROOT / "node_bridge" / "dist" / "envs" / "echo.js"
    module.write_text(
        f"""const fs = require("node:fs");
const {{ EchoEnv }} = require({str(echo)!r});
let serial = 0;
class ClosedEcho extends EchoEnv {{
  close() {{ fs.writeFileSync({str(marks)!r} + "/" + process.pid + "-" + (++serial), ""); }}
}}
module.exports = {{ ClosedEcho }};
"""
    )
    with ServerProcess(
        zmq_url("ipc"),
        env=f"{module}:ClosedEcho",
        lang="node",
        num_envs=NUM_ENVS,
        extra=["--schema", "pac_env"],
    ) as proc:
        for round_ in range(1, 3):
            with api.connect(proc.url, timeout=10) as client:
                client.reset(seed=round_)
                client.step([1] * NUM_ENVS)
            assert reaches(lambda: len(os.listdir(marks)), round_ * NUM_ENVS), os.listdir(marks)


class MarkedEcho(EchoEnv):
    """The echo env leaving a file in ``$TRANSPORT_TEST_CLOSE_MARKS`` when it is closed (the
    Node test serves it with the Python CLI: zmq_goodbye.test.ts)."""

    def close(self) -> None:
        marks = Path(os.environ["TRANSPORT_TEST_CLOSE_MARKS"])
        (marks / f"{os.getpid()}-{uuid.uuid4().hex}").touch()
