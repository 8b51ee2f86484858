"""A unix:// socket path the server cannot bind: both servers say why in the same words.

libuv reports a missing directory as EACCES; the Node server asks the directory and says "No
such file or directory" (or "Not a directory"), as the Python server says it from strerror.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .servers import ROOT, require_lang


def _refusal(url: str, lang: str) -> str:
    """The one error line of transport-serve URL --lang LANG (which must exit 1 at once)."""
    require_lang(lang)
    command = [sys.executable, "-m", "transport.tools.serve_cli", url, "--lang", lang]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "ready" not in run.stdout, (run.stdout, run.stderr)
    return run.stderr.strip()


@pytest.mark.parametrize("lang", ["python", "node"])
def test_a_missing_directory_is_said_so(tmp_path: Path, lang: str) -> None:
    path = tmp_path / "missing" / "env.sock"
    assert _refusal(f"unix://{path}", lang) == (
        f"transport-serve: error: cannot bind {path}: No such file or directory"
    )
    assert not path.parent.exists()


@pytest.mark.parametrize("lang", ["python", "node"])
def test_a_file_in_the_way_is_not_a_directory(tmp_path: Path, lang: str) -> None:
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "env.sock"
    assert _refusal(f"unix://{path}", lang) == (
        f"transport-serve: error: cannot bind {path}: Not a directory"
    )
