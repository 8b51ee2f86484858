"""auto://name stops at the first server that answers, even when it answers with a refusal.

Only "nobody there" errors (no region, no socket, refused, a dead peer) move the search to the
next backend. A fingerprint mismatch or a region in use proves the named server is there: the
error is raised as it is, not folded into "no backend answered" after every other candidate
timed out.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import transport.api as api
from transport.errors import ConnectError, FingerprintMismatchError, RegionInUseError

from .servers import ROOT, ServerProcess, free_port


@pytest.fixture
def name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("TRANSPORT_HTTP_PORT", str(free_port()))  # nothing listens there
    return f"auto-{uuid.uuid4().hex[:10]}"


def test_a_server_of_another_schema_is_a_fingerprint_mismatch(name: str) -> None:
    with ServerProcess(f"shm://{name}", env="mahjong") as server:
        with pytest.raises(FingerprintMismatchError) as info:
            api.connect(f"auto://{name}", schema=ROOT / "schema" / "pac_env.toml", timeout=3)
        text = str(info.value)
        assert f"shm://{name}" in text and "mahjong_env" in text and "pac_env" in text, text
        assert "no backend answered" not in text and "http://" not in text
        assert server.proc.poll() is None


def test_a_region_in_use_is_said_as_it_is(name: str) -> None:
    with (
        ServerProcess(f"shm://{name}", env="echo") as server,
        api.connect(server.url, timeout=5) as holder,
    ):
        with pytest.raises(RegionInUseError) as info:
            api.connect(f"auto://{name}", timeout=3)
        assert "no backend answered" not in str(info.value)
        holder.reset()


def test_a_stale_socket_file_still_moves_on(name: str, tmp_path: Path) -> None:
    """A socket file nobody listens on is "nobody there": the search goes on to http."""
    (tmp_path / f"transport-{name}.sock").touch()
    with pytest.raises(ConnectError) as info:
        api.connect(f"auto://{name}", timeout=2)
    text = str(info.value)
    assert "no backend answered" in text and "unix://" in text and "http://127.0.0.1:" in text
