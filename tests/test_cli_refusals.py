"""Issue 22 item 7, issue 26 items 4 and 6: the command-line tools refuse bad input in one line.

Every row runs the real console script (``.venv/bin/transport-schema`` ...) in a subprocess with
a timeout: a FIFO or ``/dev/zero`` given as a schema must be refused at once, never read (a hang
or memory exhaustion would hit the timeout). Each refusal is exactly one line on stderr, no
traceback, no argparse usage block, and the exit status the tool documents.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from transport.errors import ConnectError, SchemaError

from .servers import ROOT, unique_unix_url

BIN = Path(sys.executable).parent
TETRIS = ROOT / "schema" / "tetris.toml"
NO_ENV_SCHEMA = """\
[schema]
name = "noenv"
version = 1

[structs.Thing]
fields = [{ name = "x", type = "u8" }]
"""


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder with a FIFO, a directory, an oversized file and a schema without [env]."""
    here = tmp_path_factory.mktemp("refusals")
    os.mkfifo(here / "fifo.toml")
    (here / "folder.toml").mkdir()
    with (here / "huge.toml").open("wb") as file:
        file.truncate((4 << 20) + 1)  # sparse: one byte over the 4 MiB cap
    (here / "noenv.toml").write_text(NO_ENV_SCHEMA)
    yield here


