"""auto://name: shm, then unix, then http; the choice and the skipped candidates are logged."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

import transport.api as api
from transport.backends.auto import candidates
from transport.envs.echo import EchoEnv
from transport.errors import ConnectError

from .servers import free_port

LOGGER = "transport.backends.auto"


@pytest.fixture
def name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("TRANSPORT_HTTP_PORT", str(free_port()))  # nothing listens there
    return f"auto-{uuid.uuid4().hex[:10]}"


def test_unix_is_chosen_when_its_socket_exists(
    name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"unix://{tmp_path}/transport-{name}.sock"
    with api.Server(EchoEnv, url).start(), caplog.at_level(logging.INFO, logger=LOGGER):
        with api.connect(f"auto://{name}", timeout=5) as client:
            assert client.url == url
            client.reset()
            assert client.step(2).observation[0] == 2
    text = caplog.text
    assert f"skipped shm://{name}: no shared-memory region" in text
    assert f"chose {url}" in text


def test_http_is_the_fallback(
    name: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    monkeypatch.setenv("TRANSPORT_HTTP_PORT", str(port))
    url = f"http://127.0.0.1:{port}"
    with api.Server(EchoEnv, url).start(), caplog.at_level(logging.INFO, logger=LOGGER):
        with api.connect(f"auto://{name}", timeout=5, autoreset="next_step") as client:
            assert client.url == url and client.server_info["autoreset"] == "next_step"
            client.reset()
    assert "no socket file" in caplog.text and f"chose {url}" in caplog.text


@pytest.mark.parametrize("mode", ["disabled", "next_step", "same_step"])
def test_shm_is_first_for_every_auto_reset_mode(name: str, mode: str) -> None:
    url = f"shm://{name}?num_envs=1"
    with api.Server(EchoEnv, url).start():
        assert dict(candidates(f"auto://{name}"))[f"shm://{name}"] == ""
        with api.connect(f"auto://{name}", timeout=5, autoreset=mode) as client:
            assert client.url.startswith("shm://")
            assert client.server_info["autoreset"] == mode
            client.reset()
            assert client.step(3).observation[0] == 3


def test_nothing_answers(name: str) -> None:
    with pytest.raises(ConnectError) as info:
        api.connect(f"auto://{name}", timeout=2)
    text = str(info.value)
    assert "no backend answered" in text and "shm://" in text and "http://127.0.0.1:" in text


def test_bad_urls_and_servers() -> None:
    with pytest.raises(ConnectError, match="auto://NAME"):
        api.connect("auto://a/b", timeout=1)
    with pytest.raises(ConnectError, match="unknown parameter"):
        api.connect("auto://a?x=1", timeout=1)
    with pytest.raises(ConnectError, match="auto:// is for clients"):
        api.Server(EchoEnv, "auto://a")
