"""Tests that put odd entries in /dev/shm (FIFOs, directories, foreign files, another user's
segments) or run a cleanup do it in a mount namespace with a private tmpfs on /dev/shm, so no
other process's segments are touched (tests/test_shm_segments_misuse.py,
tests/test_channel_segments_misuse.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
BIN = Path(PY).parent


def _private_shm_ok() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", "mount -t tmpfs tmpfs /dev/shm"],
        capture_output=True,
        timeout=20,
    )
    return probe.returncode == 0


private_shm = pytest.mark.skipif(
    not _private_shm_ok(), reason="unshare -m with a tmpfs mount is not permitted here"
)
as_nobody = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to act as another user (nobody)",
)


def in_private_shm(script: str, timeout: float = 120) -> dict:
    """Run a bash ``script`` in a mount namespace with its own /dev/shm; its last stdout line is
    a JSON object (what the script found). $PY, $ROOT and the venv's bin on PATH are set."""
    body = "mount -t tmpfs -o size=64m tmpfs /dev/shm\n" + textwrap.dedent(script)
    env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '')}", PY=PY, ROOT=str(ROOT))
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "bash", "-c", body],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )
    lines = done.stdout.strip().splitlines()
    assert lines, f"no output (rc {done.returncode}): {done.stderr[-3000:]}"
    return json.loads(lines[-1])  # type: ignore[no-any-return]
