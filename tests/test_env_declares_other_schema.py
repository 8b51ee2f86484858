"""An env that declares one schema (``SCHEMA = v1``) served with another (``--schema v2``).

Its results follow v1, so every reset would fail with "returned bad values". The server refuses
it at start instead, naming both schemas and fingerprints: ``transport-serve`` (Python and Node)
exits 2 before ``ready``, ``transport.Server`` raises. A v1 record given to a v2 codec is called
a record of another struct layout, not "not ndarray".
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import transport
from transport.errors import ValueTypeError

from .servers import ROOT, require_lang

V1 = """\
[schema]
name = "myenv"
version = 1

[env]

[structs.StepResult]
fields = [
  { name = "observation", type = "f32[4]", role = "observation" },
  { name = "reward", type = "f32", role = "reward" },
  { name = "done", type = "bool", role = "done" },
]

[structs.StepRequest]
fields = [{ name = "action", type = "u8", role = "action" }]
"""
V2 = V1.replace(
    '{ name = "done", type = "bool", role = "done" },',
    '{ name = "done", type = "bool", role = "done" },\n  { name = "score", type = "i32" },',
)

MODULE = textwrap.dedent(
    """
    from pathlib import Path

    import transport
    from transport.runtime.env import Spaces

    V1 = transport.load_schema(Path(__file__).with_name("v1.toml"))


    class Env:
        SCHEMA = V1

        def spaces(self):
            return Spaces(4, 2)

        def _result(self):
            return V1["StepResult"].zeros()

        def reset(self, seed=None):
            return self._result()

        def step(self, action):
            return self._result()


    def make():
        return Env()
    """
)

NODE_MODULE = """\
const { EchoEnv } = require(ECHO);
const { SCHEMA } = require(PAC);
class Env extends EchoEnv {}
Env.SCHEMA = SCHEMA;
exports.Env = Env;
exports.make = () => new Env();
"""


@pytest.fixture
def envs(tmp_path: Path) -> Path:
    (tmp_path / "v1.toml").write_text(V1)
    (tmp_path / "v2.toml").write_text(V2)
    (tmp_path / "myenvs.py").write_text(MODULE)
    return tmp_path


def _serve(cwd: Path, *args: str) -> tuple[int, str, str]:
    """transport-serve until it exits or says ready (then it is stopped): (code, out, err)."""
    url = f"unix:///tmp/transport-test-{uuid.uuid4().hex[:12]}.sock"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(cwd), str(ROOT)]))
    command = [sys.executable, "-m", "transport.tools.serve_cli", url, *args]
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()  # "ready URL", or "" when it exits
        if first.startswith("ready "):
            proc.terminate()
        out, err = proc.communicate(timeout=60)
        return proc.wait(), first + out, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _names_both(text: str, envs: Path) -> None:
    v1, v2 = (transport.load_schema(envs / f"v{n}.toml") for n in (1, 2))
    assert v1.fingerprint != v2.fingerprint
    assert f"{v1.fingerprint:016x}" in text and f"{v2.fingerprint:016x}" in text, text
    assert "myenv" in text and "SCHEMA" in text, text


@pytest.mark.parametrize("factory", ["Env", "make"])
def test_the_python_cli_refuses_an_env_of_another_schema(envs: Path, factory: str) -> None:
    code, out, err = _serve(envs, "--env", f"myenvs:{factory}", "--schema", "v2.toml")
    assert code == 2 and "ready" not in out, (out, err)
    _names_both(err, envs)


def test_the_python_cli_serves_the_env_with_its_own_schema(envs: Path) -> None:
    _, out, err = _serve(envs, "--env", "myenvs:Env", "--schema", "v1.toml")
    assert out.startswith("ready "), err


def test_the_library_server_refuses_it_too(envs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(envs))
    import myenvs  # type: ignore[import-not-found]

    url = f"unix:///tmp/transport-test-{uuid.uuid4().hex[:12]}.sock"
    v2 = transport.load_schema(envs / "v2.toml")
    for served in (myenvs.Env, myenvs.make, functools.partial(myenvs.Env), myenvs.Env()):
        with pytest.raises(ValueError) as info:
            transport.Server(served, url, schema=v2)
        _names_both(str(info.value), envs)
    assert not Path(url[len("unix://") :]).exists()


def test_a_record_of_another_version_is_named_so(envs: Path) -> None:
    v1, v2 = (transport.load_schema(envs / f"v{n}.toml") for n in (1, 2))
    with pytest.raises(ValueTypeError) as info:
        v2["StepResult"].encode(v1["StepResult"].zeros())
    text = str(info.value)
    assert "another struct layout" in text and "lacks score" in text, text
    assert "not ndarray" not in text
    with pytest.raises(ValueTypeError, match="not list"):
        v2["StepResult"].encode([1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize("factory", ["Env", "make"])
def test_the_node_cli_refuses_an_env_of_another_schema(tmp_path: Path, factory: str) -> None:
    require_lang("node")
    dist = ROOT / "node_bridge" / "dist"
    module = NODE_MODULE.replace("ECHO", repr(str(dist / "envs" / "echo.js")))
    module = module.replace("PAC", repr(str(dist / "generated" / "pac_env.js")))
    (tmp_path / "myenv.js").write_text(module)
    tetris = ROOT / "schema" / "tetris.toml"
    code, out, err = _serve(
        tmp_path, "--lang", "node", "--env", f"{tmp_path / 'myenv.js'}:{factory}",
        "--schema", str(tetris),
    )  # fmt: skip
    assert code == 2 and "ready" not in out, (out, err)
    pac = transport.load_schema(ROOT / "schema" / "pac_env.toml")
    given = transport.load_schema(tetris)
    assert f"{pac.fingerprint:016x}" in err and f"{given.fingerprint:016x}" in err, err
    assert "pac_env" in err and "tetris" in err and "SCHEMA" in err, err
