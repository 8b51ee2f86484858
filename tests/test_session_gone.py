"""A server restarted on the same URL under an old client: every later call of that client is a
PeerGoneError that says to connect again, in both client languages and against both servers.
Over zmq the client reconnects on its own and the new server answered HELLO_REQUIRED "send
HELLO_REQ first" to every call (exploration 22): a session the server no longer knows is gone."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

import transport
from transport.errors import PeerGoneError

from .servers import LANGS, ROOT, ServerProcess, require_lang, unique_url

BACKENDS = ["zmq+ipc", "zmq+tcp", "unix"]

NODE_CLIENT = """
const { connect } = require(process.argv[1]);
(async () => {
  const client = await connect(process.argv[2], { timeoutMs: 5000 });
  await client.reset(1n);
  await client.step(1);
  process.stdout.write("ready\\n");
  await new Promise((resolve) => process.stdin.once("data", resolve));
  const seen = [];
  for (let i = 0; i < 3; i++) {
    try {
      await client.step(1);
      seen.push(["ok", ""]);
    } catch (error) {
      seen.push([error.constructor.name, error.message]);
    }
  }
  process.stdout.write(JSON.stringify(seen) + "\\n");
  await client.close().catch(() => {});
  process.exit(0);
})();
"""


def restarted(url: str, lang: str) -> ServerProcess:
    """A new server on ``url`` (the old one's port or socket path just freed)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return ServerProcess(url, lang=lang)
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def assert_gone(kinds_and_texts: list[tuple[str, str]]) -> None:
    for kind, text in kinds_and_texts:
        assert kind == "PeerGoneError", kinds_and_texts
        assert "connect again" in text, text
        assert "send HELLO_REQ first" not in text or "no longer knows" in text, text


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_python_client_of_a_restarted_server(backend: str, lang: str) -> None:
    require_lang(lang)
    first = ServerProcess(unique_url(backend), lang=lang)
    url = first.url
    with first, transport.connect(url, timeout=5) as client:
        client.reset(1)
        client.step(1)
        first.terminate()
        with restarted(url, lang):
            seen = []
            for _ in range(3):
                with pytest.raises(PeerGoneError) as caught:
                    client.step(1)
                seen.append(("PeerGoneError", str(caught.value)))
            assert_gone(seen)
            with transport.connect(url, timeout=5) as again:  # a new client is served
                again.reset(1)
                again.step(1)


@pytest.mark.parametrize("backend", ["zmq+ipc", "zmq+tcp"])
def test_a_node_client_of_a_restarted_server(backend: str) -> None:
    require_lang("node")
    first = ServerProcess(unique_url(backend))
    url = first.url
    script = [
        "node",
        "-e",
        NODE_CLIENT,
        str(ROOT / "node_bridge" / "dist" / "index.js"),
        url,
    ]
    with first:
        node = subprocess.Popen(
            script, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            assert node.stdout is not None and node.stdin is not None
            assert node.stdout.readline().strip() == "ready", (
                node.stderr.read() if node.stderr else ""
            )
            first.terminate()
            with restarted(url, "python"):
                node.stdin.write("go\n")
                node.stdin.flush()
                line = node.stdout.readline()
                assert line, node.stderr.read() if node.stderr else ""
                assert_gone([(kind, text) for kind, text in json.loads(line)])
        finally:
            if node.poll() is None:
                node.kill()
            node.wait(10)
