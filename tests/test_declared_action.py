"""An env whose spaces() disagree with the Discrete action a gymnasium-derived schema declares
is refused at start, by both servers: the runtime checked actions against the env's act_n while
clients described the schema's Discrete(2), so action 5 reached the env (exploration 21)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import transport
from transport.errors import RemoteError
from transport.gym_serve import gym_schema_toml
from transport.protocol import ErrorCode

from .servers import ROOT, ServerProcess, require_lang, unique_url

PYTHON_ENV = """\
import numpy as np
from transport.runtime import Spaces

class Cart:
    act_n = 2

    def spaces(self):
        return Spaces(obs_n=4, act_n=self.act_n)

    def reset(self, seed=None):
        zeros = np.zeros(4, np.float32)
        return {"observation": zeros, "reward": 0.0, "terminated": False, "truncated": False}

    def step(self, action):
        return self.reset()

class Wrong(Cart):
    act_n = 9
"""

NODE_ENV = """\
class Cart {
  spaces() { return { obsN: 4, actN: this.actN ?? 2 }; }
  reset() {
    return { observation: new Float32Array(4), reward: 0, terminated: false, truncated: false };
  }
  step() { return this.reset(); }
}
class Wrong extends Cart { get actN() { return 9; } }
module.exports = { Cart, Wrong };
"""


@pytest.fixture()
def schema_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The derived CartPole schema, beside the env modules (importable by the servers)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(ROOT)]))
    path = tmp_path / "cartpole.toml"
    path.write_text(gym_schema_toml("CartPole-v1"))
    (tmp_path / "cart_envs.py").write_text(PYTHON_ENV)
    (tmp_path / "cart_envs.js").write_text(NODE_ENV)
    return path


def serve_args(schema_file: Path, lang: str, name: str) -> tuple[str, list[str]]:
    module = "cart_envs" if lang == "python" else str(schema_file.parent / "cart_envs.js")
    return f"{module}:{name}", ["--schema", str(schema_file)]


@pytest.mark.parametrize("lang", ["python", "node"])
def test_an_env_saying_another_act_n_is_refused_at_start(schema_file: Path, lang: str) -> None:
    require_lang(lang)
    env, extra = serve_args(schema_file, lang, "Wrong")
    command = [sys.executable, "-m", "transport.tools.serve_cli", unique_url("unix")]
    done = subprocess.run(
        [*command, "--env", env, "--lang", lang, "--num-envs", "2", *extra],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode != 0 and done.stdout == "", done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    act_n = "act_n" if lang == "python" else "actN"
    assert (
        f"the env's spaces() say {act_n}=9, but schema CartPole_v1 declares the action "
        f"Discrete(2): return {act_n}=2" in done.stderr
    )


@pytest.mark.parametrize("lang", ["python", "node"])
def test_the_declared_range_is_the_one_checked(schema_file: Path, lang: str) -> None:
    require_lang(lang)
    env, extra = serve_args(schema_file, lang, "Cart")
    with ServerProcess(unique_url("unix"), env=env, lang=lang, num_envs=2, extra=extra) as server:
        with transport.connect(server.url) as client:
            client.reset(1)
            with pytest.raises(RemoteError) as caught:
                client.step([5, 5])
            assert caught.value.code == ErrorCode.INVALID_ACTION
            assert "outside 0..1" in str(caught.value)
