"""The two entry points: ``connect(url)`` for trainers and ``serve(env, url)`` for env servers."""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

from transport.backends import backend_for
from transport.backends.base import MAX_NUM_ENVS as MAX_NUM_ENVS
from transport.backends.socket_listener import ServerLimits as ServerLimits
from transport.backends.socket_listener import SocketListener
from transport.client import (
    DEFAULT_TIMEOUT,
    Client,
    check_timeout,
    check_url,
    explain,
    handshake,
    not_a_server,
    resolve_schema,
)
from transport.codec import Schema
from transport.errors import TransportError
from transport.protocol import DEFAULT_MAX_BODY, AutoReset, body_codec, encode_hello_request
from transport.runtime.env import Env, Served, awaited_text, is_vector_env
from transport.runtime.host import EnvHost

log = logging.getLogger("transport.server")


# Start-up limits, the same in the Node server (docs/decisions.md); MAX_NUM_ENVS (imported
# above) lives with the backends, whose clients check it too.
MAX_BODY_LIMIT = 0xFFFFFFFF
"""The largest --max-body: a frame header's body_len is a u32."""
FINAL_ENTRY_EXTRA = 4
"""SAME_STEP tail: a u32 count, then per ended env a u32 index and its final result."""


def largest_request(schema: Schema, num_envs: int) -> tuple[int, str]:
    """The largest fixed-size request a client of a framed server with ``num_envs`` envs sends,
    and which: a STEP_BATCH of ``N * A`` bytes (A: the STEP_REQ struct), STEP_MULTI_REQ,
    RESET_SEED_REQ (their struct sizes), RESET_SEEDS_REQ (N x 16), or the HELLO_REQ (12 bytes
    and a msgpack tail naming the schema, or asking to discover it), whichever is largest."""
    action = body_codec(schema, "STEP_REQ").size
    candidates = [
        (num_envs * action, f"a STEP_BATCH request for {num_envs} envs ({num_envs} x {action})"),
        (body_codec(schema, "STEP_MULTI_REQ").size, "a STEP_MULTI request"),
        (body_codec(schema, "RESET_SEED_REQ").size, "a RESET_SEED request"),
        (
            max(len(encode_hello_request(schema)), len(encode_hello_request(None))),
            "a HELLO request",
        ),
        (
            num_envs * body_codec(schema, "RESET_SEEDS_REQ").size,
            f"a RESET_SEEDS request for {num_envs} envs",
        ),
    ]
    return max(candidates, key=lambda item: item[0])


def largest_response(schema: Schema, num_envs: int) -> tuple[int, str]:
    """The largest fixed-size response a framed server with ``num_envs`` envs sends, and which:
    a step response with SAME_STEP finals for every env, ``R * S + 4 + N * (4 + S)`` bytes
    (S: the STEP_RESP struct; R = max(N, seats): a step_batch env answers one row per seat)."""
    result = body_codec(schema, "STEP_RESP").size
    seats = body_codec(schema, "STEP_MULTI_REQ").ir.fields[0].count
    rows = max(num_envs, seats)
    size = rows * result + FINAL_ENTRY_EXTRA + num_envs * (FINAL_ENTRY_EXTRA + result)
    return size, (
        f"a step response for {num_envs} envs with same_step finals "
        f"({rows} x {result} + 4 + {num_envs} x (4 + {result}))"
    )


def check_server_limits(schema: Schema, url: str, *, num_envs: int, max_body: int) -> None:
    """Refuse, before anything is created, limits with which a server would start and then
    refuse every client (``ValueError`` naming the numbers). The rules, in this order:

    1. ``num_envs`` is an integer in 1..MAX_NUM_ENVS;
    2. ``max_body`` (the largest request body the server accepts) is in 1..MAX_BODY_LIMIT;
    3. framed backends (every one but shm://): ``largest_request <= max_body`` (else every
       step would be refused);
    4. framed backends: ``largest_response <= max(max_body, DEFAULT_MAX_BODY)`` (else a client
       with the default max_body refuses every reset; raising max_body opts in, and its clients
       then connect with a max_body as large).
    """
    if isinstance(num_envs, bool) or not isinstance(num_envs, int):
        raise ValueError(f"num_envs must be an integer, not {num_envs!r}")
    if not 1 <= num_envs <= MAX_NUM_ENVS:
        raise ValueError(f"num_envs must be 1..{MAX_NUM_ENVS}, not {num_envs}")
    if isinstance(max_body, bool) or not isinstance(max_body, int):
        raise ValueError(f"max_body must be an integer, not {max_body!r}")
    if not 1 <= max_body <= MAX_BODY_LIMIT:
        raise ValueError(f"max_body must be 1..{MAX_BODY_LIMIT} bytes, not {max_body}")
    if url.partition("://")[0].lower() == "shm":
        return  # no frames: the region's size is checked against /dev/shm when it is created
    need, what = largest_request(schema, num_envs)
    if need > max_body:
        raise ValueError(
            f"max_body {max_body} is too small for num_envs={num_envs} with schema "
            f"{schema.name}: {what} is {need} bytes; raise max_body to at least {need}"
        )
    need, what = largest_response(schema, num_envs)
    limit = max(max_body, DEFAULT_MAX_BODY)
    if need > limit:
        raise ValueError(
            f"num_envs={num_envs} is too many for schema {schema.name} with max_body "
            f"{max_body}: {what} is {need} bytes, over {limit} (the larger of max_body and the "
            f"default {DEFAULT_MAX_BODY} clients accept); serve fewer envs, or raise max_body "
            f"to at least {need} and connect clients with max_body >= {need}"
        )


