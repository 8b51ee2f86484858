"""Type-check generated TypeScript under the project's `tsc --strict` (the schema tests' check
that an accepted schema's generated code compiles)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from transport.schema.emit_typescript import emit_typescript, emit_typescript_index
from transport.schema.ir import SchemaIR

NODE_BRIDGE = Path(__file__).resolve().parents[1] / "node_bridge"
TSC = NODE_BRIDGE / "node_modules" / ".bin" / "tsc"


def tsc_strict(folder: Path, irs: list[SchemaIR], timeout: float = 300) -> str:
    """Write the modules of ``irs`` (and their index) into ``folder`` beside the package's
    codec and IR runtime, run tsc on them; "" when they compile, else tsc's output."""
    src = NODE_BRIDGE / "src"
    for runtime in ("codec", "ir"):
        (folder / f"{runtime}.ts").write_text(
            f'export * from "{(src / runtime).as_posix()}";\n', encoding="utf-8"
        )
    generated = folder / "generated"
    generated.mkdir()
    for ir in irs:
        (generated / f"{ir.name}.ts").write_text(emit_typescript(ir), encoding="utf-8")
    (generated / "index.ts").write_text(
        emit_typescript_index([ir.name for ir in irs]), encoding="utf-8"
    )
    config = {
        "extends": (NODE_BRIDGE / "tsconfig.json").as_posix(),
        "compilerOptions": {
            "noEmit": True,
            "rootDir": "/",
            "typeRoots": [(NODE_BRIDGE / "node_modules" / "@types").as_posix()],
        },
        "include": [f"{folder.as_posix()}/**/*.ts"],
    }
    (folder / "tsconfig.json").write_text(json.dumps(config), encoding="utf-8")
    done = subprocess.run(
        [str(TSC), "-p", str(folder / "tsconfig.json")],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return "" if done.returncode == 0 else done.stdout + done.stderr
