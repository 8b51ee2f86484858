"""transport-serve with a user's own env: --env package.module:Factory and --schema FILE."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import transport

from .servers import ROOT, ServerProcess, unique_url

TETRIS = ROOT / "schema" / "tetris.toml"

USER_MODULE = textwrap.dedent(
    """
    import numpy as np
    from transport.envs.echo import Spaces


    class Counter:
        '''Counts steps in observation[0]; the action lands in observation[1].'''

        def __init__(self):
            self.t = 0

        def spaces(self):
            return Spaces(214, 40)

        def _result(self, action):
            obs = np.zeros(214, dtype=np.float32)
            obs[0], obs[1] = self.t, action
            return {
                "observation": obs, "action_mask": np.ones(40, dtype=np.uint8),
                "reward": 1.0, "done": 0, "truncated": 0, "lines": 0, "piece": 0,
                "total_lines": 0, "pieces": self.t,
            }

        def reset(self, seed=None):
            self.t = 0
            return self._result(0)

        def step(self, action):
            self.t += 1
            return self._result(action)
    """
)


@pytest.fixture
def user_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    package = tmp_path / "mygame"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "envs.py").write_text(USER_MODULE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return "mygame.envs"


def serve_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "transport.tools.serve_cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_user_factory_is_served_with_its_schema(user_package: str) -> None:
    extra = ["--schema", str(TETRIS)]
    with ServerProcess(
        unique_url("unix"), env=f"{user_package}:Counter", num_envs=2, extra=extra
    ) as server:
        with transport.connect(server.url, TETRIS) as client:
            assert client.num_envs == 2 and client.server_info["env"] == "Counter"
            client.reset(seed=1)
            result = client.step(np.array([3, 4]))
            assert result.observation[:, 0].tolist() == [1.0, 1.0]
            assert result.observation[:, 1].tolist() == [3.0, 4.0]


def test_a_user_factory_without_a_schema_is_a_usage_error(user_package: str) -> None:
    done = serve_cli(unique_url("unix"), "--env", f"{user_package}:Counter")
    assert done.returncode == 2
    assert "--schema FILE" in done.stderr and "SCHEMA attribute" in done.stderr


def test_an_unknown_module_or_factory_is_a_usage_error(user_package: str) -> None:
    missing = serve_cli(unique_url("unix"), "--env", "nosuchpackage.envs:Env")
    assert missing.returncode == 2 and "cannot import nosuchpackage.envs" in missing.stderr
    no_attr = serve_cli(unique_url("unix"), "--env", f"{user_package}:Nothing", "--schema", "x")
    assert no_attr.returncode == 2 and "has no callable Nothing" in no_attr.stderr
    bare = serve_cli(unique_url("unix"), "--env", "nonsense")
    assert bare.returncode == 2 and "not a reference env" in bare.stderr


def test_help_shows_the_factory_forms() -> None:
    done = serve_cli("--help")
    assert done.returncode == 0
    assert "package.module:Factory" in done.stdout and "--schema" in done.stdout
