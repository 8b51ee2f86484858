"""The Node server serves the schema file it is given, even one named like a built-in schema
(`gridworld.toml` of a user's own): it served the built-in gridworld in its place, silently
(exploration 23); the project's own schema/NAME.toml stays its generated module."""

from __future__ import annotations

from pathlib import Path

import pytest

import transport
from transport import load_schema

from .servers import ROOT, ServerProcess, require_lang, unique_url


@pytest.mark.parametrize("lang", ["node", "python"])
def test_a_user_schema_named_like_a_built_in_one_is_served(tmp_path: Path, lang: str) -> None:
    require_lang(lang)
    source = (ROOT / "schema" / "gridworld.toml").read_text()
    mine = tmp_path / "gridworld.toml"
    marker = '  { name = "position",    type = "i8[2]" },'
    assert marker in source
    mine.write_text(source.replace(marker, marker + '\n  { name = "extra", type = "u8" },'))
    expected = load_schema(mine).fingerprint
    assert expected != load_schema(ROOT / "schema" / "gridworld.toml").fingerprint
    extra = ["--schema", str(mine)]
    with ServerProcess(unique_url("unix"), env="contract", lang=lang, extra=extra) as server:
        with transport.connect(server.url) as client:  # the schema discovered
            assert client.schema.fingerprint == expected


def test_the_project_schema_file_is_the_built_in_module() -> None:
    require_lang("node")
    extra = ["--schema", "schema/gridworld.toml"]
    with ServerProcess(unique_url("unix"), env="contract", lang="node", extra=extra) as server:
        with transport.connect(server.url) as client:
            assert (
                client.schema.fingerprint == load_schema(ROOT / "schema/gridworld.toml").fingerprint
            )
