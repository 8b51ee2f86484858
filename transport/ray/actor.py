"""The Ray actor that hosts one env server: Python envs in its own process, Node envs as a child.

Every (re)start of the actor (Ray runs ``__init__`` again after a restart) makes a fresh CURVE key
pair and binds a fresh port on its node, so a restarted server is a new endpoint; the trainer
asks ``endpoint()`` for it through Ray. The server always runs ``zmq+tcp`` with CURVE on and
admits exactly the trainer's public key.

A Node server is a child process the actor owns: it gets the parent-death signal (SIGTERM when
the actor's process dies, even by SIGKILL), and a child that dies takes the actor down with it
(``os._exit``) so that Ray restarts the pair.
"""

from __future__ import annotations

import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from transport.codec import Schema
from transport.ray.keys import ENV_ALLOWED_CLIENTS, KeyPair, key_file

log = logging.getLogger("transport.ray")

STOP_GRACE = 5.0
"""Seconds a Node child gets to close after SIGTERM before it is killed."""

_EXEC_WITH_PARENT_DEATH_SIGNAL = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)  # the parent died before the signal was armed
os.execv(sys.argv[2], sys.argv[2:])
"""
"""Run a command that gets SIGTERM when the thread that started it (the actor's) goes away."""


@dataclass(frozen=True)
class ServerSpec:
    """What every server of a launch serves (the same for each actor, and after each restart).

    ``env``: a reference env name (``transport.envs``: echo, pac, mahjong) or, for Python, a
    picklable zero-argument factory; a Python server speaks the schema of ``schema_ir``.
    ``lang``: "python" (envs in the actor's process) or "node" (``node_bridge/dist/cli/
    serve.js``, or ``node_command``, as a child process). ``host``: the address to bind, default
    the node's Ray address. ``seed``: server k's first unseeded reset
    gives env i of it the seed ``seed + k * num_envs + i``.
    """

    env: str | Callable[[], Any]
    num_envs: int
    lang: str = "python"
    schema_ir: Any = None
    """The compiled schema's IR (``Schema.ir``: picklable, unlike the codecs built from it)."""
    seed: int | None = None
    host: str | None = None
    workers: int = 0
    node_command: tuple[str, ...] = ()
    ready_timeout: float = 60.0
    env_name: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        if isinstance(self.env, str):
            return self.env
        return self.env_name or getattr(self.env, "__name__", "env")


@dataclass(frozen=True)
class Endpoint:
    """Where server ``index`` listens now, with the public key a client needs to reach it."""

    index: int
    url: str
    server_public_key: str
    num_envs: int
    node_id: str
    node_ip: str
    pid: int
    """The actor's process (its Python envs run there)."""
    child_pid: int | None
    """The Node server process the actor owns (``lang="node"``), else None."""
    incarnation: str
    """New on every start of the actor: a restarted server has another one."""


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _strip_query(url: str) -> str:
    return url.partition("?")[0]


def node_serve_script() -> Path:
    """node_bridge/dist/cli/serve.js (what ``transport-serve --lang node`` runs)."""
    from transport.tools.serve_cli import node_server_script

    return node_server_script()


class EnvServerActor:
    """One env server on a Ray node (wrap with ``ray.remote``; ``launch()`` does)."""

    def __init__(self, spec: ServerSpec, index: int, client_public_key: str) -> None:
        self.spec = spec
        self.index = index
        self._keys = KeyPair.generate()
        self._stopping = False
        self._server: Any = None
        self._child: subprocess.Popen[bytes] | None = None
        self._supervisor: threading.Thread | None = None
        context = ray.get_runtime_context()
        node_ip = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        host = spec.host or node_ip
        os.environ[ENV_ALLOWED_CLIENTS] = client_public_key  # public; this process is ours
        listen = f"zmq+tcp://{_url_host(host)}:0"
        if spec.lang == "python":
            url = self._start_python(listen)
        elif spec.lang == "node":
            url = self._start_node(listen, client_public_key)
        else:
            raise ValueError(f"lang must be 'python' or 'node', not {spec.lang!r}")
        self._endpoint = Endpoint(
            index=index,
            url=url,
            server_public_key=self._keys.public,
            num_envs=spec.num_envs,
            node_id=str(context.get_node_id()),
            node_ip=node_ip,
            pid=os.getpid(),
            child_pid=None if self._child is None else self._child.pid,
            incarnation=uuid.uuid4().hex,
        )
        log.info("env server %d serves %s (pid %d)", index, url, os.getpid())

    # -- Ray methods ---------------------------------------------------------------------------

    def endpoint(self) -> Endpoint:
        return self._endpoint

    def stop(self) -> None:
        """Close the server (and end the Node child); the actor is killed after this."""
        self._stopping = True
        if self._server is not None:
            self._server.close()
            self._server = None
        child = self._child
        if child is not None and child.poll() is None:
            child.terminate()
            try:
                child.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(STOP_GRACE)
        if self._supervisor is not None:
            self._supervisor.join(STOP_GRACE)

    # -- Python: the envs live in this process -------------------------------------------------

    def _start_python(self, listen: str) -> str:
        import transport
        from transport.envs import env_factory, env_schema

        spec = self.spec
        factory = env_factory(spec.env, spec.num_envs) if isinstance(spec.env, str) else spec.env
        if spec.schema_ir is not None:
            schema = Schema(spec.schema_ir)
        elif isinstance(spec.env, str):
            schema = env_schema(spec.env)
        else:
            raise ValueError("a Python env factory needs its schema (schema_ir)")
        seed = None if spec.seed is None else spec.seed + self.index * spec.num_envs
        with key_file(self._keys.public, self._keys.secret) as secret:
            server = transport.Server(
                factory,
                f"{listen}?server_key={secret.path}",
                schema=schema,
                num_envs=spec.num_envs,
                env_name=spec.name,
                seed=seed,
                workers=spec.workers,
            )
            server.start()  # reads the key file while binding
        self._server = server
        return _strip_query(server.bound_url)

    # -- Node: a child process this actor owns -------------------------------------------------

    def _start_node(self, listen: str, client_public_key: str) -> str:
        spec = self.spec
        if spec.node_command:
            command = list(spec.node_command)
        else:
            if not isinstance(spec.env, str):
                raise ValueError("a Node server takes a reference env name (or node_command=...)")
            node = shutil.which("node")
            script = node_serve_script()
            if node is None or not script.is_file():
                raise RuntimeError(
                    f"a Node env server needs node and {script} on every node "
                    "(run ./dev setup to build node_bridge)"
                )
            command = [node, str(script)]
        seed = None if spec.seed is None else spec.seed + self.index * spec.num_envs
        env = dict(os.environ)
        env[ENV_ALLOWED_CLIENTS] = client_public_key
        ready: list[str] = []
        failure: list[str] = []
        started = threading.Event()
        with key_file(self._keys.public, self._keys.secret) as secret:
            arguments = [f"{listen}?server_key={secret.path}", "--env", spec.name]
            arguments += ["--num-envs", str(spec.num_envs)]
            if seed is not None:
                arguments += ["--seed", str(seed)]
            if spec.workers:
                arguments += ["--workers", str(spec.workers)]
            launcher = [sys.executable, "-c", _EXEC_WITH_PARENT_DEATH_SIGNAL, str(os.getpid())]
            # The supervisor thread starts the child and lives as long as it does: the parent-death
            # signal follows the thread that forked, so it must not be a short-lived one.
            self._supervisor = threading.Thread(
                target=self._supervise,
                args=(launcher + command + arguments, env, secret.fd, ready, failure, started),
                name=f"transport-node-server-{self.index}",
                daemon=True,
            )
            self._supervisor.start()
            started.wait(spec.ready_timeout + STOP_GRACE)
        if not ready:
            self.stop()
            reason = failure[0] if failure else f"no 'ready' within {spec.ready_timeout} s"
            raise RuntimeError(f"the Node env server did not start: {reason}")
        return _strip_query(ready[0])

    def _supervise(
        self,
        command: list[str],
        env: dict[str, str],
        key_fd: int,
        ready: list[str],
        failure: list[str],
        started: threading.Event,
    ) -> None:
        try:
            child = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                env=env,
                pass_fds=(key_fd,) if key_fd >= 0 else (),
            )
        except OSError as exc:
            failure.append(str(exc))
            started.set()
            return
        self._child = child
        assert child.stdout is not None
        line = _read_line(child.stdout, self.spec.ready_timeout)
        if line.startswith("ready "):
            ready.append(line.split(" ", 1)[1])
        else:
            failure.append(f"exit status {child.poll()}, stdout {line!r} (stderr: Ray's log)")
            child.kill()
        started.set()
        for _ in child.stdout:  # keep the pipe drained until the child ends
            pass
        status = child.wait()
        if ready and not self._stopping:
            log.error("Node env server %d exited (%s): ending the actor", self.index, status)
            os._exit(1)  # Ray restarts the actor, which starts a new child


def _read_line(stream: Any, timeout: float) -> str:
    """One line of ``stream`` within ``timeout`` seconds ("" on timeout or EOF)."""
    deadline = time.monotonic() + timeout
    selector = selectors.DefaultSelector()
    selector.register(stream, selectors.EVENT_READ)
    try:
        while time.monotonic() < deadline:
            if selector.select(max(0.0, deadline - time.monotonic())):
                return bytes(stream.readline()).decode("utf-8", "replace").strip()
        return ""
    finally:
        selector.close()


def terminate_quietly(pid: int) -> None:
    """SIGTERM ``pid`` if it exists (tests and cleanup)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
