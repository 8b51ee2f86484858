"""Issue 17 item 7: both server CLIs refuse the same bad start-up input the same way.

The same arguments go to ``transport-serve ... --lang python``, ``transport-serve ... --lang
node`` (the Python wrapper checks --num-envs / --max-body ranges, then execs Node) and the Node
CLI itself (``node node_bridge/dist/cli/serve.js``, which applies every rule on its own); exit
codes and the ``transport-serve: error:`` lines must agree (the rules: docs/decisions.md
"Start-up validation"), and nothing is created.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .servers import NODE_SERVER, ROOT, ServerProcess, require_lang, unique_unix_url

REFUSED_LIMITS: list[tuple[list[str], str]] = [
    (["--max-body", "0"], "--max-body must be 1..4294967295 bytes, not 0"),
    (["--max-body", "-1"], "--max-body must be 1..4294967295 bytes, not -1"),
    (["--max-body", "4294967296"], "--max-body must be 1..4294967295 bytes, not 4294967296"),
    (["--max-body", "abc"], "argument --max-body: invalid int value: 'abc'"),
    (["--num-envs", "0"], "--num-envs must be 1..65536, not 0"),
    (["--num-envs", "-3"], "--num-envs must be 1..65536, not -3"),
    (["--num-envs", "65537"], "--num-envs must be 1..65536, not 65537"),
    (["--num-envs", "30000"], "is 153540004 bytes, over 67108864"),
    (["--num-envs", "30000", "--max-body", "153540003"], "is 153540004 bytes, over 153540003"),
    (
        ["--num-envs", "2", "--max-body", "32"],
        "a HELLO request is 33 bytes; raise max_body to at least 33",
    ),
]
"""(arguments after the URL and --env pac, a part of the error line); every row exits 2."""

BAD_SHM_NAMES = ["edges-newline\n", "edges\rname", "ed\x01ges", "ed\tges", "-edges", "é"]


def _error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("transport-serve: error:")]
    assert len(lines) == 1, f"expected one error line in {stderr!r}"
    assert "Traceback" not in stderr and "    at " not in stderr, stderr
    return lines[0]


def _run(command: list[str]) -> tuple[int, str]:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert not done.stdout.startswith("ready"), f"{command} started a server"
    return done.returncode, _error_line(done.stderr)


def _three_ways(url: str, args: list[str]) -> dict[str, tuple[int, str]]:
    """Exit code and error line of the Python CLI, the wrapper with --lang node, and Node's CLI."""
    require_lang("node")
    node = shutil.which("node")
    assert node is not None
    serve = [sys.executable, "-m", "transport.tools.serve_cli", url, "--env", "pac", *args]
    return {
        "python": _run([*serve, "--lang", "python"]),
        "wrapper-node": _run([*serve, "--lang", "node"]),
        "node": _run([node, str(NODE_SERVER), url, "--env", "pac", *args]),
    }


@pytest.mark.parametrize(("args", "message"), REFUSED_LIMITS)
def test_both_clis_refuse_bad_limits_alike(args: list[str], message: str) -> None:
    url = unique_unix_url()
    answers = _three_ways(url, args)
    for way, (code, line) in answers.items():
        assert code == 2, f"{way}: exit {code}: {line}"
        assert message in line, f"{way}: {line}"
    assert len({line for _, line in answers.values()}) == 1, answers
    assert not os.path.exists(url.partition("://")[2])


@pytest.mark.parametrize("name", BAD_SHM_NAMES)
def test_both_clis_refuse_bad_shm_names_alike(name: str) -> None:
    answers = _three_ways(f"shm://{name}", [])
    for way, (code, line) in answers.items():
        assert code == 1, f"{way}: exit {code}: {line}"  # a bad URL, like every other
        assert "the region name must be 1-201 characters" in line, f"{way}: {line}"
    # the same text after the quoted URL (Python quotes it with repr, Node with JSON)
    tails = {
        re.sub(r"^transport-serve: error: .*?: the region", "", line)
        for _, line in answers.values()
    }
    assert len(tails) == 1, answers
    leftovers = [entry for entry in os.listdir("/dev/shm") if "edges" in entry or "é" in entry]
    assert not leftovers, leftovers


