"""A compiled IR loaded at run time (``transport.load_schema("x.json")``, ``transport-serve
--schema x.json``, a discovered IR) is refused by the rules and words of the Node loader
(node_bridge/src/test/ir_json_checks.test.ts): a field of a type that is not a scalar, an enum or
a struct of the IR, a field outside its struct, an [env] naming a struct the IR lacks, a file
that is not an IR or names no fingerprint. Hand-edited IRs get their fingerprint recomputed, so
each reaches the rule it tests."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import transport
from transport.errors import ProtocolError, SchemaError
from transport.generated import pac_env
from transport.protocol import schema_from_ir_text
from transport.schema.ir import fingerprint_of

from .servers import ROOT, unique_url


def edited(
    edit: Callable[[dict[str, Any]], None], keep_fingerprint: bool = False
) -> dict[str, Any]:
    ir = copy.deepcopy(pac_env.IR)
    edit(ir)
    if not keep_fingerprint:
        layout = {k: v for k, v in ir.items() if k not in ("name", "version", "fingerprint")}
        ir["fingerprint"] = f"{fingerprint_of(layout):016x}"
    return ir


def field(ir: dict[str, Any], struct: str, name: str) -> dict[str, Any]:
    return next(f for f in ir["structs"][struct]["fields"] if f["name"] == name)


def refused(tmp_path: Path, ir: Any, words: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(ir))
    with pytest.raises(SchemaError, match=words) as caught:
        transport.load_schema(path)
    assert "\n" not in str(caught.value)


def test_a_field_of_an_unknown_type(tmp_path: Path) -> None:
    ir = edited(lambda d: field(d, "StepResult", "reward").update(type="f33"))
    refused(
        tmp_path,
        ir,
        r'IR of pac_env: field StepResult\.reward has type "f33", not a scalar type, an enum '
        r"or a struct of this IR$",
    )
    ir = edited(lambda d: field(d, "StepMultiResult", "results").update(type="Missing[8]"))
    refused(tmp_path, ir, r'field StepMultiResult\.results has type "Missing\[8\]"')


def test_a_field_outside_its_struct(tmp_path: Path) -> None:
    def grow(d: dict[str, Any]) -> None:
        d["structs"]["StepResult"]["size"] += 8

    refused(
        tmp_path,
        edited(grow),
        r"IR of pac_env: field StepMultiResult\.results \(StepResult\[8\] at offset 0\) ends at "
        r"byte 20520, outside struct StepMultiResult of 20456 bytes$",
    )
    ir = edited(lambda d: field(d, "StepResult", "reward").update(offset=-4))
    refused(tmp_path, ir, r"field StepResult\.reward \(f32 at offset -4\) starts before byte 0")


def test_an_env_naming_a_struct_the_ir_lacks(tmp_path: Path) -> None:
    ir = edited(lambda d: d["env"].update(result="Missing"))
    refused(
        tmp_path, ir, r"IR of pac_env: \[env\] result names struct Missing, which this IR lacks"
    )


def test_what_is_not_an_ir(tmp_path: Path) -> None:
    refused(tmp_path, [], r"not a schema IR: a JSON object \(transport-schema inspect --json\)")
    refused(
        tmp_path,
        edited(lambda d: d.pop("fingerprint"), True),
        r"IR of pac_env names no fingerprint",
    )
    stale = edited(lambda d: d.update(fingerprint="0123456789abcdef"), True)
    refused(tmp_path, stale, r"has fingerprint 0123456789abcdef but hashes to 7f1be4e3b718a454")


def test_an_ir_file_loads_as_its_toml_does(tmp_path: Path) -> None:
    path = tmp_path / "pac_env.json"
    path.write_text(json.dumps(pac_env.IR))
    assert (
        transport.load_schema(path).fingerprint
        == transport.load_schema(ROOT / "schema" / "pac_env.toml").fingerprint
    )


def test_a_discovered_ir_outside_its_struct_is_a_protocol_error() -> None:
    ir = edited(lambda d: field(d, "StepResult", "reward").update(offset=2556))
    with pytest.raises(ProtocolError, match="the server sent a schema IR that does not load: "):
        schema_from_ir_text(json.dumps(ir), int(ir["fingerprint"], 16), peer="the server")


def test_the_serve_cli_refuses_such_a_file_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "nested.json"
    path.write_text(json.dumps(edited(lambda d: d["structs"]["StepResult"].update(size=2565))))
    command = [sys.executable, "-m", "transport.tools.serve_cli", unique_url("unix")]
    done = subprocess.run(
        [*command, "--env", "pac", "--schema", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "outside struct StepMultiResult of 20456 bytes" in done.stderr
