"""Real server processes for tests: `transport-serve` in Python or Node, with unique addresses."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from types import TracebackType

import pytest

from transport.testing.servers import stop_process as stop_process  # tests import it from here

ROOT = Path(__file__).resolve().parents[1]
NODE_SERVER = ROOT / "node_bridge" / "dist" / "cli" / "serve.js"
LANGS = ["python", "node"]


def require_lang(lang: str) -> None:
    if lang == "node" and (shutil.which("node") is None or not NODE_SERVER.is_file()):
        pytest.skip("the Node server is not built (run ./dev setup)")


def unique_unix_url() -> str:
    return f"unix://{tempfile.gettempdir()}/transport-test-{uuid.uuid4().hex[:12]}.sock"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def unique_url(backend: str) -> str:
    if backend == "unix":
        return unique_unix_url()
    if backend == "http":
        return f"http://127.0.0.1:{free_port()}"
    if backend == "zmq+ipc":
        return "zmq+" + unique_unix_url().removesuffix(".sock").replace("unix://", "ipc://")
    if backend == "zmq+tcp":
        return f"zmq+tcp://127.0.0.1:{free_port()}"
    if backend == "shm":
        return f"shm://test-{uuid.uuid4().hex[:12]}"
    raise ValueError(backend)


class ServerProcess:
    """``transport-serve URL --env ... --lang ...`` as a child process; waits for ``ready``."""

    def __init__(
        self,
        url: str,
        *,
        env: str = "echo",
        lang: str = "python",
        num_envs: int = 1,
        seed: int | None = None,
        extra: list[str] | None = None,
        ready_timeout: float = 20.0,
        cwd: Path = ROOT,
    ) -> None:
        require_lang(lang)
        command = [sys.executable, "-m", "transport.tools.serve_cli", url]
        if "--gym" not in (extra or []):  # --gym takes no --env (not even the default echo)
            command += ["--env", env]
        command += ["--lang", lang, "--num-envs", str(num_envs)]
        if seed is not None:
            command += ["--seed", str(seed)]
        command += extra or []
        self.requested_url = url
        self.proc = subprocess.Popen(
            command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.url = self._wait_ready(ready_timeout)

    def _wait_ready(self, timeout: float) -> str:
        import selectors

        assert self.proc.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(self.proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            self.kill()
            raise RuntimeError(f"server did not print ready within {timeout} s")
        line = self.proc.stdout.readline().strip()
        if not line.startswith("ready "):
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.kill()
            raise RuntimeError(f"server failed to start: {line!r} {err}")
        return line.split(" ", 1)[1]

    def terminate(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.terminate()
        finally:
            self.kill()
            if self.url.startswith("unix://"):
                path = self.url.partition("://")[2]
                assert not os.path.exists(path), f"server left its socket file {path}"
