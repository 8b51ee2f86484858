"""Servers for the contract checks: the interface a check sees, and the built-in launchers.

A check asks a ``ServerFactory`` for a server of the contract env (``ContractEnv``) with a schema,
a number of envs and ``ServerOptions``, and gets a ``RunningServer``: its URL and pid, and the
means to stop, kill and inspect it. ``ServeProcess`` runs ``transport-serve URL --env contract
--schema NAME`` (Python or Node), ``serve_process_factory`` wraps it for any URL scheme, and
``ServerPool`` shares one server among the checks that allow it (the others get their own).
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from transport.codec import Schema

SERVER_SEED = 1000
"""The ``--seed`` every contract server is started with: env i's first unseeded reset gets
SERVER_SEED + i."""
CONTRACT_MAX_BODY = 65536
"""The ``--max-body`` every contract server is started with (requests are far smaller)."""
SCHEMES = ("unix", "http", "zmq+ipc", "zmq+tcp", "shm")
"""The URL schemes this project serves."""


@dataclass(frozen=True)
class ServerOptions:
    """What a check asks of its server besides the schema and the number of envs.

    ``dedicated``: the check stops, kills or freezes the server, so it must not be shared;
    the check calls ``stop()`` or ``kill()`` itself.
    """

    dedicated: bool = False
    seed: int = SERVER_SEED
    max_body: int = CONTRACT_MAX_BODY
    limits: tuple[str, ...] = ()
    """Extra ``transport-serve`` flags for the server limits (``--read-timeout 1``, ...)."""
    masked_actions: str = "reject"
    workers: int = 0
    """``--workers K``: the envs run in K worker processes (Node: threads); 0 in this one."""


class RunningServer(Protocol):
    """A contract server, as a check sees it."""

    @property
    def url(self) -> str:
        """The URL clients connect to."""
        ...

    @property
    def pid(self) -> int:
        """The server process (signals: SIGSTOP, SIGKILL, SIGTERM, SIGINT)."""
        ...

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit; its exit status (TimeoutError past ``timeout``)."""
        ...

    def stop(self) -> int:
        """SIGTERM, wait (bounded), return the exit status."""
        ...

    def kill(self) -> None:
        """SIGKILL, wait, and remove what a killed server leaves (socket file, segment)."""
        ...

    def leftovers(self) -> list[str]:
        """Paths the server created that still exist (none may remain after ``stop``)."""
        ...


ServerFactory = Callable[[Schema, int, ServerOptions], RunningServer]
"""``factory(schema, num_envs, options)``: start a contract server (ContractEnv on ``schema``,
``num_envs`` envs per connection, first unseeded reset seeded ``options.seed``, requests over
``options.max_body`` refused) and return it once clients can connect."""


def unique_url(scheme: str) -> str:
    """A fresh address for ``scheme`` (unique per call: parallel runs never collide)."""
    tag = uuid.uuid4().hex[:12]
    tmp = tempfile.gettempdir()
    if scheme == "unix":
        return f"unix://{tmp}/transport-contract-{tag}.sock"
    if scheme == "zmq+ipc":
        return f"zmq+ipc://{tmp}/transport-contract-{tag}.zmq"
    if scheme == "http":
        return f"http://127.0.0.1:{_free_port()}"
    if scheme == "zmq+tcp":
        return f"zmq+tcp://127.0.0.1:{_free_port()}"
    if scheme == "shm":
        return f"shm://contract-{tag}"
    raise ValueError(f"no built-in address for scheme {scheme!r} (known: {', '.join(SCHEMES)})")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def created_paths(url: str) -> list[str]:
    """The filesystem entries a server on ``url`` creates (socket files, shm segments)."""
    scheme, _, rest = url.partition("://")
    if scheme in ("unix", "zmq+ipc"):
        return [rest.partition("?")[0]]
    if scheme == "shm":
        return [f"/dev/shm/transport-{rest.partition('?')[0]}"]
    return []