class ServerStoppedError(TransportError):
    """The server stopped serving on its own (not by ``close()``); the message says why."""


def connect(
    url: str,
    schema: Schema | str | Path | None = None,
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    max_body: int = DEFAULT_MAX_BODY,
    autoreset: AutoReset | str = AutoReset.DISABLED,
) -> Client:
    """Connect to an env server and complete the HELLO handshake.

    ``schema``: a ``Schema`` or a schema file pins the session to it (a server with another
    schema is refused, the error naming both); None discovers the server's schema in the
    handshake (its compiled IR, checked against its fingerprint; ``client.schema``).
    ``timeout``: seconds any one wait may take (connecting, each request), a number > 0; a dead
    or silent server is an error within it. None, ``math.inf`` or more than 2**31 - 1 ms (about
    24.8 days): no deadline (``check_timeout``). ``autoreset``: "disabled" (the client
    resets), "next_step" (gymnasium 1.x) or "same_step" (SB3; final results in
    ``client.finals``). ``url`` is a str (a ``TypeError`` otherwise)."""
    check_url(url)
    timeout = check_timeout(timeout)
    codecs = None if schema is None else resolve_schema(schema)
    mode = autoreset if isinstance(autoreset, AutoReset) else AutoReset[autoreset.upper()]
    try:
        backend = backend_for(url)
    except TransportError as exc:
        explain(exc, url)  # names the URL, as every connect error does
        raise
    # a discovering HELLO_RESP carries the IR (KBs): its channel takes at least the default
    # max_body, and a smaller limit asked for applies to the pinned channel opened after it
    first_max = max_body if codecs is not None else max(max_body, DEFAULT_MAX_BODY)
    try:
        channel = backend.open_channel(url, timeout=timeout, max_body=first_max, schema=codecs)
    except TransportError as exc:
        explain(exc, url)  # names the URL and what to do
        raise
    try:
        found, channel.info = handshake(channel, codecs, mode, url=url)
        adopt = getattr(channel, "adopt", None)
        if codecs is None and first_max == max_body and adopt is not None:
            adopt(found)  # HTTP: the same connection (and server session), found's fingerprint
        elif codecs is None and (first_max != max_body or not _built_for(channel, found)):
            # the channel was opened before the schema was known and carries a schema of its
            # own, or a larger max_body: a fresh one, pinned to the discovered schema
            channel.close()
            channel = backend.open_channel(url, timeout=timeout, max_body=max_body, schema=found)
            found, channel.info = handshake(channel, found, mode, url=url)
    except BaseException as exc:
        channel.close()
        error = not_a_server(exc)
        if isinstance(error, TransportError):
            explain(error, url)
        if error is exc:
            raise
        raise error from exc
    return Client(channel, found, channel.url or url)


def _built_for(channel: Any, schema: Schema) -> bool:
    """The channel opened without a schema already speaks ``schema``: it carries none (unix and
    zmq frames: reopening would make the server build a session and its envs twice), found it
    itself (shm reads it from the region) or its default happens to be it."""
    if getattr(channel, "speaks_any_schema", False):
        return True
    own = getattr(channel, "schema", None)
    return isinstance(own, Schema) and own.fingerprint == schema.fingerprint


