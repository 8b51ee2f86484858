"""One set of IR loading rules in Python and Node (exploration items 6, 7 and 10): a tampered IR
(fingerprint recomputed, so each reaches its rule) is refused by ``transport.load_schema`` with a
one-line ``SchemaError`` naming the file, the IR and the path of what is wrong, and Node's
``loadSchemaFile`` (node_bridge/dist) refuses it in the same words; a sweep of mutated IRs gets
the same answer from both loaders (refused in the same words, or loaded with the same
fingerprint); the servers refuse such a file before they serve, in one line."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import transport
from transport.codec import Schema
from transport.errors import ProtocolError, SchemaError
from transport.generated import gridworld, image_columns, pac_env, protocol
from transport.protocol import schema_from_ir_text
from transport.schema.ir import fingerprint_of, ir_from_json

from .servers import NODE_SERVER, ROOT, unique_url

DIST = ROOT / "node_bridge" / "dist"
HAVE_NODE = shutil.which("node") is not None and (DIST / "schema_file.js").is_file()
needs_node = pytest.mark.skipif(not HAVE_NODE, reason="node or node_bridge/dist is missing")

Edit = Callable[[dict[str, Any]], None]


def refingerprinted(ir: dict[str, Any]) -> dict[str, Any]:
    """``ir`` with the fingerprint of its (raw) layout, as a hand-editor would recompute it."""
    layout = {k: v for k, v in ir.items() if k not in ("name", "version", "fingerprint")}
    return {**ir, "fingerprint": f"{fingerprint_of(layout):016x}"}


def edited(edit: Edit, base: dict[str, Any] = pac_env.IR, keep: bool = False) -> dict[str, Any]:
    ir = copy.deepcopy(base)
    edit(ir)
    return ir if keep else refingerprinted(ir)


def field(ir: dict[str, Any], struct: str, name: str) -> dict[str, Any]:
    return next(f for f in ir["structs"][struct]["fields"] if f["name"] == name)


def at_reward(**values: Any) -> Edit:
    return lambda d: field(d, "StepResult", "reward").update(values)


P = "IR of pac_env: "
F = "structs.StepResult.fields[2]"  # reward
CASES: dict[str, tuple[Edit, bool, str]] = {
    "unknown_field_key": (
        at_reward(color="red"),
        False,
        P + f'unknown key "color" at {F} (an IR written by a newer transport? this one knows '
        "name, type, offset, size, count, role, shape, low, high, allow_nonfinite)",
    ),
    "unknown_field_key_stale": (
        at_reward(color="red"),
        True,
        P + f'unknown key "color" at {F} (an IR written by a newer transport?',
    ),
    "unknown_top_key": (
        lambda d: d.update(features={"x": 1}),
        False,
        P + 'unknown key "features" at the top level (an IR written by a newer transport? '
        "this one knows name, version, fingerprint, structs, enums, messages, env, shm, errors, "
        "http)",
    ),
    "offset_float": (at_reward(offset=16.0), False, P + f"{F}.offset is a float, not an integer"),
    "count_true": (at_reward(count=True), False, P + f"{F}.count is true, not an integer"),
    "count_float": (at_reward(count=1.0), False, P + f"{F}.count is a float, not an integer"),
    "shape_floats": (
        lambda d: field(d, "StepResult", "observation").update(shape=[2.0, 306.0]),
        False,
        P + "structs.StepResult.fields[0].shape[0] is a float, not an integer",
    ),
    "size_string": (at_reward(size="4"), False, P + f"{F}.size is a string, not an integer"),
    "offset_string": (at_reward(offset="16"), False, P + f"{F}.offset is a string, not an integer"),
    "type_unicode_digit": (
        lambda d: field(d, "StepResult", "observation").update(type="f32[\u0666\u0661\u0662]"),
        False,
        P + 'structs.StepResult.fields[0].type is "f32[\\u0666\\u0661\\u0662]", not a type such '
        'as "f32", "f32[612]" or "f32[2,5,5]" (ASCII digits, no spaces)',
    ),
    "count_wrong": (
        at_reward(count=2),
        False,
        P + "field StepResult.reward has count 2, but its type f32 has 1",
    ),
    "size_wrong": (
        at_reward(size=8),
        False,
        P + "field StepResult.reward has size 8, but 1 x f32 take 4 bytes",
    ),
    "no_fingerprint": (lambda d: d.pop("fingerprint"), True, "IR of pac_env names no fingerprint"),
    "integer_fingerprint": (
        lambda d: d.update(fingerprint=14614476047352059999),
        True,
        P + "fingerprint is an integer, not 16 lowercase hex digits",
    ),
    "shm_negative": (
        lambda d: d["shm"]["result_offsets"].update(observation=-64),
        False,
        P + "[shm] result_offsets.observation is -64: StepResult.observation (2448 bytes) would "
        "start before slot ShmSlot (5120 bytes), in the control block or another env's area",
    ),
    "shm_far": (
        lambda d: d["shm"]["result_offsets"].update(observation=10**9),
        False,
        P + "[shm] result_offsets.observation is 1000000000: StepResult.observation (2448 bytes) "
        "would end at byte 1000002448, past slot ShmSlot (5120 bytes), in another env's area or "
        "past the region",
    ),
    "shm_over_a_control_word": (
        lambda d: d["shm"]["result_offsets"].update(reward=4),
        False,
        P + "[shm] result_offsets.reward is 4: StepResult.reward (4 bytes) would overlap the "
        "control word sem_result_ready of slot ShmSlot (bytes 4..7)",
    ),
    "shm_final_missing": (
        lambda d: d["shm"]["final_result_offsets"].pop("reward"),
        False,
        P + "[shm] final_result_offsets has no offset for field StepResult.reward",
    ),
}


def write_case(tmp_path: Path, name: str) -> Path:
    edit, keep, _ = CASES[name]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(edited(edit, keep=keep)), encoding="utf-8")
    return path


_NODE_LOAD = """
const { loadSchemaFile } = require(process.env.DIST + "/schema_file");
const out = {};
for (const path of process.argv.slice(1)) {
  try { out[path] = "ok " + loadSchemaFile(path).fingerprintHex; }
  catch (e) { out[path] = (e && e.constructor ? e.constructor.name : "?") + ": " + e.message; }
}
process.stdout.write(JSON.stringify(out));
"""


def node_answers(paths: list[Path]) -> dict[str, str]:
    """What Node's loadSchemaFile says of each file (one Node process for all)."""
    done = subprocess.run(
        ["node", "-e", _NODE_LOAD, *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"DIST": str(DIST), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    answers: dict[str, str] = json.loads(done.stdout)
    return answers


@pytest.mark.parametrize("name", list(CASES))
def test_python_refuses_a_tampered_ir_in_one_line_naming_the_path(
    tmp_path: Path, name: str
) -> None:
    path = write_case(tmp_path, name)
    with pytest.raises(SchemaError) as caught:
        transport.load_schema(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: "), message
    assert message[len(f"{path}: ") :].startswith(CASES[name][2]), message
    assert "\n" not in message


@needs_node
def test_node_refuses_each_in_the_same_words(tmp_path: Path) -> None:
    paths = [write_case(tmp_path, name) for name in CASES]
    answers = node_answers(paths)
    for path in paths:
        with pytest.raises(SchemaError) as caught:
            transport.load_schema(path)
        assert answers[str(path)] == f"SchemaError: {caught.value}", path.name


def test_a_discovered_ir_with_a_float_is_a_protocol_error_naming_the_path() -> None:
    ir = edited(at_reward(offset=16.0))
    with pytest.raises(ProtocolError, match=re.escape(f"does not load: {P}{F}.offset is a float")):
        schema_from_ir_text(json.dumps(ir), int(ir["fingerprint"], 16), peer="the server")


def test_a_generated_module_is_not_a_schema_file(tmp_path: Path) -> None:
    module = tmp_path / "myenv.py"
    shutil.copy(ROOT / "transport" / "generated" / "gridworld.py", module)
    with pytest.raises(SchemaError, match=r"myenv\.py: a generated Python module, not a schema "):
        transport.load_schema(module)
    ts = tmp_path / "myenv.ts"
    ts.write_text("export const SCHEMA = 1;\n")
    with pytest.raises(SchemaError, match=r"a generated TypeScript module, not a schema file"):
        transport.load_schema(ts)


@pytest.mark.parametrize("lang", ["python", "node"])
def test_a_server_refuses_a_bad_offset_map_before_it_serves(tmp_path: Path, lang: str) -> None:
    """The shm server would have written its results over the control block (offset -64)."""
    if lang == "node" and not (HAVE_NODE and NODE_SERVER.is_file()):
        pytest.skip("the Node server is not built")
    path = write_case(tmp_path, "shm_negative")
    command = [sys.executable, "-m", "transport.tools.serve_cli", unique_url("shm")]
    done = subprocess.run(
        [*command, "--env", "contract", "--lang", lang, "--schema", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 2 and "ready" not in done.stdout, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "[shm] result_offsets.observation is -64" in done.stderr


@needs_node
def test_the_node_server_bin_refuses_it_too(tmp_path: Path) -> None:
    path = write_case(tmp_path, "offset_float")
    done = subprocess.run(
        ["node", str(NODE_SERVER), unique_url("shm"), "--env", "contract", "--schema", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.strip().endswith(f"{path}: {P}{F}.offset is a float, not an integer")
    assert done.stderr.count("\n") == 1, done.stderr


def test_the_conformance_cli_refuses_it_in_one_line(tmp_path: Path) -> None:
    path = write_case(tmp_path, "offset_float")
    done = subprocess.run(
        [sys.executable, "-m", "transport.tools.conformance_cli", str(path), "--count", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    assert f"{P}{F}.offset is a float, not an integer" in done.stderr


# -- the sweep: both loaders give the same answer to every mutation ------------------------------


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*path, i))


def _replacements(value: Any) -> list[Any]:
    if isinstance(value, bool):
        return [1, "true", None, not value]
    if isinstance(value, int):
        return [float(value), True, str(value), None, -1, 2**53, value + 1, [value], 1e400]
    if isinstance(value, str):
        return [1, None, f" {value}", "", value + "x", {"a": value}]
    if isinstance(value, list):
        return [[], {}, "x"]
    return [[], {"zz_new": 1}, None]


def _set(ir: Any, path: tuple[Any, ...], value: Any) -> None:
    for part in path[:-1]:
        ir = ir[part]
    ir[path[-1]] = value


def _drop(ir: Any, path: tuple[Any, ...]) -> None:
    for part in path[:-1]:
        ir = ir[part]
    del ir[path[-1]]


def mutations(base: dict[str, Any], every: int) -> Iterator[dict[str, Any]]:
    """Mutated copies of ``base``: each value replaced by values of other JSON types and out of
    range (every ``every``-th of them), each key dropped, an unknown key added to each table."""
    n = 0
    for path, value in _paths(base):
        if path:
            for replacement in _replacements(value):
                n += 1
                if n % every == 0:
                    ir = copy.deepcopy(base)
                    _set(ir, path, replacement)
                    yield refingerprinted(ir) if n % 7 else ir
            if isinstance(path[-1], str):
                ir = copy.deepcopy(base)
                _drop(ir, path)
                yield refingerprinted(ir)
        if isinstance(value, dict):
            ir = copy.deepcopy(base)
            _set(ir, (*path, "zz_new"), 1)
            yield refingerprinted(ir)


def python_answer(text: str) -> str:
    try:
        ir = ir_from_json(json.loads(text), require_fingerprint=True)
        Schema(ir)  # the codecs (NumPy dtypes) of what loads
    except ValueError as exc:
        return f"refused {exc}"
    return f"ok {ir.fingerprint_hex}"


_NODE_SWEEP = """
const fs = require("node:fs");
const { loadSchema } = require(process.env.DIST + "/codec");
const { parseIrText } = require(process.env.DIST + "/ir");
const { SchemaError } = require(process.env.DIST + "/errors");
const out = [];
for (const line of fs.readFileSync(process.argv[1], "utf8").split("\\n")) {
  if (line === "") continue;
  try { out.push("ok " + loadSchema(parseIrText(line)).fingerprintHex); }
  catch (e) { out.push((e instanceof SchemaError ? "refused " : "crashed ") + e.message); }
}
process.stdout.write(JSON.stringify(out));
"""


@needs_node
@pytest.mark.parametrize(
    ("module", "every"), [(gridworld, 1), (pac_env, 3), (image_columns, 3), (protocol, 3)]
)
def test_both_loaders_answer_every_mutation_alike(tmp_path: Path, module: Any, every: int) -> None:
    texts = [json.dumps(ir) for ir in mutations(module.IR, every)]
    assert len(texts) > 300
    cases = tmp_path / "cases.jsonl"
    cases.write_text("\n".join(texts) + "\n", encoding="utf-8")
    done = subprocess.run(
        ["node", "-e", _NODE_SWEEP, str(cases)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"DIST": str(DIST), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    node = json.loads(done.stdout)
    differ = [
        (text[:120], py, js)
        for text, py, js in zip(texts, map(python_answer, texts), node, strict=True)
        if py != js
    ]
    assert differ == [], f"{len(differ)} of {len(texts)} differ, e.g. {differ[:3]}"
