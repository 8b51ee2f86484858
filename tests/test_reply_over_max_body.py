"""A reply larger than the client's ``max_body`` on every socket backend, from both client
languages: ``ReplyTooLargeError`` (a ``BadFrameError``) with the reply's size, the limit and how
to raise it, and the connection kept: the next call on the same client is answered.

Before: the http clients (Python and Node) and Node's unix and zmq clients raised a bare
``BadFrameError`` ("exceeds the maximum") with the "same version and schema" hint and closed the
connection (Node's zmq Dealer had libzmq's MAXMSGSIZE at max_body: the connection dropped).
shm:// has no ``max_body``: replies are written into fixed slots, so the limit is not used.
"""

from __future__ import annotations

import json
import subprocess

import pytest

import transport
from tests.servers import ROOT, ServerProcess, require_lang, unique_url
from transport import BadFrameError, ReplyTooLargeError

NUM_ENVS = 4
REPLY = NUM_ENVS * 2557  # a reset of the echo env: 4 packed StepResults (seed Appendix A)
LIMIT = 4096  # over the handshake's replies and a health reply, under a reset's
TIMEOUT = 10.0
ROUNDS = 2  # twice: a dropped reply left nothing behind in the stream

NODE_CLIENT = r"""
const { connect, ReplyTooLargeError, BadFrameError } = require("./node_bridge/dist/index.js");
const [url, maxBody, rounds] = JSON.parse(require("fs").readFileSync(0, "utf8"));
(async () => {
  const out = [];
  const client = await connect(url, { maxBody, timeoutMs: TIMEOUT_MS });
  try {
    for (let i = 0; i < rounds; i += 1) {
      try {
        await client.reset(1n);
        out.push({ type: "none" });
      } catch (error) {
        out.push({
          type: error.constructor.name,
          badFrame: error instanceof BadFrameError,
          typed: typeof ReplyTooLargeError === "function" && error instanceof ReplyTooLargeError,
          bodyLen: error.bodyLen ?? null,
          maxBody: error.maxBody ?? null,
          message: error.message,
        });
      }
      out.push({ health: await client.health() });
    }
  } finally {
    await client.close();
  }
  process.stdout.write(JSON.stringify(out));
})().catch((error) => {
  process.stdout.write(JSON.stringify([{ fatal: `${error.constructor.name}: ${error.message}` }]));
});
""".replace("TIMEOUT_MS", str(int(TIMEOUT * 1000)))


def _python_rounds(url: str) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    with transport.connect(url, max_body=LIMIT, timeout=TIMEOUT) as client:
        for _ in range(ROUNDS):
            try:
                client.reset(seed=1)
                out.append({"type": "none"})
            except BadFrameError as exc:
                out.append(
                    {
                        "type": type(exc).__name__,
                        "badFrame": True,
                        "typed": isinstance(exc, ReplyTooLargeError),
                        "bodyLen": getattr(exc, "body_len", None),
                        "maxBody": getattr(exc, "max_body", None),
                        "message": str(exc),
                    }
                )
            out.append({"health": client.health()})
    return out


def _node_rounds(url: str) -> list[dict[str, object]]:
    done = subprocess.run(
        ["node", "-e", NODE_CLIENT],
        input=json.dumps([url, LIMIT, ROUNDS]),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=ROUNDS * 2 * TIMEOUT + 30,
        check=True,
    )
    result: list[dict[str, object]] = json.loads(done.stdout)
    return result


def _rounds(lang: str, url: str) -> list[dict[str, object]]:
    if lang == "node":
        require_lang("node")
        return _node_rounds(url)
    return _python_rounds(url)


@pytest.mark.parametrize("lang", ["python", "node"])
@pytest.mark.parametrize("backend", ["unix", "zmq+ipc", "http"])
def test_a_reply_over_max_body_is_typed_and_the_connection_goes_on(backend: str, lang: str) -> None:
    with ServerProcess(unique_url(backend), num_envs=NUM_ENVS) as server:
        got = _rounds(lang, server.url)
    assert len(got) == 2 * ROUNDS, got
    for refused, after in zip(got[::2], got[1::2], strict=True):
        assert refused["type"] == "ReplyTooLargeError", got
        assert refused["typed"] and refused["badFrame"], got
        assert (refused["bodyLen"], refused["maxBody"]) == (REPLY, LIMIT), got
        text = str(refused["message"])
        assert text.startswith(f"{server.url}: the server's reply is {REPLY} bytes, "), text
        assert f"over this client's max_body of {LIMIT} bytes" in text, text
        assert "the reply was dropped: connect with a max" in text, text  # its own hint
        assert "disagree" not in text, text
        assert after == {"health": True}, got  # the same connection answers the next call


@pytest.mark.parametrize("lang", ["python", "node"])
def test_shm_has_no_max_body(lang: str) -> None:
    """shm:// replies live in fixed slots: a small max_body is not a limit there."""
    with ServerProcess(unique_url("shm"), num_envs=NUM_ENVS) as server:
        got = _rounds(lang, server.url)
    assert got == [{"type": "none"}, {"health": True}] * ROUNDS, got