def declared_schema(env_or_factory: Any) -> Schema | None:
    """The schema an env declares, or None: a ``SCHEMA`` attribute (a ``Schema``) of the env,
    its class or factory (a ``functools.partial``: of its function), else of the module that
    defines it (``transport-serve --env module:Factory`` looks there too); a reference env of
    ``transport.envs`` (or a subclass of one) speaks its known schema."""
    import functools
    import inspect

    from transport.envs import ENVS, env_schema

    target = env_or_factory
    while isinstance(target, functools.partial):
        target = target.func
    owners: list[Any] = [env_or_factory, target]
    if not inspect.isclass(target) and not inspect.isroutine(target):
        owners.append(type(target))  # an env instance: its class
    for owner in owners:
        declared = getattr(owner, "SCHEMA", None)
        if isinstance(declared, Schema):
            return declared
    for owner in owners[1:]:
        module = sys.modules.get(getattr(owner, "__module__", "") or "")
        declared = getattr(module, "SCHEMA", None)
        if isinstance(declared, Schema):
            return declared
    known = {path: name for name, path in ENVS.items()}
    for owner in owners[1:]:
        for cls in getattr(owner, "__mro__", ()):
            name = known.get(f"{cls.__module__}:{cls.__qualname__}")
            if name is not None:
                return env_schema(name)
    return None


def check_default_schema_fits(schema: Schema, env_or_factory: Any, url: str) -> None:
    """For an env that declares no schema and no ``EnvHost`` to ask (``transport.ray.launch``):
    make one env (or take the instance), run ``default_schema_check`` on it and close it."""
    if is_vector_env(env_or_factory):
        return  # a vector env instance: the runtime checks its columns against the schema
    shared = not isinstance(env_or_factory, type) and isinstance(env_or_factory, Env)
    try:
        env = env_or_factory if shared else env_or_factory()
    except Exception:
        return  # making it fails: the server reports that itself, with the reason
    try:
        default_schema_check(schema, env_or_factory, url)(env)
    finally:
        close = None if shared else getattr(env, "close", None)
        if close is not None:
            close()


def default_schema_check(schema: Schema, env_or_factory: Any, url: str) -> Callable[[Any], None]:
    """For an env that declares no schema: a check that resets an env and tells whether its
    result fits ``schema`` (pac_env, the default), a ``TypeError`` naming what to pass when it
    does not, so a server never starts serving results it cannot encode (every reset would
    fail with "StepResult.observation: no value given"). ``Server`` runs it on the env its
    start check makes (kept for the first client: no env is made for it alone)."""
    name = getattr(env_or_factory, "__qualname__", None) or type(env_or_factory).__qualname__

    def check(env: Any) -> None:
        if is_vector_env(env):
            return  # a vector env: the runtime checks its columns against the schema
        try:
            output = env.reset(None)
        except Exception:
            return  # resetting it fails: the server reports that itself, with the reason
        awaited = awaited_text(output)
        if awaited is not None:
            raise TypeError(f"Server({name}, {url!r}): reset() {awaited}")
        codec = body_codec(schema, "STEP_RESP")
        try:
            if isinstance(output, np.ndarray | np.void):
                if output.dtype != codec.dtype:
                    fields = ", ".join(output.dtype.names or ())
                    raise TypeError(f"its reset returned a record of other fields ({fields})")
            else:
                codec.encode(output)
        except (TransportError, TypeError) as exc:
            raise TypeError(
                f"Server({name}, {url!r}): no schema= was given and {name} declares none, so "
                f"the default schema {schema.name} was tried, and {name}'s results do not fit "
                f"it: {exc}. Pass schema= (transport.load_schema('your_env.toml'), or a "
                f"generated module's SCHEMA), or give {name} (or its module) a SCHEMA attribute"
            ) from None
        log.info(
            "%s declares no schema; its results fit the default %s, which is served (pass "
            "schema= to say so)",
            name,
            schema.name,
        )

    return check


