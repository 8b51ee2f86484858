"""transport-serve and transport-schema on misuse: each refused at start, in one line.

- ``--seed`` outside u64 (env i gets seed + i, so seed + N - 1 must fit too) is a usage error
  (exit 2) before anything is served, through ``--lang node`` too; the largest seed serves.
- ``--env ./my_env.js:F`` without ``--lang node`` says to add it; ``--env ./envs/robo.py:F`` says
  how to name a Python module.
- ``--gym ID --env echo`` is refused like any other ``--env`` with ``--gym``.
- ``transport-schema compile --check`` prints a command that writes where the checked command
  compiled to (its --python-out and --ts-out, shell-quoted).
- ``transport-schema from-gym`` on a ``Discrete(2**40)`` action (no start) says why.

The serve rows run the real CLI in a process with a short timeout: a CLI that served instead of
refusing fails on the timeout (its socket lives in a folder the test removes).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import transport
from transport.tools import schema_cli

from .servers import ROOT

SEED_LIMIT = 2**64


@pytest.fixture
def place() -> Iterator[Path]:
    """A short folder under /tmp (a unix socket path has ~100 bytes), removed afterwards."""
    here = Path(tempfile.mkdtemp(prefix="tcm-", dir="/tmp"))
    yield here
    shutil.rmtree(here, ignore_errors=True)


def serve_cli(*args: str | Path, cwd: Path = ROOT, timeout: float = 30) -> tuple[int, str]:
    """Run transport-serve; (exit status, its one stderr line). Serving instead fails."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "transport.tools.serve_cli", *map(str, args)],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"it served instead of refusing: {exc.stdout!r} {exc.stderr!r}")
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert not done.stdout.startswith("ready"), done.stdout
    return done.returncode, lines[0]


# -- --seed: a u64, and seed + N - 1 too --------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seed", "-1"], f"--seed must be 0..{SEED_LIMIT - 1}, not -1 (seeds are u64"),
        ([f"--seed={SEED_LIMIT}"], f"--seed must be 0..{SEED_LIMIT - 1}, not {SEED_LIMIT} ("),
        (
            ["--seed", str(SEED_LIMIT - 1), "--num-envs", "2"],
            f"--seed must be 0..{SEED_LIMIT - 2}, not {SEED_LIMIT - 1} (",
        ),
        (["--seed", "-5", "--lang", "node"], f"--seed must be 0..{SEED_LIMIT - 1}, not -5"),
    ],
)
def test_a_seed_outside_u64_is_refused_at_start(place: Path, args: list[str], message: str) -> None:
    status, line = serve_cli(f"unix://{place}/s.sock", "--env", "echo", *args)
    assert status == 2, line
    assert line.startswith(f"transport-serve: error: {message}"), line


def test_a_seed_outside_u64_is_refused_with_gym(place: Path) -> None:
    pytest.importorskip("gymnasium")
    status, line = serve_cli(f"unix://{place}/s.sock", "--gym", "CartPole-v1", "--seed", "-1")
    assert status == 2 and "--seed must be 0.." in line, line


def test_the_largest_seed_of_n_envs_serves(place: Path) -> None:
    url = f"unix://{place}/s.sock"
    command = [sys.executable, "-m", "transport.tools.serve_cli", url, "--env", "echo"]
    command += ["--num-envs", "2", "--seed", str(SEED_LIMIT - 2)]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert line == f"ready {url}\n", proc.stderr.read().decode() if proc.stderr else ""
        with transport.connect(url) as client:
            client.reset()  # unseeded: env 1 gets 2**64 - 1
            assert client.step([1, 2]).observation[:, 0].tolist() == [1, 2]
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


# -- --env: a JavaScript module or a path without --lang node -----------------------------------


def test_a_javascript_env_without_lang_node_says_to_add_it(place: Path) -> None:
    (place / "robo_env.js").write_text("module.exports = { Robo: class {} };\n")
    status, line = serve_cli(f"unix://{place}/s.sock", "--env", "./robo_env.js:Robo", cwd=place)
    assert status == 2, line
    head = "transport-serve: error: --env './robo_env.js:Robo': cannot import ./robo_env.js: "
    assert line.startswith(head), line
    assert "it is a JavaScript module: serve it with --lang node" in line
    assert "relative import" not in line


