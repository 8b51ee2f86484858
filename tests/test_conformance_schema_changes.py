"""transport-conformance after a schema change whose golden vectors were not rewritten.

A widened field (the committed .bin is shorter than the struct) and an added field (the committed
values lack it) are the same finding as any other layout change: every case reports "golden
vector written for fingerprint X, schema is Y" and the run goes on to its other checks, rather
than stopping with a traceback or calling the golden file malformed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from transport.conformance.paths import default_root, golden_root, node_testee

ROOT = default_root()
NODE = pytest.mark.skipif(
    not node_testee(ROOT).exists() or shutil.which("node") is None,
    reason="the Node testee is not built (cd node_bridge && npm ci && npm run build) or no node",
)
POSITION = '  { name = "position",    type = "i8[2]" },'


def _project(tmp_path: Path, edit: tuple[str, str]) -> Path:
    """A copy of the project's layout (schemas, golden vectors, node_bridge linked) with one
    edit to gridworld.toml."""
    root = tmp_path / "project"
    (root / "schema").mkdir(parents=True)
    for name in ("gridworld.toml", "protocol.toml"):
        shutil.copy(ROOT / "schema" / name, root / "schema")
    for name in ("gridworld", "protocol"):
        shutil.copytree(golden_root(ROOT) / name, golden_root(root) / name)
    (root / "node_bridge").symlink_to(ROOT / "node_bridge")
    path = root / "schema" / "gridworld.toml"
    text = path.read_text()
    assert edit[0] in text
    path.write_text(text.replace(edit[0], edit[1]))
    return root


def _conformance(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "transport.tools.conformance_cli", "--root", str(root)]
    cmd += ["--count", "3", "--json", *args, str(root / "schema" / "gridworld.toml")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def _golden_failures(run: subprocess.CompletedProcess[str]) -> tuple[dict, list[dict]]:
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    doc = json.loads(run.stdout)
    (schema,) = doc["schemas"]
    golden = [f for f in schema["failures"] if f["check"] == "golden"]
    return schema, golden


WIDEN = ('type = "u16[5,5]"', 'type = "u32[5,5]"')
ADD = (POSITION, POSITION + '\n  { name = "score", type = "i32" },')


@pytest.mark.parametrize("testee", [["--testee", "python"], pytest.param([], marks=NODE)])
def test_a_widened_field_is_a_fingerprint_change_not_a_crash(
    tmp_path: Path, testee: list[str]
) -> None:
    root = _project(tmp_path, WIDEN)
    schema, golden = _golden_failures(_conformance(root, *testee))
    assert golden, schema["failures"]
    for failure in golden:
        assert failure["summary"].startswith("golden vector written for fingerprint "), failure
    step = next(f for f in golden if f["struct"] == "StepResult")
    assert any("bytes, the struct" in d for d in step["details"]), step
    assert any("--write-golden" in d for d in step["details"])
    # the run went on to the other checks
    assert "invalid" in schema["checks"] and "views" in schema["checks"]


def test_an_added_field_is_a_fingerprint_change_not_a_malformed_file(tmp_path: Path) -> None:
    root = _project(tmp_path, ADD)
    schema, golden = _golden_failures(_conformance(root, "--testee", "python"))
    assert golden and all("malformed" not in f["summary"] for f in golden), golden
    step = next(f for f in golden if f["struct"] == "StepResult")
    assert step["summary"].startswith("golden vector written for fingerprint "), step
    assert schema["checks"]["golden"]["failed"] > 0


def test_a_broken_file_of_the_current_fingerprint_is_still_malformed(tmp_path: Path) -> None:
    """Values that do not fit the fields of the fingerprint they claim: a bad file, as before."""
    root = _project(tmp_path, ("", ""))
    path = golden_root(root) / "gridworld" / "StepResult.max.json"
    doc = json.loads(path.read_text())
    del doc["values"]["reward"]
    path.write_text(json.dumps(doc))
    schema, _ = _golden_failures(_conformance(root, "--testee", "python", "--only", "golden"))
    (failure,) = [f for f in schema["failures"] if f["check"] == "golden"]
    assert "malformed golden file" in failure["summary"] and "reward" in failure["summary"]
