"""`transport-serve --schema` takes a built-in schema by name from any folder, as the Node bin
does: `pac_env`, and `schema/NAME.toml` where no such file is (exploration 23: outside the
checkout the Python CLI refused all three forms the Node bin served)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import transport
from transport.generated import gridworld, pac_env

from .servers import ServerProcess, unique_url


@pytest.mark.parametrize(
    "env, schema, fingerprint",
    [
        ("contract", "schema/gridworld.toml", gridworld.SCHEMA.fingerprint),
        ("pac", "pac_env", pac_env.SCHEMA.fingerprint),
        ("pac", "schema/pac_env.toml", pac_env.SCHEMA.fingerprint),
    ],
)
def test_a_built_in_schema_by_name_from_any_folder(
    tmp_path: Path, env: str, schema: str, fingerprint: int
) -> None:
    extra = ["--schema", schema]
    with ServerProcess(unique_url("unix"), env=env, extra=extra, cwd=tmp_path) as server:
        with transport.connect(server.url) as client:
            assert client.schema.fingerprint == fingerprint


def test_a_missing_file_not_named_like_a_schema_is_refused(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "transport.tools.serve_cli", unique_url("unix")]
    done = subprocess.run(
        [*command, "--env", "pac", "--schema", "schema/mine.toml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "mine.toml" in done.stderr