class Server:
    """A running server: ``close()`` stops it and removes what it created (socket files)."""

    def __init__(
        self,
        env_or_factory: Served,
        url: str,
        *,
        schema: Schema | str | Path | None = None,
        num_envs: int = 1,
        env_name: str = "",
        seed: int | None = None,
        max_body: int = DEFAULT_MAX_BODY,
        workers: int = 0,
        limits: ServerLimits | None = None,
        masked_actions: str = "reject",
        step_timeout: float | None = None,
    ) -> None:
        # no schema=: the env's declared one; none declared: pac_env, checked to fit (below)
        declared = schema if schema is not None else declared_schema(env_or_factory)
        codecs = resolve_schema(declared)
        backend = backend_for(url)  # a bad URL (scheme, shm name) is a ConnectError here
        if url.partition("://")[0].lower() == "shm":
            from transport.backends.shm.region import parse_url

            num_envs = _shm_num_envs(parse_url(url).num_envs, num_envs)
        check_server_limits(codecs, url, num_envs=num_envs, max_body=max_body)
        host = EnvHost(
            codecs,
            env_or_factory,
            num_envs=num_envs,
            env_name=env_name,
            seed=seed,
            workers=workers,
            masked_actions=masked_actions,
            step_timeout=step_timeout,
        )
        try:
            # no schema declared: the env made now (the first client's) is tried against pac_env
            host.check(
                default_schema_check(codecs, env_or_factory, url) if declared is None else None
            )
            listener: Any = backend.Listener
            capped = isinstance(listener, type) and issubclass(listener, SocketListener)
            if capped:  # unix, http: the connection cap and timeouts (docs/server.md "Limits")
                self.listener: Any = listener(url, host, max_body=max_body, limits=limits)
            elif url.partition("://")[0].lower().startswith("zmq+"):  # idle sessions are closed
                idle = (limits or ServerLimits()).idle_timeout
                self.listener = listener(url, host, max_body=max_body, idle_timeout=idle)
            else:
                self.listener = listener(url, host, max_body=max_body)
        except BaseException:
            host.close()
            raise
        self.host = host
        self.url = url
        self.schema = codecs
        self.num_envs = num_envs
        self.workers = workers
        self._thread: threading.Thread | None = None
        self._closing = False
        self._pid = os.getpid()  # the process that serves (``close`` in a forked child: nothing)
        self.stopped = threading.Event()  # set when the serving thread ends, for any reason
        self.failure: str | None = None  # why it ended without close(), when it did
        self._on_stop: Callable[[], None] | None = None

    @property
    def bound_url(self) -> str:
        """The URL clients should use (a port 0 request is resolved to the real port)."""
        return str(self.listener.url)

    def start(self) -> Server:
        """Bind now (errors surface here) and serve in a background thread.

        A server still open when the interpreter exits is closed then (atexit), so a script that
        forgets ``close()`` leaves no socket file or shared-memory segment behind.
        """
        self.listener.start()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        atexit.register(self.close)
        return self

    def _run(self) -> None:
        """Serve until ``close()``. A loop that ends otherwise (an exception, or a backend that
        stops, e.g. an shm region whose state word another process changed) leaves the reason
        in ``failure`` and a log line: a server either serves or says it stopped."""
        try:
            self.listener.serve_forever()
        except BaseException as exc:
            if not self._closing:
                self.failure = f"{self.url}: the server loop failed: {type(exc).__name__}: {exc}"
                log.exception("%s", self.failure)
        else:
            if not self._closing:
                reason = getattr(self.listener, "stop_reason", None)
                self.failure = reason or f"{self.url}: the server loop stopped on its own"
                if reason is None:
                    log.error("%s", self.failure)
        finally:
            self.stopped.set()
            if self._on_stop is not None:
                self._on_stop()

    def check(self) -> None:
        """Raise ``ServerStoppedError`` if the server stopped serving without ``close()``."""
        if self.failure is not None:
            raise ServerStoppedError(self.failure)

    def close(self) -> None:
        """Stop serving and remove what the server created. In a process forked from the one
        that started it (``os.fork``: its atexit runs this too) nothing: the socket file, the
        shm region and the workers are the parent's, still serving."""
        self._closing = True
        atexit.unregister(self.close)
        if os.getpid() != self._pid:
            return
        self.listener.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.host.close()  # the env made at start, if no client took it

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(
    env_or_factory: Served,
    url: str,
    *,
    schema: Schema | str | Path | None = None,
    num_envs: int = 1,
    env_name: str = "",
    seed: int | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    ready: Callable[[str], None] | None = None,
    workers: int = 0,
    limits: ServerLimits | None = None,
    masked_actions: str = "reject",
    step_timeout: float | None = None,
) -> None:
    """Serve until SIGINT or SIGTERM, then clean up. ``ready(url)`` runs once clients can connect.

    ``env_or_factory``: an env instance (one env, shared by every connection under a lock) or a
    zero-argument factory (each connection gets ``num_envs`` fresh envs). ``schema``: the
    schema its results follow; None takes the one the env declares (``declared_schema``: a
    ``SCHEMA`` attribute of the env, its class, factory or module, or a reference env's), else
    pac_env once one env's reset result is checked to fit it (a ``TypeError`` naming what to
    pass when it does not). ``seed``: the seed of
    each connection's first unseeded reset (env i gets ``seed + i``). ``workers``: 0 steps the
    envs in this process; K >= 1 runs each connection's envs in K worker processes (split
    evenly; ``transport.runtime.pool``), same protocol behaviour, one fan-out/gather per step.
    ``limits``: the connection cap and the idle and read timeouts of a unix:// or http://
    server (``ServerLimits``; default 1024 connections, 600 s idle, 30 s to complete a request);
    a zmq server closes a session idle for ``idle_timeout`` (docs/server.md "Limits").
    ``masked_actions``: what an action the env's mask forbids does: "reject" (MASKED_ACTION
    error), "pass" (the env steps with it) or "noop" (the env does not step; its previous
    result comes back with reward ``env.masked_action_penalty``, default 0.0); docs/adapters.md.
    ``step_timeout``: with workers, seconds one worker may take over a lock-step request
    before it counts as stuck: it is killed and replaced, its envs fail with ENV_ERROR
    (default 60).

    Call it from the main thread: only the main thread receives signals. In a daemon thread it
    serves until its server stops on its own (``ServerStoppedError``) or the process exits; in
    any other thread it is refused at once (``RuntimeError``): nothing could stop it, and the
    process would never exit. There, use ``Server(...).start()`` and ``close()``.
    """
    check_serve_thread("serve")
    server = Server(
        env_or_factory,
        url,
        schema=schema,
        num_envs=num_envs,
        env_name=env_name,
        seed=seed,
        max_body=max_body,
        workers=workers,
        limits=limits,
        masked_actions=masked_actions,
        step_timeout=step_timeout,
    )
    # The wait is a read on a pipe that the C-level signal handler itself writes to
    # (signal.set_wakeup_fd): the kernel may deliver SIGTERM to a server thread rather than the
    # main one, and a Python handler alone would then never interrupt the main thread's wait.
    # The Python handler does nothing: it only replaces the default action (KeyboardInterrupt,
    # termination); taking a lock there (threading.Event.set) could deadlock.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    previous: dict[signal.Signals, Any] = {}
    previous_wakeup_fd: int | None = None

    def on_signal(signum: int, frame: FrameType | None) -> None:
        pass  # the wakeup fd has already woken the main thread

    def on_stop() -> None:  # the serving thread ended: wake the wait below
        try:
            os.write(wake_w, b"s")
        except OSError:
            pass

    server._on_stop = on_stop
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
        previous_wakeup_fd = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    try:
        server.start()
        log_line(server)
        if ready is not None:
            ready(server.bound_url)
        # until SIGINT or SIGTERM (only in the main thread) or the serving thread ends
        os.read(wake_r, 1)
    finally:
        server._on_stop = None
        server.close()
        if previous_wakeup_fd is not None:
            signal.set_wakeup_fd(previous_wakeup_fd)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(wake_r)
        os.close(wake_w)
    server.check()  # stopped on its own: an error (the CLI exits 1), never a silent return


