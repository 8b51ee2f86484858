"""A setup the server cannot serve fails when the server starts, with the reason, never as a
"ready" server that resets every connection (issue 12, item 7)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import transport
from transport.codec import Schema
from transport.envs.echo import EchoEnv
from transport.generated import tetris
from transport.schema.compiler import compile_schema
from transport.schema.ir import ir_from_json

from .servers import ROOT, unique_unix_url

TETRIS_TOML = Path(__file__).resolve().parents[1] / "schema" / "tetris.toml"


def continuous_action_schema() -> Schema:
    """tetris with a bool[2] action: the compiler refuses it in an [env] table, so the IR is
    edited after compiling (no fingerprint check): what a hand-made or foreign IR could hold.
    (f32[2], a Box action, is carried since issue 12 item 7.)"""
    data = tetris.SCHEMA.ir.to_json()
    data.pop("fingerprint")
    request = data["structs"]["StepRequest"]
    request["size"] = 2
    request["fields"][0].update(type="bool[2]", size=2, count=2)
    # the slot's copy of the request shrinks with it (the IR loader checks every size)
    next(f for f in data["structs"]["ShmSlot"]["fields"] if f["name"] == "request")["size"] = 2
    return Schema(ir_from_json(data))


def test_a_schema_without_the_env_protocol_fails_at_start() -> None:
    text = re.sub(r"\[env\].*?\n\n", "", TETRIS_TOML.read_text(), flags=re.S)
    schema = Schema(compile_schema(text, "no_env.toml"))
    with pytest.raises(transport.ProtocolError, match=r"schema tetris has no message .*\[env\]"):
        transport.Server(EchoEnv, unique_unix_url(), schema=schema)


def test_an_action_type_the_server_cannot_carry_fails_at_start() -> None:
    with pytest.raises(transport.ProtocolError, match=r"cannot carry the action .*bool\[2\]"):
        transport.Server(EchoEnv, unique_unix_url(), schema=continuous_action_schema())


def test_a_factory_that_cannot_be_pickled_for_workers_fails_at_start() -> None:
    with pytest.raises(ValueError, match="can be pickled") as info:
        transport.Server(lambda: EchoEnv(), unique_unix_url(), num_envs=2, workers=2)
    assert "lambda" in str(info.value)


class Broken:
    def __init__(self) -> None:
        raise RuntimeError("no GPU here")


def test_a_factory_that_cannot_make_an_env_fails_at_start() -> None:
    url = unique_unix_url()
    with pytest.raises(ValueError, match="making one failed: RuntimeError: no GPU here"):
        transport.Server(Broken, url)
    assert not Path(url.removeprefix("unix://")).exists()  # nothing was bound


def test_serve_fails_before_ready_and_the_cli_exits_with_the_reason() -> None:
    ready: list[str] = []
    with pytest.raises(ValueError, match="no GPU here"):
        transport.serve(Broken, unique_unix_url(), ready=ready.append)
    assert ready == []
    script = (
        "import transport, tests.test_server_setup as t\n"
        f"transport.serve(t.Broken, {unique_unix_url()!r}, ready=lambda u: print('ready', u))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "ready" not in done.stdout
    assert "no GPU here" in done.stderr


def test_serve_logs_one_line_with_url_schema_envs_and_pid() -> None:
    """Issue 15, item 6: a transport.serve() started from a script says what it serves."""
    import signal

    url = unique_unix_url()
    script = (
        "import transport\nfrom transport.envs.echo import EchoEnv\n"
        f"transport.serve(EchoEnv, {url!r}, num_envs=2,\n"
        "                ready=lambda u: print('ready', u, flush=True))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready ")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [line for line in err.splitlines() if line.startswith("transport: serving")]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"transport: serving {url}: schema pac_env (")
    assert "2 env(s) per connection (in this process)" in lines[0]
    assert lines[0].endswith(f"pid {proc.pid}")
