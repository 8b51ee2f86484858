"""`transport-serve --workers K --step-timeout S` (both languages): a worker stuck in an env's
step is replaced after S seconds and its envs fail with ENV_ERROR naming the step timeout; the
client goes on. A bad value is a usage error (exit 2)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import transport
from transport.errors import EnvError

from .servers import ROOT, ServerProcess, require_lang, unique_url

PYTHON_ENV = """\
import time
from transport.envs.echo import EchoEnv
from transport.generated import pac_env

class Stuck(EchoEnv):
    SCHEMA = pac_env.SCHEMA

    def step_into(self, action, out):
        if int(action) == 7:  # this worker's env never returns
            while True:
                time.sleep(0.05)
        super().step_into(action, out)
"""

NODE_ENV = """\
const { EchoEnv } = require(ECHO);
class Stuck extends EchoEnv {
  stepInto(action, out) {
    if (action === 7) for (;;) {}
    super.stepInto(action, out);
  }
}
exports.Stuck = Stuck;
"""


@pytest.mark.parametrize("lang", ["python", "node"])
def test_a_stuck_worker_is_replaced_after_the_step_timeout(
    tmp_path: Path, lang: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_lang(lang)
    if lang == "python":
        (tmp_path / "stuck_env.py").write_text(PYTHON_ENV)
        monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{ROOT}")
        env = "stuck_env:Stuck"
    else:
        echo = ROOT / "node_bridge" / "dist" / "envs" / "echo.js"
        (tmp_path / "stuck.js").write_text(NODE_ENV.replace("ECHO", repr(str(echo))))
        env = f"{tmp_path / 'stuck.js'}:Stuck"
    extra = ["--workers", "2", "--step-timeout", "1.5"]
    with ServerProcess(unique_url("unix"), env=env, lang=lang, num_envs=2, extra=extra) as server:
        with transport.connect(server.url, timeout=30) as client:
            client.reset(1)
            started = time.monotonic()
            with pytest.raises(EnvError, match="did not answer within the step timeout"):
                client.step(np.array([0, 7]))
            assert time.monotonic() - started < 20  # the step timeout, not the client's
            client.reset(2)
            client.step(np.array([0, 1]))


@pytest.mark.parametrize("lang", ["python", "node"])
def test_a_bad_step_timeout_is_a_usage_error(lang: str) -> None:
    require_lang(lang)
    command = [sys.executable, "-m", "transport.tools.serve_cli", unique_url("unix")]
    done = subprocess.run(
        [*command, "--lang", lang, "--workers", "2", "--step-timeout", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 2 and "--step-timeout" in done.stderr, done.stderr
