"""``ClusterClient``: every env of a ``launch()`` as one batch, surviving the loss of a server.

Global env ids as in ``transport.connect_many``: server k holds envs ``k * n .. k * n + n - 1``.

**Loss.** A server that stops answering (its actor's process was killed, its node was lost, or
it stayed silent past the timeout) fails the call within the client's ``timeout``: a dropped
connection is seen at once for a killed process and after ~3 s of missed ZMTP heartbeats for a
vanished host (``PeerGoneError``), a silent one at the timeout (``TransportTimeoutError``). The
other servers' envs did their step. The lost server's client is dropped: its envs are *lost*.

**Policy** (``LostEnvPolicy``):

- ``on_step="raise"`` (default): the call raises ``EnvsLostError`` (a ``BatchError``) naming
  the lost global env ids; ``results`` is the batch (lost rows hold their last values). Until
  the next ``reset()`` (or ``reset_lost()``) every step steps the live servers and raises it
  again. ``reset()`` asks Ray for the restarted actors' endpoints (a new port and a new key),
  reconnects, and resets every env.
- ``on_step="truncate"`` (what the Gymnasium and SB3 adapters use): no exception; the lost
  envs' episodes end there as truncated (``truncated_by_loss`` marks them; the adapters report
  ``truncated=True``) and they come back at their next reset: at the next step with
  ``next_step`` auto-reset (their reset result, as after any episode end), in the same call with
  ``same_step`` (the reset result in the batch, their last rows in ``finals``), at the next
  ``reset()`` with auto-reset disabled. ``restored`` marks envs reset that way. The typed error
  still reaches the trainer: ``last_lost``, the ``on_lost`` callback and a log warning.

Restoring waits up to ``reconnect_timeout`` for Ray to restart the actor, then raises
``EnvsLostError``. Healthy steps with ``disabled`` or ``next_step`` auto-reset go through one
pipelined ``transport.multi.MultiClient`` (every request sent before any reply is awaited) and
return its view with no extra copy; ``same_step`` steps (whose replies carry a final-result tail)
and degraded steps drive each server's ``Client`` from a thread pool and copy rows into a batch.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from transport.actions import ActionShapes, describe_action_space
from transport.errors import (
    ConnectError,
    PeerGoneError,
    TransportError,
    TransportTimeoutError,
)
from transport.multi import BatchError, MultiClient, ServerFailure
from transport.protocol import reset_seed
from transport.ray.servers import DEFAULT_TIMEOUT, RayLaunchError, ServerSet, connect_all
from transport.step_view import StepView

if TYPE_CHECKING:
    from transport.client import Client
    from transport.codec import Schema
    from transport.runtime.env import Spaces

log = logging.getLogger("transport.ray")

AUTORESET_MODES = ("disabled", "next_step", "same_step")
LOSS_ERRORS: tuple[type[TransportError], ...] = (
    PeerGoneError,
    TransportTimeoutError,
    ConnectError,
)
"""Errors that mean "this server is gone or unreachable" rather than "this request was bad"."""

_T = TypeVar("_T")

Seed = int | Sequence[int | None] | np.ndarray | None
"""What ``reset`` takes: an int (global env i gets ``seed + i``), one int or None per global env
(a list, a tuple, a 1-d array: env i gets ``seed[i]``; None resets it unseeded), or None."""
_Seeds = int | list[int | None] | None
"""A ``Seed`` as the servers' clients take it (``ClusterClient._seeds``)."""


@dataclass(frozen=True)
class LostEnvPolicy:
    """What a ``ClusterClient`` does when env servers are lost (see the module docstring).

    ``on_step``: "raise" (the step raises ``EnvsLostError``; ``reset()`` reconnects) or
    "truncate" (the lost envs' episodes end as truncated; their next reset reconnects).
    ``reconnect_timeout``: seconds a reconnect waits for Ray to restart the actor.
    ``on_lost``: called with the ``EnvsLostError`` when ``on_step="truncate"`` swallows it.
    """

    on_step: str = "raise"
    reconnect_timeout: float = 120.0
    on_lost: Callable[[EnvsLostError], None] | None = None

    def __post_init__(self) -> None:
        if self.on_step not in ("raise", "truncate"):
            raise ValueError(f"on_step must be 'raise' or 'truncate', not {self.on_step!r}")


class EnvsLostError(BatchError):
    """Env servers were lost: ``lost_env_ids`` (global ids) and ``lost_servers`` say which.

    A ``BatchError``: ``failures`` has one ``ServerFailure`` per failed server (URL, env ids,
    the underlying ``PeerGoneError`` / ``TransportTimeoutError`` / ``ConnectError``), and
    ``results`` the batch, whose live rows did their step.
    """

    def __init__(
        self,
        failures: list[ServerFailure],
        results: StepView | None,
        lost_servers: Sequence[int],
        lost_env_ids: Sequence[int],
        reason: str = "",
    ) -> None:
        super().__init__(failures, results)
        self.lost_servers = tuple(lost_servers)
        self.lost_env_ids = tuple(lost_env_ids)
        detail = "; ".join(str(failure) for failure in failures)
        text = f"lost envs {_ranges(self.lost_env_ids)} (servers {list(self.lost_servers)})"
        self.args = (f"{text}{': ' + reason if reason else ''}: {detail}",)


def _ranges(ids: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2, 5``."""
    parts: list[str] = []
    start = prev = None
    for i in sorted(ids):
        if start is None or prev is None or i != prev + 1:
            if start is not None and prev is not None:
                parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = i
        prev = i
    if start is not None and prev is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ", ".join(parts) or "(none)"


class ClusterClient:
    """All envs of an ``EnvServers`` as one batch, with a lost-server policy.

    Client-like: ``num_envs``, ``schema``, ``server_info``, ``spaces()``, ``reset(seed)``,
    ``step(actions)``, ``finals``, ``close()``; results are views valid until the next call
    (``copy=True`` for owned arrays). ``reset(seed)`` gives global env i the seed ``seed + i``,
    ``reset([s0, s1, ...])`` (one int or None per global env) the seed ``s_i``, in every
    auto-reset mode (``Client.reset``'s rule).

    **Interrupted calls.** A call interrupted by Ctrl-C (``KeyboardInterrupt``), or failed by an
    error that is not a ``TransportError``, waits for the requests already sent to their servers
    (each at most the client's ``timeout``) before it raises: no server's client is left in a
    call, and the next call works. The interrupted step was done by the servers that got it
    (every server, unless it was interrupted while the requests went out) and its results are
    lost, as with an interrupted ``Client`` call: call ``reset()`` to go on from observations
    you have seen. A second Ctrl-C during that wait stops waiting.
    """

    def __init__(
        self,
        servers: ServerSet,
        *,
        autoreset: str = "disabled",
        timeout: float | None = DEFAULT_TIMEOUT,
        policy: LostEnvPolicy | None = None,
    ) -> None:
        mode = autoreset.lower()
        if mode not in AUTORESET_MODES:
            raise ValueError(f"autoreset must be one of {', '.join(AUTORESET_MODES)}")
        self.servers = servers
        self.autoreset_mode = mode
        self.timeout = timeout
        self.policy = policy or LostEnvPolicy()
        self.num_servers = servers.num_servers
        self.num_envs = servers.num_envs
        self._per_server = servers.num_envs_per_server
        self._clients: list[Client | None] = list(
            connect_all(servers, autoreset=mode, timeout=timeout)
        )
        first = self._clients[0]
        assert first is not None
        self.schema: Schema = first.schema
        self.url = servers.describe()
        self.server_info: dict[str, Any] = {
            **first.server_info,
            "num_envs": self.num_envs,
            "servers": self.num_servers,
        }
        body = self.schema.ir.messages["STEP_RESP"].body
        if body is None:
            raise TransportError(f"schema {self.schema.name}: STEP_RESP has no body struct")
        self._batch = StepView(self.schema[body].zeros(self.num_envs))
        # one action per global env, by the client's rule (ActionError naming the space)
        self._shapes = ActionShapes(self.schema, self.num_envs, self._action_space, batch_only=True)
        self.finals: list[tuple[int, StepView]] = []
        """SAME_STEP: (global env index, owned final result) of each episode that ended in the
        last call, the lost envs' last rows included."""
        self.truncated_by_loss = np.zeros(self.num_envs, dtype=bool)
        """Envs whose episode ended in the last call because their server was lost."""
        self.restored = np.zeros(self.num_envs, dtype=bool)
        """Envs reconnected and reset in the last call (their row is a reset result)."""
        self.last_lost: EnvsLostError | None = None
        self._lost: set[int] = set()
        self._pending: set[int] = set()
        self._fast: MultiClient | None = None
        self._pool = (
            ThreadPoolExecutor(max_workers=self.num_servers, thread_name_prefix="transport-ray")
            if self.num_servers > 1
            else None
        )
        self._closed = False

    # -- what it is ----------------------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        return self.servers.urls

    @property
    def env_slices(self) -> list[slice]:
        """Which rows of a batch each server fills."""
        return [self._rows(k) for k in range(self.num_servers)]

    @property
    def lost_env_ids(self) -> list[int]:
        """Global ids of the envs whose server is lost and not yet reconnected."""
        return [i for k in sorted(self._lost) for i in self.servers.env_ids(k)]

    def spaces(self) -> Spaces:
        return self._live_client().spaces()

    def health(self) -> bool:
        """True when no server is lost and every one answers HEALTH as initialised."""
        clients = [client for client in self._clients if client is not None]
        return not self._lost and all(client.health() for client in clients)

    # -- requests ------------------------------------------------------------------------------

    def reset(self, seed: Seed = None, *, copy: bool = False) -> StepView:
        """Reconnect lost servers, then reset every env (global env i gets ``seed + i``, or
        ``seed[i]`` from a list of one int or None per global env; another length is a
        ``ValueError`` before anything is sent)."""
        seed = self._seeds(seed)
        self._begin()
        if self._lost:
            self._restore(sorted(self._lost), reset=False)
        if self.autoreset_mode != "same_step":
            fast = self._fast_client()
            try:
                view = fast.reset(seed)
                return view.copy() if copy else view
            except BatchError as err:
                failures = self._from_batch_error(err)
        else:
            _, failures = self._run(
                list(range(self.num_servers)), lambda k: self._reset_part(k, seed)
            )
        lost_now = self._split_losses(failures)
        if lost_now:
            error = self._lost_error(lost_now, failures)
            self._report(error)
            self._restore(lost_now, seed=seed)  # this reset is their next reset
        self._raise_others(failures, lost_now)
        return self._batch.copy() if copy else self._batch

    def step(self, actions: Sequence[Any] | np.ndarray, *, copy: bool = False) -> StepView:
        """Step every env: one action per global env, shape ``(num_envs, *action shape)`` (a list
        of ``num_envs`` ints for Discrete); see the module docstring for losses. Anything else
        is ``ActionError`` before anything is sent (the client's rule, ``ActionShapes``)."""
        batch = np.asarray(self._shapes.count(actions)[0])
        self._begin()
        restoring = sorted(self._pending)
        if not self._lost and self.autoreset_mode != "same_step":
            fast = self._fast_client()
            try:
                view = fast.step(batch)
                return view.copy() if copy else view
            except BatchError as err:
                failures = self._from_batch_error(err)
        else:
            live = [k for k in range(self.num_servers) if k not in self._lost]
            finals, failures = self._run(live, lambda k: self._step_part(k, batch))
            self.finals = sorted(
                (item for part in finals.values() for item in part), key=lambda item: item[0]
            )
        lost_now = self._split_losses(failures)
        if restoring:
            self._restore(restoring)  # next_step: the step after their truncation resets them
        if lost_now:
            error = self._lost_error(lost_now, failures)
            if self.policy.on_step == "raise":
                raise error
            self._report(error)
            for k in lost_now:
                self.truncated_by_loss[self._rows(k)] = True
            if self.autoreset_mode == "same_step":
                self.finals = sorted(
                    [*self.finals, *self._last_rows(lost_now)], key=lambda item: item[0]
                )
                self._restore(lost_now)
            elif self.autoreset_mode == "next_step":
                self._pending.update(lost_now)
        elif self._lost and self.policy.on_step == "raise":
            lost = sorted(self._lost)
            raise self._lost_error(lost, {}, reason="lost earlier, reconnected at the next reset")
        self._raise_others(failures, lost_now)
        return self._batch.copy() if copy else self._batch

    def reset_lost(self, seed: Seed = None) -> StepView:
        """Reconnect every lost server now and reset only its envs (seeded as ``reset`` seeds
        them: global env i gets ``seed + i`` or ``seed[i]``); other rows are unchanged."""
        seed = self._seeds(seed)
        self._begin()
        if self._lost:
            self._restore(sorted(self._lost), seed=seed)
        return self._batch

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for client in self._clients:
            if client is not None:
                client.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------------

    def _rows(self, k: int) -> slice:
        ids = self.servers.env_ids(k)
        return slice(ids.start, ids.stop)

    def _begin(self) -> None:
        if self._closed:
            raise TransportError("the client is closed")
        self.finals = []
        self.truncated_by_loss[:] = False
        self.restored[:] = False

    def _live_client(self) -> Client:
        for client in self._clients:
            if client is not None:
                return client
        raise TransportError("every env server is lost: call reset() to reconnect")

    def _fast_client(self) -> MultiClient:
        if self._fast is None:
            clients = [client for client in self._clients if client is not None]
            assert len(clients) == self.num_servers
            self._fast = MultiClient(clients, timeout=self.timeout)
        return self._fast

    def _client(self, k: int) -> Client:
        client = self._clients[k]
        if client is None:
            raise TransportError(f"env server {k} is lost")
        return client

    def _action_space(self) -> str:
        """The action space as an ``ActionError`` names it (a live server says Discrete's n)."""
        for client in self._clients:
            if client is not None:
                return client._action_space()
        return describe_action_space(self.schema, None)

    def _step_part(self, k: int, batch: np.ndarray) -> list[tuple[int, StepView]]:
        client = self._client(k)
        rows = self._rows(k)
        view = client.step(batch[rows])  # (envs of server k, *action shape), one env included
        self._batch.record[rows] = np.asarray(view.record).reshape(rows.stop - rows.start)
        return [(rows.start + index, final) for index, final in client.finals]

    def _seeds(self, seed: Seed) -> _Seeds:
        """``seed`` checked as one client's (``protocol.reset_seed``: an int, or one int or None
        per global env) before anything is sent to any server."""
        return reset_seed(seed, self.num_envs)

    def _seed_of(self, k: int, seed: _Seeds) -> _Seeds:
        """Server k's part of a global ``seed``: ``seed + first env`` or its slice of a list."""
        ids = self.servers.env_ids(k)
        if isinstance(seed, list):
            return seed[ids.start : ids.stop]
        return None if seed is None else seed + ids.start

    def _reset_part(self, k: int, seed: _Seeds) -> None:
        rows = self._rows(k)
        view = self._client(k).reset(self._seed_of(k, seed))
        self._batch.record[rows] = view.record

    def _run(
        self,
        servers: Sequence[int],
        call: Callable[[int], _T],
        abandon: Callable[[_T], None] | None = None,
    ) -> tuple[dict[int, _T], dict[int, TransportError]]:
        """``call(k)`` for every server (in parallel); results and transport errors by server.

        Anything else (Ctrl-C's ``KeyboardInterrupt`` while waiting, a call's non-transport
        error) is raised only once every call already started has finished: a call left
        running would hold its server's client (the next call on it refused as "another
        thread is in a call") and step its envs behind the trainer's back. ``abandon`` gets the
        results that call will not return (e.g. to close a reconnected client)."""
        results: dict[int, _T] = {}
        failures: dict[int, TransportError] = {}
        if self._pool is None or len(servers) <= 1:
            for k in servers:
                try:
                    results[k] = call(k)
                except TransportError as exc:
                    failures[k] = exc
                except BaseException:
                    _abandon(results.values(), abandon)
                    raise
            return results, failures
        futures: dict[int, Future[_T]] = {}
        try:
            for k in servers:  # one by one: an interrupted loop still knows what it started
                futures[k] = self._pool.submit(call, k)
            for k, future in futures.items():
                error = future.exception()
                if error is None:
                    results[k] = future.result()
                elif isinstance(error, TransportError):
                    failures[k] = error
                else:
                    raise error
        except BaseException:
            self._settle(futures, abandon)
            raise
        return results, failures

    @staticmethod
    def _settle(futures: dict[int, Future[_T]], abandon: Callable[[_T], None] | None) -> None:
        """Wait for every started call (a second Ctrl-C stops waiting); hand the results that
        will not be returned to ``abandon``."""
        concurrent.futures.wait(futures.values())
        done = [f.result() for f in futures.values() if f.exception() is None]
        _abandon(done, abandon)

    def _from_batch_error(self, err: BatchError) -> dict[int, TransportError]:
        """The fast path failed: keep its rows (live rows stepped) and map failures to servers."""
        if err.results is not None:
            self._batch.record[...] = err.results.record
        failures: dict[int, TransportError] = {}
        for failure in err.failures:
            error = failure.error
            k = failure.env_ids.start // self._per_server
            failures[k] = error if isinstance(error, TransportError) else TransportError(error)
        return failures

    def _split_losses(self, failures: dict[int, TransportError]) -> list[int]:
        """Drop the clients of servers that are gone; return their indices."""
        lost_now = sorted(k for k, error in failures.items() if isinstance(error, LOSS_ERRORS))
        for k in lost_now:
            client = self._clients[k]
            if client is not None:
                client.close()
            self._clients[k] = None
            self._lost.add(k)
            self._fast = None
        return lost_now

    def _lost_error(
        self, lost: Sequence[int], failures: dict[int, TransportError], reason: str = ""
    ) -> EnvsLostError:
        """The typed error for ``lost`` servers; other failed servers are listed too."""
        entries = []
        for k in sorted({*lost, *failures}):
            ids = self.servers.env_ids(k)
            if k in lost:
                error: BaseException = failures.get(k) or PeerGoneError(f"env server {k} is lost")
                entries.append(ServerFailure(self._url_of(k), ids, error))
            else:  # a refused request (e.g. an env error) in the same call
                entries.append(ServerFailure.of(self._url_of(k), ids, failures[k]))
        lost_ids = [i for k in lost for i in self.servers.env_ids(k)]
        return EnvsLostError(entries, self._batch.copy(), lost, lost_ids, reason)

    def _url_of(self, k: int) -> str:
        endpoint = self.servers.last_endpoint(k)
        return endpoint.url if endpoint is not None else f"env server {k}"

    def _report(self, error: EnvsLostError) -> None:
        self.last_lost = error
        log.warning("%s", error)
        if self.policy.on_lost is not None:
            self.policy.on_lost(error)

    def _raise_others(self, failures: dict[int, TransportError], lost_now: list[int]) -> None:
        others = {k: error for k, error in failures.items() if k not in lost_now}
        if others:
            raise BatchError(
                [
                    ServerFailure.of(self._url_of(k), self.servers.env_ids(k), error)
                    for k, error in sorted(others.items())
                ],
                self._batch.copy(),
            )

    def _last_rows(self, servers: Sequence[int]) -> list[tuple[int, StepView]]:
        """Owned copies of the lost envs' last rows: their episodes' final results."""
        record = self._batch.record
        return [
            (i, StepView(record[i : i + 1].copy().reshape(())))
            for k in servers
            for i in self.servers.env_ids(k)
        ]

    def _restore(self, servers: Sequence[int], *, reset: bool = True, seed: _Seeds = None) -> None:
        """Reconnect to the (restarted) actors of ``servers``; reset their envs unless told not."""
        timeout = self.policy.reconnect_timeout
        started = time.monotonic()
        try:
            endpoints = dict(
                zip(servers, self.servers.refresh(servers, timeout=timeout), strict=True)
            )
        except RayLaunchError as exc:
            failures: dict[int, TransportError] = {k: exc for k in servers}
            raise self._lost_error(
                servers, failures, reason=f"not back within {timeout:g} s"
            ) from exc

        def reconnect(k: int) -> Client:
            client = self.servers.open_client(
                k, autoreset=self.autoreset_mode, timeout=self.timeout, endpoint=endpoints[k]
            )
            if reset:
                rows = self._rows(k)
                try:
                    view = client.reset(self._seed_of(k, seed))
                except BaseException:
                    client.close()
                    raise
                self._batch.record[rows] = view.record
            return client

        clients, failures = self._run(servers, reconnect, abandon=_close_client)
        for k, client in clients.items():
            self._clients[k] = client
            self._lost.discard(k)
            self._pending.discard(k)
            if reset:
                self.restored[self._rows(k)] = True
        if failures:
            raise self._lost_error(sorted(failures), failures, reason="reconnecting failed")
        log.info("reconnected env servers %s in %.2f s", list(servers), time.monotonic() - started)


def _abandon(results: Any, abandon: Callable[[Any], None] | None) -> None:
    if abandon is not None:
        for result in results:
            abandon(result)


def _close_client(client: Client) -> None:
    client.close()