def test_a_python_path_says_how_to_name_the_module(place: Path) -> None:
    (place / "envs").mkdir()
    (place / "envs" / "robo.py").write_text("class Robo: ...\n")
    status, line = serve_cli(f"unix://{place}/s.sock", "--env", "./envs/robo.py:Robo", cwd=place)
    assert status == 2, line
    assert "a Python env is named by its module, package.module:Factory" in line, line
    assert "(here --env envs.robo:Robo, from the folder that holds it)" in line
    assert "needs --lang node" in line


# -- --gym with an explicit --env ---------------------------------------------------------------


@pytest.mark.parametrize("env", ["echo", "pac"])
def test_an_explicit_env_with_gym_is_refused(place: Path, env: str) -> None:
    pytest.importorskip("gymnasium")
    status, line = serve_cli(f"unix://{place}/s.sock", "--gym", "CartPole-v1", "--env", env)
    assert status == 2, line
    assert "--gym derives the schema from the env's spaces: drop --env and --schema" in line


# -- transport-schema compile --check: the hint writes where the check looked -------------------

SCHEMA = """\
[schema]
name = "mdgame"
version = 1

[structs.StepResult]
fields = [
  { name = "obs", type = "f32[4]", role = "observation" },
  { name = "reward", type = "REWARD", role = "reward" },
  { name = "done", type = "bool", role = "done" },
]

[structs.StepRequest]
fields = [{ name = "dials", type = "u8[3]", role = "action", low = [1, 0, 2], high = [3, 4, 5] }]

[env]
"""


def test_compile_check_repeats_the_output_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "md.toml").write_text(SCHEMA.replace("REWARD", "f64"))
    outs = ["--python-out", "gen/py", "--ts-out", "my gen/ts"]
    assert schema_cli.main(["compile", "md.toml", *outs]) == 0
    (tmp_path / "md.toml").write_text(SCHEMA.replace("REWARD", "f32"))
    capsys.readouterr()
    assert schema_cli.main(["compile", "md.toml", *outs, "--check"]) == 1
    hint = capsys.readouterr().err.splitlines()[-1]
    assert hint == "run: transport-schema compile md.toml --python-out gen/py --ts-out 'my gen/ts'"
    # the hint, run, makes the check pass (and writes nothing into the project's folders)
    assert schema_cli.main(shlex.split(hint.removeprefix("run: "))[1:]) == 0
    assert schema_cli.main(["compile", "md.toml", *outs, "--check"]) == 0


def test_compile_check_with_the_default_folders_names_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default folders are left out of the hint (as they were)."""
    line = schema_cli.compile_command(
        [Path("schema/a b.toml")], schema_cli.DEFAULT_PYTHON_OUT, schema_cli.DEFAULT_TS_OUT
    )
    assert line == "transport-schema compile 'schema/a b.toml'"


# -- transport-schema from-gym: a Discrete action too large, without a start --------------------


def test_from_gym_names_the_u32_limit_of_a_discrete_without_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    gymnasium = pytest.importorskip("gymnasium")
    from gymnasium import spaces

    class Huge(gymnasium.Env):  # type: ignore[misc,name-defined]
        observation_space = spaces.Box(0, 1, (2,), np.float32)

        def __init__(self, start: int = 0) -> None:
            self.action_space = spaces.Discrete(2**40, start=start)

    env_id = "TestCliMisuseHugeDiscrete-v0"
    if env_id not in gymnasium.registry:
        gymnasium.register(id=env_id, entry_point=Huge)
    assert schema_cli.main(["from-gym", env_id]) == 2
    err = capsys.readouterr().err
    assert "a Discrete action has at most 2**32 values (a u32), not 1099511627776" in err, err
    assert "with a start" not in err
    assert schema_cli.main(["from-gym", env_id, "--gym-kwargs", '{"start": 5}']) == 2
    assert "a Discrete action with a start must fit i32" in capsys.readouterr().err
