"""Where the repository's schemas, golden vectors and Node testee live."""

from __future__ import annotations

from pathlib import Path

import transport


def default_root() -> Path:
    """The repository root: the installed package's parent, else the current directory."""
    candidate = Path(transport.__file__).resolve().parent.parent
    if (candidate / "schema").is_dir():
        return candidate
    return Path.cwd()


def schema_files(root: Path) -> list[Path]:
    return sorted((root / "schema").glob("*.toml"))


def golden_root(root: Path) -> Path:
    return root / "conformance" / "golden"


def node_testee(root: Path) -> Path:
    return root / "node_bridge" / "dist" / "conformance" / "testee.js"
