"""An error a Node env throws outside any request (a timer's callback, a promise it did not
await) is logged and the Node server goes on serving, as a Python server logs an exception of
an env's own thread (exploration 21: the process exited, every client got PeerGoneError and
the socket file or shm segment was left behind)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import transport

from .servers import ROOT, ServerProcess, require_lang, unique_url

ENV = """\
const { PacEnv } = require(PAC);
class Stray extends PacEnv {
  step(action) {
    setTimeout(() => { throw new Error("a timer's error"); }, 0);
    Promise.reject(new Error("a promise nobody awaited"));
    return super.step(action);
  }
}
exports.Stray = Stray;
"""


@pytest.mark.parametrize("backend", ["unix", "shm"])
def test_a_stray_error_is_logged_and_serving_goes_on(tmp_path: Path, backend: str) -> None:
    require_lang("node")
    module = tmp_path / "stray.js"
    pac = json.dumps(str(ROOT / "node_bridge" / "dist" / "envs" / "pac.js"))
    module.write_text(ENV.replace("PAC", pac))
    with ServerProcess(unique_url(backend), env=f"{module}:Stray", lang="node") as server:
        with transport.connect(server.url) as client:
            client.reset(1)
            client.step(0)
            time.sleep(0.3)  # the timer fires, the rejection goes unhandled
            client.step(0)
        with transport.connect(server.url) as again:
            again.reset(2)
            again.step(0)
        assert server.proc.poll() is None
        assert server.terminate() == 0
        assert server.proc.stderr is not None
        log = server.proc.stderr.read()
    assert "an error escaped the env code outside a request (serving goes on)" in log
    assert "a timer's error" in log and "a promise nobody awaited" in log
