"""Which backends to probe, the URL each gets, and the reference servers as child processes.

The backend list is the registry (``transport.backends.BACKENDS``) filtered through
``URL_TEMPLATES``: one function per scheme that makes a unique, local URL for a server with N
envs. A backend registered later works here without a code change as long as its scheme has a
template; a registered scheme without one is reported as skipped (with that reason).

Every name the probe creates (socket files, ZeroMQ ipc endpoints, shm segments) carries
``tag`` (``tprobe-<pid>-<n>``), so after a server stops the probe can look for leftovers of
exactly that server in the temp dir and /dev/shm, without confusing them with other users'.
"""

from __future__ import annotations

import importlib
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]
NODE_SERVER = ROOT / "node_bridge" / "dist" / "cli" / "serve.js"
SHM_DIR = Path("/dev/shm")
LANGS = ("python", "node")
PROBE_ENVS = ("echo", "vector-echo")
"""The reference envs a probe serves (``--env``): the same bytes for the same actions, from one
env object per env (``echo``) or one vector env object that steps all of them (``vector-echo``)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tmp(tag: str, suffix: str) -> str:
    return f"{tempfile.gettempdir()}/{tag}{suffix}"


# scheme -> (tag, num_envs) -> URL. The tag is unique per server and safe in a file name.
URL_TEMPLATES: dict[str, Callable[[str, int], str]] = {
    "unix": lambda tag, n: f"unix://{_tmp(tag, '.sock')}",
    "http": lambda tag, n: "http://127.0.0.1:0",
    "zmq+ipc": lambda tag, n: f"zmq+ipc://{_tmp(tag, '.ipc')}",
    "zmq+tcp": lambda tag, n: f"zmq+tcp://127.0.0.1:{_free_port()}",
    "shm": lambda tag, n: f"shm://{tag}?num_envs={n}",
}

# registered schemes that name no server transport of their own (skipped, with this reason)
CLIENT_ONLY: dict[str, str] = {
    "auto": "auto:// is a client-side alias (it connects over shm, unix or http, which are "
    "probed themselves); probe one server through it with --url auto://NAME",
}

# the order of the table when every backend is present; later registrations go after these
PREFERRED_ORDER = ("shm", "zmq+ipc", "unix", "zmq+tcp", "http")


def registered_backends() -> list[str]:
    """Every scheme of the registry, in ``PREFERRED_ORDER`` then alphabetically."""
    from transport.backends import BACKENDS

    rank = {name: i for i, name in enumerate(PREFERRED_ORDER)}
    return sorted(BACKENDS, key=lambda s: (rank.get(s, len(rank)), s))


def default_backends() -> list[str]:
    """What a probe without ``--backends`` measures: every registered scheme that has a server
    of its own (client-side aliases such as ``auto://`` are probed with ``--url``)."""
    return [scheme for scheme in registered_backends() if scheme not in CLIENT_ONLY]


def backend_unavailable(scheme: str) -> str | None:
    """Why ``scheme`` cannot be probed here (None: it can): not registered, its module fails to
    import, it has no server side (``auto://`` picks another backend), or no URL template."""
    from transport.backends import BACKENDS

    module = BACKENDS.get(scheme)
    if module is None:
        known = ", ".join(sorted(BACKENDS))
        return f"not in the backend registry (registered: {known})"
    try:
        loaded = importlib.import_module(module)
    except Exception as exc:
        return f"its module {module} does not import: {type(exc).__name__}: {exc}"
    if not hasattr(loaded, "Listener"):
        return f"{module} has no server side (no Listener): a client-only scheme"
    if scheme in CLIENT_ONLY:
        return CLIENT_ONLY[scheme]
    if scheme not in URL_TEMPLATES:
        return f"no URL template for {scheme}:// in transport/probe/servers.py"
    return None


def lang_unavailable(lang: str) -> str | None:
    """Why the ``lang`` reference server cannot run here (None: it can)."""
    if lang == "python":
        return None
    if lang == "node":
        if shutil.which("node") is None:
            return "node is not on PATH"
        if not NODE_SERVER.is_file():
            return f"{NODE_SERVER.relative_to(ROOT)} is missing (build node_bridge: ./dev setup)"
        return None
    return f"unknown server language {lang!r}"


class ServerStartError(Exception):
    """The server did not print ``ready URL``: the backend/language is unavailable here."""


class ServerProcess:
    """``transport-serve URL --env echo --lang L --num-envs N`` as a child process.

    Runs in its own session (a Ctrl-C of the probe reaches the probe, which then stops the
    server with SIGTERM so that it removes what it created). stderr goes to an anonymous
    temporary file (no pipe to fill, no file left behind) and is quoted in errors.
    """

    def __init__(
        self,
        url: str,
        *,
        lang: str,
        num_envs: int,
        tag: str,
        env: str = "echo",
        ready_timeout: float = 30.0,
    ) -> None:
        self.requested_url = url
        self.tag = tag
        self.lang = lang
        self._stderr: IO[bytes] = tempfile.TemporaryFile()
        command = [
            sys.executable,
            "-m",
            "transport.tools.serve_cli",
            url,
            "--env",
            env,
            "--lang",
            lang,
            "--num-envs",
            str(num_envs),
        ]
        self.proc = subprocess.Popen(
            command,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,
        )
        try:
            self.url = self._wait_ready(ready_timeout)
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr_text(self, limit: int = 600) -> str:
        self._stderr.flush()
        self._stderr.seek(0)
        text = self._stderr.read().decode("utf-8", "replace").strip()
        lines = [ln for ln in text.splitlines() if ln.strip()]
        text = " | ".join(lines[-4:])
        return text if len(text) <= limit else "..." + text[-limit:]

    def _wait_ready(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ServerStartError(f"no 'ready' line within {timeout:.0f} s")
                if selector.select(min(left, 0.5)):
                    break
                if self.proc.poll() is not None:
                    break
        line = self.proc.stdout.readline().decode("utf-8", "replace").strip()
        if not line.startswith("ready "):
            self.proc.wait(5)
            why = self.stderr_text() or f"printed {line!r}"
            raise ServerStartError(f"exited with status {self.proc.returncode}: {why}")
        return line.split(" ", 1)[1]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; the exit status (None if it was killed)."""
        killed = False
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
                killed = True
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()
        return None if killed else self.proc.returncode


def leftovers(tag: str) -> list[str]:
    """Files of the temp dir and /dev/shm whose names contain ``tag``."""
    found: list[str] = []
    for directory in (Path(tempfile.gettempdir()), SHM_DIR):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        found += [str(directory / name) for name in names if tag in name]
    return sorted(found)


def remove(paths: list[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass
