"""Scatter/gather over several env servers: ``connect_many(urls)`` steps them all as one batch.

Env ids are global: server k's envs follow those of servers 0..k-1 (in the order of ``urls``),
and every batch has a leading axis of the total number of envs. Channels that can pipeline
(zmq: ``send_request`` / ``recv_response``) get every request sent before any reply is awaited;
the other backends are driven from a small thread pool. A server that fails does not hide the
others' results: ``BatchError`` lists each failed server's URL, env ids and error, and keeps
the rows that did arrive.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import re
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from transport.actions import ActionShapes
from transport.api import connect
from transport.client import (
    DEFAULT_TIMEOUT,
    Client,
    explain,
    resolve_schema,
    seeds_body,
    session_error,
)
from transport.codec import Schema
from transport.errors import (
    FingerprintMismatchError,
    ProtocolError,
    RemoteError,
    TransportError,
)
from transport.protocol import (
    BODY_OFFSET,
    DEFAULT_MAX_BODY,
    body_codec,
    reset_seed,
)
from transport.runtime.env import Spaces
from transport.step_view import StepView


@runtime_checkable
class PipelinedChannel(Protocol):
    """A channel that can have a request in flight while others are sent (zmq)."""

    def send_request(self, msg_type: int, body: Any, deadline: float | None = None) -> int: ...

    def recv_response(
        self, msg_id: int, deadline: float | None = None
    ) -> tuple[int, memoryview]: ...


@dataclass(frozen=True)
class ServerFailure:
    """One server's part of a failed batch: where, which global env ids, and why.

    ``env_ids``: all of that server's envs (their rows of the batch did not arrive).
    ``failed_env_ids``: the envs the error is about, as global ids, when the server named them
    (its ERROR text says ``env {i}:``, with i the server's own index, as ``EnvError.env_id``
    does); otherwise every env of the server.
    """

    url: str
    env_ids: range
    error: BaseException
    failed_env_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.failed_env_ids:
            object.__setattr__(self, "failed_env_ids", tuple(self.env_ids))

    def __str__(self) -> str:
        ids = _format_ids(self.env_ids)
        failed = self.failed_env_ids
        where = f"envs {ids}"
        if failed != tuple(self.env_ids):
            named = ", ".join(map(str, failed))
            where = f"env{'s' if len(failed) > 1 else ''} {named} (of envs {ids})"
        return f"{where} at {self.url}: {type(self.error).__name__}: {self.error}"

    @classmethod
    def of(cls, url: str, env_ids: range, error: BaseException) -> ServerFailure:
        """Attribute ``error`` to the envs its ERROR text names (server-local -> global ids)."""
        named: tuple[int, ...] = ()
        if isinstance(error, RemoteError):
            local = dict.fromkeys(int(i) for i in _NAMED_ENV.findall(error.text))
            named = tuple(env_ids.start + i for i in local if 0 <= i < len(env_ids))
        return cls(url, env_ids, error, named)


_NAMED_ENV = re.compile(r"(?:^|; )env (\d+):")
"""Every env an ERROR text names: texts are ``env {i}: ...`` joined by ``; ``."""


class BatchError(TransportError):
    """Some servers of a batch failed. ``failures`` says which (url, env ids, error).

    ``results``: the batch with the rows of the servers that answered (the failed servers' rows
    hold their previous values), or None when nothing was stepped (a failed ``connect_many``).
    """

    def __init__(self, failures: list[ServerFailure], results: StepView | None = None) -> None:
        self.failures = failures
        self.results = results
        lines = "; ".join(str(failure) for failure in failures)
        super().__init__(f"{len(failures)} server(s) failed: {lines}")

    @property
    def env_ids(self) -> list[int]:
        """The global env ids the failures are attributed to (see ``ServerFailure``)."""
        return sorted(i for failure in self.failures for i in failure.failed_env_ids)

    @property
    def urls(self) -> list[str]:
        return [failure.url for failure in self.failures]


def _format_ids(ids: range) -> str:
    if len(ids) == 0:
        return "(unknown)"
    return str(ids.start) if len(ids) == 1 else f"{ids.start}-{ids.stop - 1}"


class _Part:
    """One server of the batch: its client, its global env range and its request buffers."""

    def __init__(self, client: Client, start: int) -> None:
        self.client = client
        self.url = client.url
        self.num_envs = client.num_envs
        self.env_ids = range(start, start + client.num_envs)
        ids = client.ids
        schema = client.schema
        step_request = body_codec(schema, "STEP_REQ")
        action = step_request.ir.role("action")
        if action is None:
            raise ProtocolError("the STEP_REQ body struct has no field with role 'action'")
        self.request = bytearray(step_request.size * self.num_envs)
        self.actions = step_request.view(self.request, count=self.num_envs)[action.name]
        self.step_type, self.step_resp = (
            (ids.STEP_REQ, ids.STEP_RESP)
            if self.num_envs == 1
            else (ids.STEP_BATCH_REQ, ids.STEP_BATCH_RESP)
        )
        seed_codec = body_codec(schema, "RESET_SEED_REQ")
        self.seed_codec = seed_codec
        self.seed_body = bytearray(seed_codec.size)


def _check_one_schema(clients: list[Client]) -> None:
    """Every server of a batch speaks the first one's schema (one layout for all rows), else a
    ``FingerprintMismatchError`` naming the first two servers that differ."""
    first = clients[0]
    for other in clients[1:]:
        a, b = first.schema, other.schema
        if a.fingerprint != b.fingerprint:
            raise FingerprintMismatchError(
                "the servers of one batch must speak the same schema: "
                f"{first.url} serves {a.name} (fp {a.fingerprint:016x}), "
                f"{other.url} serves {b.name} (fp {b.fingerprint:016x})",
                local=a.fingerprint,
                remote=b.fingerprint,
            )


class MultiClient:
    """Several env servers stepped as one batch (use ``connect_many`` to make one)."""

    def __init__(self, clients: list[Client], *, timeout: float | None = DEFAULT_TIMEOUT) -> None:
        if not clients:
            raise ValueError("connect_many needs at least one server")
        _check_one_schema(clients)
        self.clients = clients
        self.timeout = timeout
        self.schema = clients[0].schema
        self.parts: list[_Part] = []
        start = 0
        for client in clients:
            self.parts.append(_Part(client, start))
            start += client.num_envs
        self.num_envs = start
        self._result = body_codec(self.schema, "STEP_RESP")
        self._out = bytearray(BODY_OFFSET + self.num_envs * self._result.size)
        rows = self._result.view(self._out, BODY_OFFSET, count=self.num_envs)
        self._view = StepView(rows)
        self._rows = [rows[part.env_ids.start : part.env_ids.stop] for part in self.parts]
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        modes = {str(client.server_info.get("autoreset", "disabled")) for client in clients}
        if len(modes) != 1:
            raise ProtocolError(
                f"the servers of one batch answered different auto-reset modes {modes}"
            )
        self.autoreset = modes.pop()
        policies = {client.masked_actions for client in clients}
        if len(policies) != 1:
            raise ProtocolError(
                f"the servers of one batch have different masked-action policies {policies}: "
                "start them with the same --masked-actions"
            )
        self.masked_actions = policies.pop()
        self.server_info: dict[str, Any] = {**clients[0].server_info, "num_envs": self.num_envs}
        self.finals: list[tuple[int, StepView]] = []
        """SAME_STEP: (global env id, owned final result) of each episode the last step ended;
        the step's own rows hold the reset observations of those envs."""
        self._same_step = self.autoreset == "same_step"
        # one action per global env, by the client's rule (ActionError naming the space)
        self._shapes = ActionShapes(
            self.schema,
            self.num_envs,
            clients[0]._action_space,
            batch_only=True,
        )

    @property
    def action_dtype(self) -> np.dtype[Any]:
        """The action field's element dtype: actions of it are taken without a range check."""
        return self._shapes.dtype

    @property
    def urls(self) -> list[str]:
        return [part.url for part in self.parts]

    @property
    def url(self) -> str:
        """The servers' URLs in one string (errors and adapters name it)."""
        return " + ".join(self.urls)

    @property
    def env_slices(self) -> list[slice]:
        """Which rows of a batch each server (in ``urls`` order) fills."""
        return [slice(part.env_ids.start, part.env_ids.stop) for part in self.parts]

    def spaces(self) -> Spaces:
        return self.clients[0].spaces()

    def reset(
        self, seed: int | Sequence[int | None] | None = None, *, copy: bool = False
    ) -> StepView:
        """Reset every env of every server; global env i gets ``seed + i`` (or ``seed[i]`` from
        a list of one seed or None per global env)."""
        checked = reset_seed(seed, self.num_envs)
        base = checked if isinstance(checked, int) else None
        seeds = checked if isinstance(checked, list) else None
        with self._calls():  # before the shared seed bodies are written
            requests: list[tuple[int, Any, int]] = []
            for part in self.parts:
                ids = part.client.ids
                if seeds is not None:
                    mine = seeds[part.env_ids.start : part.env_ids.stop]
                    body = seeds_body(self.schema, mine, part.client.num_envs)
                    requests.append((ids.RESET_SEEDS_REQ, body, ids.RESET_RESP))
                elif seed is None:
                    requests.append((ids.RESET_REQ, b"", ids.RESET_RESP))
                else:
                    name = part.seed_codec.ir.fields[0].name
                    assert base is not None
                    first = base + part.env_ids.start
                    part.seed_codec.encode_into(part.seed_body, 0, {name: first})
                    requests.append((ids.RESET_SEED_REQ, part.seed_body, ids.RESET_RESP))
            self.finals = []
            self._run(requests)
            return self._view.copy() if copy else self._view

    def step(self, actions: Any, *, copy: bool = False) -> StepView:
        """Step with one action per global env, shape (num_envs, *action shape); fields have a
        leading axis of ``num_envs``. Any other argument is ``ActionError`` (nothing is sent)."""
        flat, _ = self._shapes.count(actions)
        with self._calls():
            requests = []
            for part in self.parts:
                part.actions[:] = flat[part.env_ids.start : part.env_ids.stop]
                requests.append((part.step_type, part.request, part.step_resp))
            self.finals = []
            self._run(requests, finals=self._same_step)
            if self.finals:
                self.finals.sort(key=lambda final: final[0])
            return self._view.copy() if copy else self._view

    def _calls(self) -> contextlib.ExitStack:
        """Every server's client for this call (``Client._call``: another thread in a call on
        this batch, or on one of its clients, is refused at once; those taken are given back)."""
        stack = contextlib.ExitStack()
        with stack:
            for client in self.clients:
                stack.enter_context(client._call())
            return stack.pop_all()

    def close(self) -> None:
        """Close every client. One in a call on another thread refuses (``Client.close``): the
        others are closed all the same, the first refusal is raised, and a later ``close()``
        closes the rest."""
        if self._closed:
            return
        refused: TransportError | None = None
        for client in self.clients:
            try:
                client.close()
            except TransportError as exc:
                refused = refused or exc
        if refused is not None:
            raise refused
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    def __enter__(self) -> MultiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------------

    def _run(self, requests: list[tuple[int, Any, int]], *, finals: bool = False) -> None:
        if self._closed:
            raise TransportError("the client is closed")
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        failures: dict[int, BaseException] = {}
        sent: dict[int, tuple[PipelinedChannel, int]] = {}
        futures: dict[int, Future[None]] = {}
        for k, (part, (msg_type, body, expect)) in enumerate(
            zip(self.parts, requests, strict=True)
        ):
            channel = part.client.channel
            if isinstance(channel, PipelinedChannel):
                try:  # every pipelined request goes out before any reply is awaited
                    sent[k] = (channel, channel.send_request(msg_type, body, deadline))
                except TransportError as exc:
                    failures[k] = exc
            else:
                futures[k] = self._thread_pool().submit(
                    self._exchange, k, msg_type, body, expect, finals
                )
        try:
            for k, (pipe, msg_id) in sent.items():
                try:
                    resp_type, resp = pipe.recv_response(msg_id, deadline)
                    self._accept(k, requests[k][2], resp_type, resp, finals)
                except TransportError as exc:
                    failures[k] = exc
            for k, future in futures.items():
                error = future.exception()
                if error is not None:
                    failures[k] = error
        except BaseException:
            # Ctrl-C while waiting: the pool's exchanges still run on their servers' channels;
            # a next call would start another on a channel mid-exchange. Wait for them first
            # (a second Ctrl-C stops waiting); a pipelined reply left unread is discarded by
            # its msg_id when the next one is awaited.
            concurrent.futures.wait(futures.values())
            raise
        if failures:
            raise BatchError(
                [
                    ServerFailure.of(self.parts[k].url, self.parts[k].env_ids, failures[k])
                    for k in sorted(failures)
                ],
                self._view.copy(),
            )

    def _exchange(self, k: int, msg_type: int, body: Any, expect: int, finals: bool) -> None:
        resp_type, resp = self.parts[k].client.channel.request(msg_type, body)
        self._accept(k, expect, resp_type, resp, finals)

    def _accept(
        self, k: int, expect: int, resp_type: int, resp: memoryview, finals: bool = False
    ) -> None:
        """Check server k's reply and copy its results (and SAME_STEP finals, under global env
        ids) into the batch."""
        part = self.parts[k]
        ids = part.client.ids
        if resp_type == ids.ERROR:
            raise explain(session_error(resp), part.client.url)
        if resp_type != expect:
            raise ProtocolError(f"expected msg_type 0x{expect:02X}, got 0x{resp_type:02X}")
        channel = part.client.channel
        records = channel.result_records(resp, self._result, part.num_envs, finals)
        self._rows[k][...] = records
        if finals:
            start = part.env_ids.start
            for index, record in channel.final_records():  # list.extend: thread-safe
                self.finals.append((start + index, StepView(np.array(record, copy=True))))

    def _thread_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=len(self.parts), thread_name_prefix="transport-multi"
            )
        return self._pool