def run(tool: str, *args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """The console script ``tool`` with ``args``; a hang fails the test after 60 s."""
    command = [str(BIN / tool), *map(str, args)]
    if tool == "zmq-keygen":
        command = [sys.executable, "-m", "transport.backends.zmq", "keygen", *map(str, args)]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a refusal (no traceback, no usage block)."""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr and "usage:" not in done.stderr
    return lines[0]


# (tool, argv with {place} for the fixture folder, exit status, start of the stderr line)
REFUSALS: list[tuple[str, list[str], int, str]] = [
    (
        "transport-schema",
        [],
        2,
        "transport-schema: error: the following arguments are required: COMMAND "
        "(see transport-schema --help)",
    ),
    (
        "transport-schema",
        ["inspect", "{place}/fifo.toml"],
        2,
        "transport-schema: error: {place}/fifo.toml: cannot read schema: not a regular file "
        "(a FIFO)",
    ),
    (
        "transport-schema",
        ["inspect", "/dev/zero"],
        2,
        "transport-schema: error: /dev/zero: cannot read schema: not a regular file (a device)",
    ),
    (
        "transport-schema",
        ["inspect", "{place}/folder.toml"],
        2,
        "transport-schema: error: {place}/folder.toml: cannot read schema: not a regular "
        "file (a directory)",
    ),
    (
        "transport-schema",
        ["inspect", "{place}/huge.toml"],
        2,
        "transport-schema: error: {place}/huge.toml: cannot read schema: 4194305 bytes, over "
        "the 4194304-byte limit of a schema file",
    ),
    (
        "transport-schema",
        ["compile", "{place}/fifo.toml", "--check"],
        2,
        "transport-schema: error: {place}/fifo.toml: cannot read schema: not a regular file",
    ),
    (
        "transport-conformance",
        ["--testee", "'x"],
        2,
        'transport-conformance: error: argument --testee: "\'x": No closing quotation',
    ),
    (
        "transport-conformance",
        ["--timeout", "-5"],
        2,
        "transport-conformance: error: argument --timeout: must be a positive number of "
        "seconds, not '-5'",
    ),
    (
        "transport-conformance",
        ["--timeout", "nan"],
        2,
        "transport-conformance: error: argument --timeout: must be a positive number",
    ),
    ("transport-conformance", ["--only", ""], 2, "transport-conformance: error: argument --only"),
    (
        "transport-conformance",
        ["{place}/fifo.toml"],
        2,
        "transport-conformance: error: argument FILE: {place}/fifo.toml: cannot read schema: "
        "not a regular file (a FIFO)",
    ),
    (
        "transport-serve",
        ["--bogus"],
        2,
        "transport-serve: error: unrecognized arguments: --bogus (see transport-serve --help)",
    ),
    (
        "transport-serve",
        ["unix:///tmp/x.sock", "--env", "echo", "--schema", str(TETRIS)],
        2,
        "transport-serve: error: --env echo speaks schema pac_env (7f1be4e3b718a454), not "
        f"tetris (c39db8b06055a524) of --schema {TETRIS}: every step would fail",
    ),
    (
        "transport-serve",
        ["unix:///tmp/x.sock", "--env", "contract", "--schema", "{place}/noenv.toml"],
        2,
        "transport-serve: error: {place}/noenv.toml: schema noenv has no [env] table",
    ),
    (
        "transport-serve",
        ["unix:///tmp/x.sock", "--env", "contract", "--schema", "{place}/fifo.toml"],
        2,
        "transport-serve: error: {place}/fifo.toml: cannot read schema: not a regular file",
    ),
    (
        "transport-serve",
        ["unix:///tmp/x.sock", "--env", "echo", "--schema", "/dev/zero"],
        2,
        "transport-serve: error: /dev/zero: cannot read schema: not a regular file (a device)",
    ),
    (
        "zmq-keygen",
        ["{place}/keys", "--name", "../evil"],
        2,
        "python -m transport.backends.zmq keygen: error: argument --name: key name '../evil' "
        "is not a plain name",
    ),
]


@pytest.mark.parametrize(
    ("tool", "argv", "status", "prefix"),
    REFUSALS,
    ids=[f"{tool}-{i}" for i, (tool, *_rest) in enumerate(REFUSALS)],
)
def test_each_tool_refuses_bad_input_in_one_line(
    place: Path, tool: str, argv: list[str], status: int, prefix: str
) -> None:
    done = run(tool, *(arg.replace("{place}", str(place)) for arg in argv), cwd=place)
    assert done.returncode == status, done.stderr
    assert one_line(done).startswith(prefix.replace("{place}", str(place))), done.stderr
    assert "ready" not in done.stdout


def test_keygen_writes_nothing_outside_its_folder(place: Path) -> None:
    done = run("zmq-keygen", place / "keys2", "--name", "ok", "--name", "../evil2")
    assert done.returncode == 2, done.stderr
    assert not (place / "evil2.key").exists() and not (place / "evil2.key_secret").exists()
    assert not (place / "keys2").exists()  # nothing made: the names are checked first


def test_the_schema_loader_refuses_a_fifo_without_reading_it(place: Path) -> None:
    """The loader itself (every caller, not only the CLIs' argument type) opens non-blocking
    and refuses a FIFO; in a subprocess, so a regression fails on the timeout, not a hang."""
    code = (
        "import sys, transport\n"
        "from transport.errors import SchemaError\n"
        "try:\n"
        "    transport.load_schema(sys.argv[1])\n"
        "except SchemaError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(place / "fifo.toml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip().endswith("cannot read schema: not a regular file (a FIFO)")


def test_the_schema_loader_caps_the_size() -> None:
    from transport.schema import load_schema

    with pytest.raises(SchemaError, match="not a regular file \\(a device\\)"):
        load_schema("/dev/zero")


def test_every_usage_error_is_one_line_with_a_help_hint(place: Path) -> None:
    for tool, args in [
        ("transport-schema", ["inspect"]),
        ("transport-schema", ["frobnicate"]),
        ("transport-conformance", ["--count", "x"]),
        ("transport-serve", ["--num-envs"]),
        ("zmq-keygen", []),
    ]:
        done = run(tool, *args, cwd=place)
        assert done.returncode == 2, (tool, args, done.stderr)
        assert one_line(done).endswith("--help)"), (tool, args, done.stderr)


# -- compile writes all or nothing, never over a file it did not generate ------------------------


def test_compile_never_overwrites_a_hand_written_init_or_index(tmp_path: Path) -> None:
    for folder, name in [("py", "__init__.py"), ("ts", "index.ts")]:
        out = tmp_path / name.replace(".", "_")
        (out / folder).mkdir(parents=True)
        mine = out / folder / name
        mine.write_text("# my own package file\n")
        done = run(
            "transport-schema",
            "compile",
            TETRIS,
            "--python-out",
            out / "py",
            "--ts-out",
            out / "ts",
        )
        assert done.returncode == 2, done.stderr
        assert one_line(done).startswith(
            f"transport-schema: error: {mine}: exists and was not generated by transport-schema"
        )
        assert mine.read_text() == "# my own package file\n"
        assert sorted(p.name for p in out.rglob("*") if p.is_file()) == [name]


def test_compile_leaves_nothing_when_a_later_target_fails(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("a file where a folder should be\n")
    done = run(
        "transport-schema",
        "compile",
        TETRIS,
        ROOT / "schema" / "pac_env.toml",
        "--python-out",
        tmp_path / "py",
        "--ts-out",
        tmp_path / "blocker" / "ts",
    )
    assert done.returncode == 2, done.stderr
    assert one_line(done).startswith("transport-schema: error: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker"]  # no py/ left behind


def test_compile_rewrites_its_own_files(tmp_path: Path) -> None:
    args = ["compile", TETRIS, "--python-out", tmp_path / "py", "--ts-out", tmp_path / "ts"]
    assert run("transport-schema", *args).returncode == 0
    (tmp_path / "ts" / "index.ts").write_text("// Generated by `transport-schema compile` x\n")
    done = run("transport-schema", *args, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["written"] == [str(tmp_path / "ts" / "index.ts")]


# -- URL parameters ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "zmq+ipc:///tmp/x.zmq?heartbeat=-1",
        "zmq+ipc:///tmp/x.zmq?heartbeat=nan",
        "zmq+ipc:///tmp/x.zmq?heartbeat=inf",
        "zmq+ipc:///tmp/x.zmq?heartbeat=1&heartbeat=0",
        "zmq+tcp://127.0.0.1:5555?allow_insecure=1&allow_insecure=0",
    ],
)
def test_zmq_urls_refuse_bad_heartbeats_and_repeats(url: str) -> None:
    from transport.backends.zmq.wire import parse_url

    with pytest.raises(ConnectError, match=r"heartbeat=|more than once"):
        parse_url(url)


def test_zmq_heartbeat_zero_and_positive_are_kept() -> None:
    from transport.backends.zmq.wire import _heartbeat_ms, parse_url

    assert _heartbeat_ms(parse_url("zmq+ipc:///tmp/x.zmq?heartbeat=0")) == 0
    assert _heartbeat_ms(parse_url("zmq+ipc:///tmp/x.zmq?heartbeat=2.5")) == 2500
    assert _heartbeat_ms(parse_url("zmq+ipc:///tmp/x.zmq")) == 1000


@pytest.mark.parametrize("query", ["?foo=1", "?", "?mode=0600&mode=0600"])
def test_unix_urls_take_no_parameters(query: str) -> None:
    from transport.backends.unix import socket_path

    with pytest.raises(ConnectError, match=r"unix:// URLs take none|more than once"):
        socket_path(f"unix:///tmp/x.sock{query}")
    assert socket_path("unix:///tmp/x.sock") == "/tmp/x.sock"


def test_http_and_auto_urls_refuse_repeated_parameters() -> None:
    from transport.backends.auto import candidates
    from transport.backends.http.wire import parse_url

    with pytest.raises(ConnectError, match="'allow_remote' is given more than once"):
        parse_url("http://127.0.0.1:0?allow_remote=1&allow_remote=0", listener=True)
    with pytest.raises(ConnectError, match="'port' is given more than once"):
        candidates("auto://name?port=1&port=2")


def test_serve_refuses_a_unix_url_with_parameters(place: Path) -> None:
    url = unique_unix_url()
    done = run("transport-serve", f"{url}?foo=1", "--env", "echo", cwd=place)
    assert done.returncode == 1, done.stderr
    assert "unknown parameter(s) foo (unix:// URLs take none)" in one_line(done)
    assert not Path(url.removeprefix("unix://")).exists()
    assert not Path(url.removeprefix("unix://") + "?foo=1").exists()


# -- transport-serve --env mod:Factory from the current folder (issue 26 item 6) -------------------


def test_serve_imports_a_user_module_from_the_current_folder(tmp_path: Path) -> None:
    """The console script finds ``mod`` in the current folder, as ``python -m`` does."""
    module = f"cwd_env_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from transport.envs.echo import EchoEnv as Factory\n"
        "from transport.generated.pac_env import SCHEMA\n"
    )
    url = unique_unix_url()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen(
        [str(BIN / "transport-serve"), url, "--env", f"{module}:Factory"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline() if ready else ""
        assert line.startswith("ready "), line + (proc.stderr.read() if proc.poll() else "")
    finally:
        proc.terminate()  # SIGTERM: the server closes and removes its socket file
        proc.wait(timeout=30)
    assert not Path(url.removeprefix("unix://")).exists()


def test_serve_lang_node_reads_a_toml_schema(tmp_path: Path) -> None:
    """Issue 26 item 4: the --help example ``--lang node --schema grid.toml`` serves (the wrapper
    tells Node where transport-schema is, even when it is not on PATH)."""
    from .servers import require_lang

    require_lang("node")
    import transport

    (tmp_path / "grid.toml").write_text(TETRIS.read_text())
    url = unique_unix_url()
    env = {k: v for k, v in os.environ.items() if k != "TRANSPORT_SCHEMA_CLI"}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != BIN
    )
    command = [str(BIN / "transport-serve"), url, "--lang", "node", "--env", "contract"]
    proc = subprocess.Popen(
        [*command, "--schema", "grid.toml"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline() if ready else ""
        assert line.startswith("ready "), line + (proc.stderr.read() if proc.poll() else "")
        with transport.connect(url, timeout=10) as client:
            assert client.schema.name == "tetris"
            client.reset(seed=1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert not Path(url.removeprefix("unix://")).exists()
