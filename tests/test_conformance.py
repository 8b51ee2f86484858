"""The conformance suite: the runner itself, drift detection, the Node testee, codec round trips."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

import transport
from transport.conformance.paths import default_root, node_testee, schema_files
from transport.conformance.strategies import generate, struct_strategy
from transport.schema import load_schema
from transport.tools.conformance_cli import main

ROOT = default_root()
SCHEMAS = schema_files(ROOT)
PAC_ENV = ROOT / "schema" / "pac_env.toml"

DRIFT_TESTEE = '''
import sys
from transport.conformance.testee import Testee, main

class Drift(Testee):
    """Flips one bit of StepResult.reward (bytes 2540..2543) in every encoding."""

    def encode(self, schema, struct, values):
        data = super().encode(schema, struct, values)
        if struct == "StepResult":
            data = bytearray(data)
            data[2542] ^= 0x01
            data = bytes(data)
        return data

sys.exit(main(testee_class=Drift))
'''

STRICT_DRIFT_TESTEE = '''
import sys
from transport.conformance.testee import Testee, main

class Lenient(Testee):
    """Decodes non-strictly: accepts bool bytes other than 0/1 and non-canonical NaNs."""

    def decode(self, schema, struct, data, strict):
        return super().decode(schema, struct, data, False)

sys.exit(main(testee_class=Lenient))
'''


def _python_testee(script: Path) -> str:
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def test_runner_passes_against_the_python_testee(capsys: pytest.CaptureFixture[str]) -> None:
    """Every schema (found by default) through the testee protocol both ways. The golden,
    views and invalid checks against the Python testee run on pac_env in test_json_output; the
    Python side of every schema's golden and invalid cases in every run (./dev test runs one)."""
    only = ["--only", "fingerprint,python-testee,testee-python"]
    assert main(["--testee", "python", "--count", "10", *only]) == 0
    out = capsys.readouterr().out
    assert "total" in out and "0 failed" in out
    for schema in SCHEMAS:
        assert load_schema(schema).name in out


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--testee", "python", "--count", "10", "--json", str(PAC_ENV)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True
    (schema,) = doc["schemas"]
    assert schema["name"] == "pac_env"
    assert schema["fingerprint"] == load_schema(PAC_ENV).fingerprint_hex
    assert schema["checks"]["python->python-testee"]["structs"]["StepResult"]["ok"] == 10
    assert schema["failures"] == []