def connect_many(
    urls: Sequence[str],
    schema: Schema | str | Path | None = None,
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    max_body: int = DEFAULT_MAX_BODY,
    autoreset: str = "disabled",
) -> MultiClient:
    """Connect to every server (in parallel) and step them as one batch of all their envs.

    Any backend URL works; zmq servers are pipelined. Raises ``BatchError`` naming the servers
    that could not be reached, ``FingerprintMismatchError`` naming two servers of different
    schemas; on any failure the servers that did connect are closed again. ``autoreset``: as for
    ``transport.connect`` (every server runs it); with "same_step", ``finals`` lists the final
    results of the episodes the last step ended, under global env ids.
    """
    if not urls:
        raise ValueError("connect_many needs at least one URL")
    codecs = None if schema is None else resolve_schema(schema)  # None: each discovers

    def one(url: str) -> Client:
        return connect(url, codecs, timeout=timeout, max_body=max_body, autoreset=autoreset)

    with ThreadPoolExecutor(max_workers=len(urls), thread_name_prefix="transport-connect") as pool:
        futures = [pool.submit(one, url) for url in urls]
        outcomes = [
            (url, future.exception(), future) for url, future in zip(urls, futures, strict=True)
        ]
    clients = [future.result() for _, error, future in outcomes if error is None]
    failed = [
        ServerFailure(url, range(0), error) for url, error, _ in outcomes if error is not None
    ]
    try:
        if failed:
            raise BatchError(failed)
        return MultiClient(clients, timeout=timeout)
    except BaseException:
        # the servers that did connect hold resources (an shm:// region's client seat) until
        # closed: a batch that cannot form must not keep them from the next connect
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()
        raise
