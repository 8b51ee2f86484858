"""transport-schema as a user runs it: a real process, its stdout, stderr and exit status."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = sorted((ROOT / "schema").glob("*.toml"))


def run(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "transport.tools.schema_cli", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_inspect_json_reports_seed_layouts() -> None:
    result = run("inspect", "schema/pac_env.toml", "--json")
    assert result.returncode == 0, result.stderr
    ir: dict[str, Any] = json.loads(result.stdout)
    assert set(ir) >= {"name", "version", "fingerprint", "structs", "enums", "messages"}
    assert len(ir["fingerprint"]) == 16 and int(ir["fingerprint"], 16) >= 0
    step = ir["structs"]["StepResult"]
    assert step["size"] == 2557
    fields = {f["name"]: f for f in step["fields"]}
    assert fields["observation"] == {
        "name": "observation",
        "type": "f32[612]",
        "offset": 0,
        "size": 2448,
        "count": 612,
        "role": "observation",
    }
    assert fields["actions_this_turn"]["offset"] == 2556
    assert ir["messages"]["HELLO_REQ"] == {"id": 13, "body": "Hello", "tail": "msgpack"}
    shm = json.loads(run("inspect", "schema/pac_shm.toml", "--json").stdout)
    assert shm["structs"]["ControlBlock"]["size"] == 64
    assert shm["structs"]["Slot"]["size"] == 5120
    slot = {f["name"]: f["offset"] for f in shm["structs"]["Slot"]["fields"]}
    assert (slot["observation"], slot["action_mask"]) == (32, 2480)


def test_inspect_table_shows_padding() -> None:
    result = run("inspect", "schema/mahjong_env.toml")
    assert result.returncode == 0
    assert "(padding)" in result.stdout
    assert "fingerprint" in result.stdout


def test_bad_schema_exits_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[schema]\nname = "bad"\n[structs.S]\nfields = [{ name = "x", type = "f33" }]\n')
    result = run("inspect", bad)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert str(bad) in lines[0] and "struct S" in lines[0] and "field x" in lines[0]


def test_help() -> None:
    result = run("--help")
    assert result.returncode == 0
    assert "inspect" in result.stdout and "compile" in result.stdout
    assert run().returncode == 2


def test_a_reader_that_stops_early_ends_it_quietly() -> None:
    """`transport-schema inspect | head`: no traceback, the exit status a shell gives `cat`."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write
    try:
        result = subprocess.run(
            [sys.executable, "-m", "transport.tools.schema_cli", "inspect", "schema/pac_env.toml"],
            cwd=ROOT,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert result.returncode == 141
    assert result.stderr == ""


def test_compile_writes_importable_modules_and_check_detects_staleness(tmp_path: Path) -> None:
    py_out, ts_out = tmp_path / "py", tmp_path / "ts"
    args = ["compile", *SCHEMAS, "--python-out", py_out, "--ts-out", ts_out]
    assert run(*args).returncode == 0
    assert run(*args, "--check").returncode == 0
    spec = importlib.util.spec_from_file_location("pac_env_gen", py_out / "pac_env.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from transport.schema import load_schema

    assert module.FINGERPRINT == load_schema(ROOT / "schema" / "pac_env.toml").fingerprint
    assert module.StepResult.size == 2557
    assert module.MsgType.HELLO_REQ == 0x0D
    assert (ts_out / "pac_env.ts").read_text().count("2540") >= 1
    (ts_out / "pac_env.ts").write_text("// edited by hand\n")
    stale = run(*args, "--check")
    assert stale.returncode == 1
    assert "pac_env.ts" in stale.stderr


def test_committed_generated_code_is_up_to_date() -> None:
    result = run("compile", *SCHEMAS, "--check")
    assert result.returncode == 0, result.stderr