class ServeProcess:
    """``transport-serve URL --env contract --schema NAME --lang LANG`` as a child process.

    ``schema`` is a built-in schema name or a schema file. Waits (up to ``ready_timeout``) for
    the ``ready URL`` line; ``url`` is the URL it printed (port 0 resolved).
    """

    def __init__(
        self,
        url: str,
        schema: str,
        *,
        lang: str = "python",
        num_envs: int = 1,
        seed: int | None = SERVER_SEED,
        max_body: int | None = CONTRACT_MAX_BODY,
        ready_timeout: float = 30.0,
        extra_args: tuple[str, ...] = (),
        masked_actions: str = "reject",
    ) -> None:
        command = [
            sys.executable,
            "-m",
            "transport.tools.serve_cli",
            url,
            "--env",
            "contract",
            "--schema",
            schema,
            "--lang",
            lang,
            "--num-envs",
            str(num_envs),
        ]
        if seed is not None:
            command += ["--seed", str(seed)]
        if max_body is not None:
            command += ["--max-body", str(max_body)]
        command += extra_args
        if masked_actions != "reject":
            command += ["--masked-actions", masked_actions]
        self.requested_url = self.url = url
        # stderr goes to a file, not a pipe: a long-lived server that logs would otherwise
        # block once the pipe is full (nobody reads it after "ready")
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=self._stderr, text=True
        )
        self.url = self._wait_ready(ready_timeout)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self, limit: int = 4000) -> str:
        """The last ``limit`` characters the server wrote to stderr so far ("" once closed)."""
        if self._stderr.closed:
            return ""
        self._stderr.flush()
        end = self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(0)
        text = self._stderr.read()
        self._stderr.seek(end)
        return text[-limit:]

    def _wait_ready(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            if not selector.select(timeout):
                self.kill()
                raise RuntimeError(f"the server did not print 'ready' within {timeout} s")
        line = self.proc.stdout.readline().strip()
        if not line.startswith("ready "):
            self.proc.kill()
            self._stderr.seek(0)
            err = self._stderr.read()
            self.kill()
            raise RuntimeError(f"the server failed to start: {line!r} {err.strip()}")
        return line.split(" ", 1)[1]

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(f"server pid {self.pid} still runs after {timeout} s") from exc

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a check may have left it stopped
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.wait(20.0)
        finally:
            self._close_pipes()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(20.0)
        self._close_pipes()
        for path in self.leftovers():
            os.unlink(path)

    def leftovers(self) -> list[str]:
        return [path for path in created_paths(self.url) if os.path.exists(path)]

    def _close_pipes(self) -> None:
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()


def serve_process_factory(
    scheme: str,
    lang: str = "python",
    *,
    url: Callable[[str], str] = unique_url,
) -> ServerFactory:
    """A ServerFactory that runs ``transport-serve`` (``lang``) on a fresh ``url(scheme)``.

    A schema is passed by name when it is a built-in one (``transport.generated``), else by the
    file it was compiled from (``Schema.ir.source``).
    """

    def start(schema: Schema, num_envs: int, options: ServerOptions) -> RunningServer:
        address = url(scheme)
        if scheme == "shm":
            address += f"?num_envs={num_envs}"
        return ServeProcess(
            address,
            schema_argument(schema),
            lang=lang,
            num_envs=num_envs,
            seed=options.seed,
            max_body=options.max_body,
            extra_args=options.limits
            + (("--workers", str(options.workers)) if options.workers else ()),
            masked_actions=options.masked_actions,
        )

    return start


def schema_argument(schema: Schema) -> str:
    """What ``transport-serve --schema`` takes for ``schema``: a built-in name, else its file."""
    import importlib

    try:
        module = importlib.import_module(f"transport.generated.{schema.name}")
        if module.SCHEMA.fingerprint == schema.fingerprint:
            return schema.name
    except ImportError:
        pass
    source = schema.ir.source
    if source and Path(source).is_file():
        return source
    raise ValueError(f"schema {schema.name}: not built in and compiled from no file")


class ServerPool:
    """A ServerFactory that shares servers: one per (schema, num_envs, options) for the checks
    that allow it, a fresh one for each dedicated request. ``close()`` stops them all (and
    kills whatever a failed check left running)."""

    def __init__(self, factory: ServerFactory) -> None:
        self.factory = factory
        self.shared: dict[tuple[int, int, ServerOptions], RunningServer] = {}
        self.dedicated: list[RunningServer] = []
        self.died: list[str] = []

    def __call__(self, schema: Schema, num_envs: int, options: ServerOptions) -> RunningServer:
        if options.dedicated:
            server = self.factory(schema, num_envs, options)
            self.dedicated.append(server)
            return server
        key = (schema.fingerprint, num_envs, options)
        shared = self.shared.get(key)
        if shared is not None and not _alive(shared.pid):  # it died: report it, start another
            self.died.append(f"shared server {shared.url} died (pid {shared.pid})")
            shared.kill()
            shared = None
        if shared is None:
            shared = self.shared[key] = self.factory(schema, num_envs, options)
        return shared

    def close(self) -> list[str]:
        """Stop every server; the problems seen (a non-zero exit, files left behind)."""
        problems = self.died
        for server in self.shared.values():
            if not _alive(server.pid):
                problems.append(f"shared server {server.url} died (pid {server.pid})")
        for server in [*self.shared.values(), *self.dedicated]:
            if not _alive(server.pid):
                server.kill()  # reaps it and removes what a killed server leaves
                continue
            try:
                status = server.stop()
            except TimeoutError as exc:  # one stuck server must not leave the others running
                problems.append(f"server {server.url}: {exc}")
                server.kill()
                continue
            left = server.leftovers()
            if status != 0 or left:
                problems.append(f"server {server.url}: exit status {status}, left {left}")
                server.kill()
        self.shared.clear()
        self.dedicated.clear()
        self.died = []
        return problems

    def __iter__(self) -> Iterator[RunningServer]:
        return iter([*self.shared.values(), *self.dedicated])

    def logs(self) -> str:
        """What the pool's servers wrote to stderr (those that wrote and can tell), for the
        report of a failed check: a server's warning often names the cause."""
        out = []
        for server in self:
            log = getattr(server, "log", None)
            text = log() if callable(log) else ""
            if text:
                out.append(f"--- stderr of the server at {server.url} (pid {server.pid}):\n{text}")
        return "\n".join(out)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie or a reaped pid does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def stop_process(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP ``pid`` and wait until every one of its threads is stopped (the signal is
    asynchronous: a thread may still answer a request right after ``kill`` returns)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                states.append((task / "stat").read_text().rpartition(")")[2].split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue
        if states and all(state in ("T", "t") for state in states):
            return
        time.sleep(0.002)
    raise AssertionError(f"process {pid} did not stop within {timeout} s")