@pytest.mark.parametrize("lang", ["python", "node"])
def test_limits_at_the_boundary_start_on_both(lang: str) -> None:
    """num_envs=2 with max_body=33 (the HELLO request's size: 12 + a 21-byte tail naming pac_env)
    serves on both sides (a client's HELLO over the maximum would be refused)."""
    import transport

    extra = ["--max-body", "33"]
    with ServerProcess(unique_unix_url(), env="pac", lang=lang, num_envs=2, extra=extra) as proc:
        with transport.connect(proc.url, timeout=10) as client:
            assert client.num_envs == 2
            client.reset(seed=1)


# -- issue 22 item 7: the same mistakes in the same words (one line, exit 2) ----------------------

NO_ENV_SCHEMA = (
    '[schema]\nname = "noenv"\nversion = 1\n\n[structs.A]\nfields = [{ name = "x", type = "u8" }]\n'
)

SAME_REFUSALS: list[tuple[list[str], str, bool]] = [
    (
        ["--env", "contract", "--schema", "{tmp}/missing.toml"],
        "{tmp}/missing.toml: cannot read schema: No such file or directory",
        True,
    ),
    (
        ["--env", "contract", "--schema", "{tmp}/folder.toml"],
        "{tmp}/folder.toml: cannot read schema: not a regular file (a directory)",
        True,
    ),
    (
        ["--env", "contract", "--schema", "{tmp}/fifo.toml"],
        "{tmp}/fifo.toml: cannot read schema: not a regular file (a FIFO)",
        True,
    ),
    (
        ["--env", "contract", "--schema", "{tmp}/noenv.toml"],
        "{tmp}/noenv.toml: schema noenv has no [env] table",
        True,
    ),
    (
        ["--env", "echo", "--schema", "schema/tetris.toml"],
        "--env echo speaks schema pac_env (7f1be4e3b718a454), not tetris",
        True,
    ),
    (
        ["--env", "echo", "--bogus"],
        "unrecognized arguments: --bogus (see transport-serve --help)",
        True,
    ),
    (
        ["--env", "echo", "--seed"],
        "argument --seed: expected one argument (see transport-serve --help)",
        True,
    ),
    (["--env", "os:system"], "--env ", False),
]
"""(arguments after the URL, the start of the text after ``transport-serve: error: ``, whether
the whole line is the same on both sides); every row exits 2 on both."""


@pytest.mark.parametrize(("args", "start", "identical"), SAME_REFUSALS)
def test_both_clis_refuse_the_same_mistakes_in_the_same_words(
    tmp_path: Path, args: list[str], start: str, identical: bool
) -> None:
    require_lang("node")
    os.mkfifo(tmp_path / "fifo.toml")
    (tmp_path / "folder.toml").mkdir()
    (tmp_path / "noenv.toml").write_text(NO_ENV_SCHEMA)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    url = unique_unix_url()
    node = shutil.which("node")
    assert node is not None
    env = {
        **os.environ,
        "TRANSPORT_SCHEMA_CLI": str(Path(sys.executable).with_name("transport-schema")),
    }
    serve = [sys.executable, "-m", "transport.tools.serve_cli", url, *args]
    answers = {
        "python": _run_env([*serve, "--lang", "python"], env),
        "wrapper-node": _run_env([*serve, "--lang", "node"], env),
        "node": _run_env([node, str(NODE_SERVER), url, *args], env),
    }
    prefix = "transport-serve: error: " + start.replace("{tmp}", str(tmp_path))
    for way, (code, line) in answers.items():
        assert code == 2, f"{way}: exit {code}: {line}"
        assert line.startswith(prefix), f"{way}: {line}"
    if identical:
        assert len({line for _, line in answers.values()}) == 1, answers
    assert not os.path.exists(url.partition("://")[2])


def _run_env(command: list[str], env: dict[str, str]) -> tuple[int, str]:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert not done.stdout.startswith("ready"), f"{command} started a server"
    assert len(done.stderr.splitlines()) == 1, done.stderr
    return done.returncode, _error_line(done.stderr)