def test_drift_in_one_field_is_caught_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "drift_testee.py"
    script.write_text(DRIFT_TESTEE)
    argv = ["--testee", _python_testee(script), "--count", "20", str(PAC_ENV)]
    argv += ["--only", "golden,python-testee,testee-python"]  # the checks that see encodings
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out
    assert "FAIL pac_env StepResult" in out
    assert "field: reward" in out
    assert "first differing byte: offset 2542" in out
    assert "^^" in out  # the hex diff marks the byte

    assert main([*argv, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False
    fields = {f["field"] for f in doc["schemas"][0]["failures"]}
    assert "reward" in fields
    structs = {f["struct"] for f in doc["schemas"][0]["failures"]}
    assert structs == {"StepResult"}


def test_lenient_decoding_is_caught_by_the_invalid_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "lenient_testee.py"
    script.write_text(STRICT_DRIFT_TESTEE)
    argv = ["--testee", _python_testee(script), "--only", "invalid", "--json", str(PAC_ENV)]
    assert main(argv) == 1
    doc = json.loads(capsys.readouterr().out)
    failures = doc["schemas"][0]["failures"]
    assert failures and all(f["side"] == "python-testee" for f in failures)
    assert any("non_canonical" in "\n".join(f["details"]) for f in failures)


def test_a_testee_that_cannot_start_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--testee", str(tmp_path / "no-such-testee"), str(PAC_ENV)]) == 2
    assert "did not start" in capsys.readouterr().err


def test_a_missing_node_build_exits_2_and_says_how_to_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "schema").mkdir()
    shutil.copy(PAC_ENV, tmp_path / "schema")
    assert main(["--root", str(tmp_path)]) == 2
    assert "npm run build" in capsys.readouterr().err


def test_write_golden_reproduces_the_committed_files(tmp_path: Path) -> None:
    assert main(["--write-golden", "--golden-dir", str(tmp_path), str(PAC_ENV)]) == 0
    committed = ROOT / "conformance" / "golden" / "pac_env"
    written = sorted(p.name for p in (tmp_path / "pac_env").iterdir())
    assert written == sorted(p.name for p in committed.iterdir())
    for name in written:
        assert (tmp_path / "pac_env" / name).read_bytes() == (committed / name).read_bytes(), name


@pytest.mark.skipif(
    not node_testee(ROOT).exists(),
    reason="the Node testee is not built: cd node_bridge && npm ci && npm run build",
)
def test_the_node_testee_conforms(capsys: pytest.CaptureFixture[str]) -> None:
    """Every check on pac_env; every schema at --count 300: ./dev test, beside pytest."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    code = main(["--count", "10", str(PAC_ENV)])
    out = capsys.readouterr().out
    assert code == 0, out


USER_SCHEMA = """
[schema]
name = "my_env"
layout = "natural"

[enums.Phase]
type = "i16"
values = { START = -1, RUN = 0, END = 7 }

[structs.Cell]
fields = [{ name = "kind", type = "Phase" }, { name = "heat", type = "f64" }]

[structs.StepResult]
fields = [
  { name = "observation", type = "f32[3,4]",  role = "observation" },
  { name = "cells",       type = "Cell[3]" },
  { name = "reward",      type = "f32",       role = "reward" },
  { name = "done",        type = "bool",      role = "done" },
  { name = "tick",        type = "u64" },
  { name = "mask",        type = "bool[2,3]", role = "action_mask" },
]

[structs.StepRequest]
fields = [{ name = "action", type = "i16", role = "action" }]

[env]
seats = 3
"""


@pytest.mark.skipif(
    not node_testee(ROOT).exists() or shutil.which("node") is None,
    reason="the Node testee is not built (cd node_bridge && npm ci && npm run build) or no node",
)
def test_a_users_schema_is_checked_in_both_languages_without_a_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "my_env.toml"
    path.write_text(USER_SCHEMA)
    code = main(["--count", "60", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "golden         none in" in out and "(skipped)" in out
    assert "my_env       python->node" in out and "my_env       invalid" in out


@pytest.mark.skipif(
    not node_testee(ROOT).exists() or shutil.which("node") is None,
    reason="the Node testee is not built (cd node_bridge && npm ci && npm run build) or no node",
)
def test_codecs_loaded_from_the_ir_at_run_time_conform(
    capsys: pytest.CaptureFixture[str],
) -> None:
    testee = f"node {shlex.quote(str(node_testee(ROOT)))} --runtime"
    code = main(["--testee", testee, "--count", "10"])
    out = capsys.readouterr().out
    assert code == 0, out
    for schema in SCHEMAS:
        assert load_schema(schema).name in out


@pytest.mark.skipif(
    not node_testee(ROOT).exists() or shutil.which("node") is None,
    reason="the Node testee is not built (cd node_bridge && npm ci && npm run build) or no node",
)
def test_drift_in_the_node_views_alone_is_caught(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 17 item 5: two StepResultView getters with swapped offsets (encode and decode
    untouched) passed every check while a Node client read swapped values."""
    dist = tmp_path / "dist"
    shutil.copytree(node_testee(ROOT).parent.parent, dist)
    (tmp_path / "node_modules").symlink_to(ROOT / "node_bridge" / "node_modules")
    module = dist / "generated" / "pac_env.js"
    text = module.read_text()
    done = "get done() {\n        return this.#dv.getUint8(this.#at + 2544);"
    rank = "get rank() {\n        return this.#dv.getUint8(this.#at + 2545);"
    assert done in text and rank in text
    text = text.replace(done, "@done@").replace(rank, rank.replace("2545", "2544"))
    module.write_text(text.replace("@done@", done.replace("2544", "2545")))
    testee = f"node {shlex.quote(str(dist / 'conformance' / 'testee.js'))}"
    args = ["--testee", testee, "--count", "40", str(PAC_ENV)]
    assert main([*args, "--only", "python-testee,testee-python"]) == 0  # decode agrees
    capsys.readouterr()
    assert main([*args, "--only", "views"]) == 1
    out = capsys.readouterr().out
    assert "FAIL pac_env StepResult views: node's zero-copy view reads other values" in out
    assert "field: done" in out


STRUCTS = [(path, name) for path in SCHEMAS for name in load_schema(path).structs]


@pytest.mark.parametrize(("path", "struct"), STRUCTS, ids=[f"{p.stem}.{s}" for p, s in STRUCTS])
def test_python_codec_round_trips(path: Path, struct: str) -> None:
    """The Python codec alone, 10 examples a struct (the cost is linear in them); ./dev test's
    conformance run round-trips 300 a struct and direction through the Node codec and back."""
    ir = load_schema(path)
    codec = transport.Schema(ir)[struct]

    @settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
    @given(struct_strategy(ir, struct))
    def round_trip(values: dict[str, object]) -> None:
        data = codec.encode(values)
        assert len(data) == codec.size
        assert codec.encode(codec.decode(data)) == data

    round_trip()


def test_generated_fields_of_one_type_are_independent() -> None:
    """Hypothesis's first draws are the same for every column; the values must still differ."""
    ir = load_schema(default_root() / "schema" / "pac_env.toml")
    values = generate(ir, "StepResult", 100, seed=1)
    same = sum(1 for v in values if v["life"] == v["money"] == v["stage"])
    assert same < 10


def test_only_takes_the_check_names_as_printed(capsys: pytest.CaptureFixture[str]) -> None:
    """The rows print python->LANG and LANG->python: --only takes those names too."""
    only = ["--only", "python->python-testee,python-testee->python"]
    assert main(["--testee", "python", "--count", "3", "--json", *only, str(PAC_ENV)]) == 0
    (schema,) = json.loads(capsys.readouterr().out)["schemas"]
    assert sorted(schema["checks"]) == ["python->python-testee", "python-testee->python"]
    with pytest.raises(SystemExit):
        main(["--only", "node->node", str(PAC_ENV)])
    assert "unknown check 'node->node'" in capsys.readouterr().err
