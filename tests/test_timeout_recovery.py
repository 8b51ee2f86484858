"""After a timeout the connection resynchronises (issue 15 item 4), and client-side transport
errors name the URL and what to do (item 5): the Python client here (the contract check
``timeout_then_resynchronise`` covers it over every scheme), the Node client in a real Node
process against Python and Node servers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import pytest

import transport
from transport.errors import PeerGoneError, TransportTimeoutError
from transport.testing import schema_named

from .servers import NODE_SERVER, ROOT, ServerProcess, stop_process, unique_url

SCHEMES = ["unix", "http", "zmq+ipc", "zmq+tcp", "shm"]

NODE_CLIENT = """
const { connect, TransportTimeoutError } = require(process.argv[1]);
const readline = require("node:readline");
const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const say = (value) => process.stdout.write(JSON.stringify(value) + "\\n");
(async () => {
  const url = process.argv[2];
  const client = await connect(url, { timeoutMs: 500 });
  await client.reset(21n);
  say("connected");
  await lines.next(); // the server is stopped
  const errors = [];
  for (const call of [() => client.step(0), () => client.observe()]) {
    try {
      await call();
      errors.push("answered");
    } catch (error) {
      const kind = error instanceof TransportTimeoutError ? "timeout" : error.name;
      errors.push(`${kind}: ${error.message}`);
    }
  }
  say(errors);
  await lines.next(); // the server continues
  const view = await client.step(0);
  say(Array.from(view.observation));
  await lines.next(); // the server was terminated
  try {
    await client.step(0);
    say("answered");
  } catch (error) {
    say(`${error.name}: ${error.message}`);
  }
  await client.close();
  process.exit(0);
})().catch((error) => { say(`failed: ${error.stack}`); process.exit(1); });
"""


def _node_available() -> None:
    if shutil.which("node") is None or not NODE_SERVER.is_file():
        pytest.skip("the Node bridge is not built (run ./dev setup)")


def _expected_observation(url: str) -> list[float]:
    """What a fresh session of the same server answers to reset(21), step(0), step(0)."""
    with transport.connect(url, schema_named("pac_env"), timeout=20.0) as client:
        client.reset(21)
        client.step(0)
        return [float(x) for x in client.step(0, copy=True).observation]


@pytest.mark.parametrize("lang", ["python", "node"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_node_client_resynchronises_after_a_timeout(scheme: str, lang: str) -> None:
    _node_available()
    server = ServerProcess(
        unique_url(scheme), env="contract", lang=lang, extra=["--schema", "pac_env"]
    )
    with server:
        expected = _expected_observation(server.url)  # a session of its own, closed again
        index = str(ROOT / "node_bridge" / "dist" / "index.js")
        node = subprocess.Popen(
            ["node", "-e", NODE_CLIENT, index, server.url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert node.stdin is not None and node.stdout is not None
        try:
            assert json.loads(node.stdout.readline()) == "connected"
            stop_process(server.proc.pid)
            try:
                node.stdin.write("stopped\n")
                node.stdin.flush()
                errors = json.loads(node.stdout.readline())
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            node.stdin.write("continued\n")
            node.stdin.flush()
            observation = json.loads(node.stdout.readline())
            assert server.terminate() == 0
            node.stdin.write("terminated\n")
            node.stdin.flush()
            gone = json.loads(node.stdout.readline())
            assert node.wait(30) == 0
        finally:
            if node.poll() is None:
                node.kill()
        assert [e.split(":")[0] for e in errors] == ["timeout", "timeout"], errors
        assert all(server.url in e and "the late reply is dropped" in e for e in errors), errors
    # the timed-out step took effect, its late reply was dropped: the step after is the third
    assert observation == pytest.approx(expected)
    # a server that went away: named by URL, with what to do (zmq may only see silence)
    assert gone.startswith(("PeerGoneError", "TransportTimeoutError")), gone
    assert server.url in gone and ("connect again" in gone or "retry" in gone), gone


@pytest.mark.parametrize("scheme", ["unix", "shm"])
def test_python_errors_name_the_url_and_what_to_do(scheme: str) -> None:
    server = ServerProcess(unique_url(scheme), env="contract", extra=["--schema", "pac_env"])
    with server:
        client = transport.connect(server.url, schema_named("pac_env"), timeout=0.5)
        try:
            client.reset(1)
            stop_process(server.proc.pid)
            try:
                with pytest.raises(TransportTimeoutError) as timed_out:
                    client.step(0)
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            assert str(timed_out.value).startswith(f"{server.url}")
            assert "retry, or connect with a larger timeout=" in str(timed_out.value)
            client.step(0)  # resynchronised
            assert server.terminate() == 0  # the server goes away while the client is connected
            with pytest.raises(PeerGoneError) as gone:
                for _ in range(3):  # a stream notices at once, shm at its next wait
                    client.step(0)
            assert server.url in str(gone.value), str(gone.value)
            assert "see the server's log, then connect again" in str(gone.value)
        finally:
            client.close()


def test_shm_channel_guards_callers_other_than_the_client() -> None:
    """A request made on the shm channel itself (as connect_many does) while a late response is
    due waits for it instead of overwriting the slot's request: the timed-out step is kept."""
    schema = schema_named("pac_env")
    with ServerProcess(unique_url("shm"), env="contract", extra=["--schema", "pac_env"]) as server:
        client = transport.connect(server.url, schema, timeout=0.5)
        try:
            client.reset(21)
            stop_process(server.proc.pid)
            try:
                with pytest.raises(TransportTimeoutError):
                    client.step(0)
                observe = schema.ir.messages["OBSERVE_REQ"].id
                with pytest.raises(TransportTimeoutError):  # not sent: the step stays in its slot
                    client.channel.request(observe, b"")
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            observation = [float(x) for x in client.step(0, copy=True).observation]
        finally:
            client.close()
        assert observation == pytest.approx(_expected_observation(server.url))
