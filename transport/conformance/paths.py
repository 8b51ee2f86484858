"""Where the repository's schemas, golden vectors and Node testee live."""

from __future__ import annotations

import tomllib
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


def project_schemas(root: Path) -> dict[str, Path]:
    """The project's schemas by declared name (``[schema] name``, else the file's stem): every
    ``schema/*.toml`` of ``root``, resolved (a file that does not parse by its stem: checking
    it reports the error)."""
    names: dict[str, Path] = {}
    for path in schema_files(root):
        try:
            name = tomllib.loads(path.read_text(encoding="utf-8")).get("schema", {}).get("name")
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, AttributeError):
            name = None
        names[name if isinstance(name, str) else path.stem] = path.resolve()
    return names


def golden_root(root: Path) -> Path:
    return root / "conformance" / "golden"


def node_testee(root: Path) -> Path:
    return root / "node_bridge" / "dist" / "conformance" / "testee.js"
