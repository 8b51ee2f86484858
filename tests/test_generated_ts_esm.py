"""Generated TypeScript compiles in a user's ESM project (`"type": "module"`, `module
nodenext`, as `tsc --init` sets it): index.ts imported its schema modules without the `.js`
extension that such a project requires (TS2835, exploration 21)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .servers import ROOT

BRIDGE = ROOT / "node_bridge"
TSC = BRIDGE / "node_modules" / "typescript" / "bin" / "tsc"


@pytest.mark.skipif(
    shutil.which("node") is None or not TSC.is_file() or not (BRIDGE / "dist").is_dir(),
    reason="node_bridge is not built (./dev setup)",
)
def test_generated_modules_compile_in_an_esm_project(tmp_path: Path) -> None:
    out = tmp_path / "src" / "generated"
    compiled = subprocess.run(
        [sys.executable, "-m", "transport.tools.schema_cli", "compile"]
        + [str(ROOT / "schema" / f"{name}.toml") for name in ("pac_env", "gridworld")]
        + ["--ts-out", str(out), "--python-out", str(tmp_path / "py")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert compiled.returncode == 0, compiled.stderr
    (tmp_path / "package.json").write_text('{"name": "mine", "private": true, "type": "module"}\n')
    (tmp_path / "node_modules" / "@transport").mkdir(parents=True)
    (tmp_path / "node_modules" / "@transport" / "node-bridge").symlink_to(BRIDGE)
    (tmp_path / "src" / "main.ts").write_text(
        'import { SCHEMAS, pac_env } from "./generated/index.js";\n'
        "console.log(Object.keys(SCHEMAS).length, pac_env.FINGERPRINT);\n"
    )
    args = ["--strict", "--module", "nodenext", "--moduleResolution", "nodenext"]
    args += ["--target", "ES2022", "--skipLibCheck", "--noEmit"]
    checked = subprocess.run(
        ["node", str(TSC), *args, "src/main.ts"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