def check_serve_thread(name: str) -> None:
    """Refuse ``serve()`` / ``serve_gym()`` in a thread that is neither the main thread nor a
    daemon: signals reach only the main thread, so SIGINT and SIGTERM would never stop it, and
    the process would wait for it forever when its main thread ends (a SIGTERM killing it then
    leaves the socket file behind)."""
    thread = threading.current_thread()
    if thread is threading.main_thread() or thread.daemon:
        return
    raise RuntimeError(
        f"transport.{name}() was called in thread {thread.name!r}, which is neither the main "
        "thread nor a daemon: it serves until SIGINT or SIGTERM, which only the main thread "
        "receives, so it could never stop and the process would never exit. In a thread, use "
        "server = transport.Server(env, url, ...).start() and server.close() to stop it (or "
        "call serve() from the main thread)"
    )


def log_line(server: Server) -> None:
    """The one line ``serve()`` writes to stderr once it serves: where, what, how many, who."""
    schema = server.schema
    where = f"{server.workers} worker processes" if server.workers else "in this process"
    print(
        f"transport: serving {server.bound_url}: schema {schema.name} ({schema.fingerprint:016x}), "
        f"{server.num_envs} env(s) per connection ({where}), pid {os.getpid()}",
        file=sys.stderr,
        flush=True,
    )


def _shm_num_envs(from_url: int | None, given: int) -> int:
    """The envs an shm server will have: the URL's num_envs wins over the default of 1."""
    return from_url if from_url is not None and given == 1 else given
