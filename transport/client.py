"""The client API: ``transport.connect(url) -> Client`` over any registered backend.

A backend provides a ``Channel``: it sends one request and returns the response body as a view
into a receive buffer that it reuses. The client turns those bytes into NumPy views once per
buffer (``StepView``), so a steady-state ``step`` allocates nothing: the arrays it returns are
views that stay valid until the next call on the same client. ``copy=True`` returns owned arrays.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from transport.actions import ActionShapes, describe_action_space
from transport.async_batch import AsyncCalls, Received
from transport.backends.base import Channel
from transport.codec import Schema
from transport.errors import (
    ActionError,
    ConnectError,
    FingerprintMismatchError,
    PeerGoneError,
    ProtocolError,
    RegionInUseError,
    RegionMismatchError,
    RemoteError,
    ReplyTooLargeError,
    TransportError,
    TransportTimeoutError,
    VersionMismatchError,
)
from transport.protocol import (
    AUTORESET_MASK,
    MESSAGE_IDS,
    SCHEMA_IR_KEY,
    SCHEMA_NAME_KEY,
    AutoReset,
    ErrorCode,
    MessageIds,
    body_codec,
    check_hello,
    decode_error,
    decode_hello,
    encode_goodbye,
    encode_hello_request,
    mismatch_text,
    reset_seed,
    schema_from_ir_text,
)
from transport.runtime.env import Spaces
from transport.step_view import StepView

DEFAULT_TIMEOUT = 10.0

MAX_TIMEOUT = (2**31 - 1) / 1000
"""The longest finite client timeout, in seconds (2**31 - 1 ms, about 24.8 days: Node's timer
limit); a longer one, or ``math.inf``, means no deadline, as None does. Node: the same rule."""


def check_timeout(timeout: Any, where: str = "connect") -> float | None:
    """A client ``timeout`` checked (``where(timeout=...)`` names it in errors) and normalised:
    None, ``math.inf`` or a finite value above ``MAX_TIMEOUT`` -> None (no deadline); a real
    number > 0 (not a bool) -> that many seconds. 0, a negative value or NaN is a
    ``ValueError`` (every request would time out at once), anything else a ``TypeError``."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(
            f"{where}(timeout={timeout!r}): timeout is seconds, a number > 0, or None (no "
            f"deadline); not a {type(timeout).__name__}"
        )
    seconds = float(timeout)
    if not seconds > 0:  # NaN too
        raise ValueError(
            f"{where}(timeout={timeout!r}): timeout must be > 0 seconds (None or math.inf: no "
            "deadline)"
        )
    return None if seconds > MAX_TIMEOUT else seconds


def check_url(url: Any, where: str = "connect") -> str:
    """``url`` if it is a str, else a ``TypeError`` naming the argument and an example URL."""
    if not isinstance(url, str):
        raise TypeError(
            f"{where}(url={url!r}): url must be a str, such as 'unix:///tmp/env.sock' or "
            f"'http://127.0.0.1:8000'; not a {type(url).__name__}"
        )
    return url


HINTS: tuple[tuple[type[TransportError], str], ...] = (
    (
        RegionInUseError,
        "close that client first (or end its process), or serve another shm:// name for a "
        "second client",
    ),
    (
        ConnectError,
        "is a server serving this URL? start one with `transport-serve URL` or "
        "transport.serve(env, URL), or check the URL",
    ),
    (
        PeerGoneError,
        "the server closed the connection or died: see the server's log, then connect again",
    ),
    (
        TransportTimeoutError,
        "the connection is kept and the late reply is dropped when it comes: retry, or connect "
        "with a larger timeout= if the server's envs are slow",
    ),
    (
        ReplyTooLargeError,
        "the reply was dropped: connect with a max_body at least that large, "
        "transport.connect(url, max_body=...) or RemoteVectorEnv(url, max_body=...); render "
        "frames of many envs can pass the default 64 MiB",
    ),
    (
        ProtocolError,
        "client and server disagree: check that both use the same transport version and "
        "schema, then connect again",
    ),
)
"""What to do about each client-side transport error, said after its message."""

RECV_LATE_HINT = (
    "over this backend the envs a timed-out recv was waiting for are taken off the server when "
    "they finish, and their late results are dropped: they stepped, but their results are lost, "
    "so another recv will not return them; async_reset (or reset) to go on from a known state"
)
"""Said after a RECV's timeout over the socket backends (shm keeps results for the next recv)."""


def hint_for(exc: TransportError) -> str | None:
    """What to do about ``exc`` (``HINTS``); a num_envs that differs from the server's gets its
    own: the numbers and the two ways out, not "same version and schema" (not the cause)."""
    if isinstance(exc, RegionMismatchError) and exc.field == "num_envs":
        return (
            f"the client asked for {exc.expected} envs (?num_envs={exc.expected} in its URL) and "
            f"the server serves {exc.found}: connect without ?num_envs= to take the server's "
            f"count, or start the server with num_envs={exc.expected}"
        )
    if getattr(exc, "local_config", False):
        return None  # this process's own setup (a CURVE key file): no server to start or blame
    for kind, hint in HINTS:
        if isinstance(exc, kind):
            return hint
    return None


def session_error(body: Any) -> TransportError:
    """The server's ERROR answering a request of an open session. HELLO_REQUIRED there means
    the server no longer knows the session (a new server on the same URL, or an idle zmq
    session it dropped): ``PeerGoneError``, as a closed connection is, not a request to send a
    HELLO the caller never sends. Node: ``sessionError``."""
    error = decode_error(body)
    if isinstance(error, RemoteError) and error.code == ErrorCode.HELLO_REQUIRED:
        return PeerGoneError(
            "the server no longer knows this client's session (a server restarted on this URL, "
            f"or one that dropped the session): {error}"
        )
    return error


def explain(exc: TransportError, url: str) -> TransportError:
    """``exc`` with the URL before its message and what to do after it (once; the same object,
    its type and attributes unchanged): every transport error a client raises names both."""
    text = str(exc)
    hint = hint_for(exc)
    if hint is not None and hint not in text:
        # a channel's text may name the URL without its query (shm://name, not ?num_envs=4)
        named = text if url.split("?", 1)[0] in text else f"{url}: {text}"
        exc.args = (f"{named} ({hint})",)
    return exc


def seeds_body(schema: Schema, seeds: Sequence[int | None], num_envs: int) -> bytearray:
    """A RESET_SEEDS_REQ body: one (seed, has_seed) entry per env; None resets unseeded."""
    seeds = list(seeds)
    if len(seeds) != num_envs:
        raise ValueError(f"expected {num_envs} seeds (one per env, or None), got {len(seeds)}")
    for seed in seeds:
        if seed is not None and (isinstance(seed, bool) or not 0 <= int(seed) < 1 << 64):
            raise ValueError(f"a seed must be an integer in 0..2**64-1 or None, not {seed!r}")
    codec = body_codec(schema, "RESET_SEEDS_REQ")
    body = bytearray(codec.size * num_envs)
    entries = codec.view(body, 0, count=num_envs)
    entries["seed"] = [0 if s is None else int(s) for s in seeds]
    entries["has_seed"] = [s is not None for s in seeds]
    return body


_CLIENTS: weakref.WeakSet[Client] = weakref.WeakSet()
"""The clients of this process (``_refuse_after_fork``)."""


def _refuse_after_fork() -> None:
    """In a child made by ``os.fork``: the parent's clients are closed here without a word to
    their servers. A connection, an shm lease and a ZeroMQ socket serve one process: a child
    that stepped one wrote into the parent's session (over shm the parent's next step returned
    the child's results; over zmq the child hung)."""
    parent = os.getppid()
    for client in list(_CLIENTS):
        if not client._closed:
            client._closed = True
            client._closed_why = (
                f"this client was connected in process {parent}, and this process was forked "
                "from it: connect a client of its own here (a connection, an shm lease and a "
                "ZeroMQ socket serve one process)"
            )


os.register_at_fork(after_in_child=_refuse_after_fork)


class Client:
    """A connection to an env server. Use as a context manager, or call ``close()``."""

    def __init__(self, channel: Channel, schema: Schema, url: str) -> None:
        self.channel = channel
        self.schema = schema
        self.url = url
        self.ids = MessageIds.from_schema(schema.ir)
        self.num_envs = int(channel.info.get("num_envs", 1))
        self.server_info = dict(channel.info)
        self.masked_actions = str(
            channel.info.get("masked_actions", "reject")
        )  # the server's policy
        self.autoreset = AutoReset[str(channel.info.get("autoreset", "disabled")).upper()]
        self._same_step = self.autoreset == AutoReset.SAME_STEP  # step responses carry finals
        self.finals: list[tuple[int, StepView]] = []
        """SAME_STEP auto-reset: (env index, owned final result) of each episode that ended in
        the last step; the step's own result holds the reset observation for those envs."""
        self._result = body_codec(schema, "STEP_RESP")
        step_request = body_codec(schema, "STEP_REQ")
        action = step_request.ir.role("action")
        if action is None:
            raise ProtocolError("the STEP_REQ body struct has no field with role 'action'")
        self._step_request = step_request
        # the request records live where the channel wants them (shm: in the slots): no copy
        records, self._request = channel.request_area(step_request, self.num_envs)
        self._actions = records[action.name]
        self._space_text: str | None = None  # the action space as errors name it (asked once)
        self._shapes = ActionShapes(schema, self.num_envs, self._action_space)
        self._seed_codec = body_codec(schema, "RESET_SEED_REQ")
        self._seed_body = bytearray(self._seed_codec.size)
        multi = body_codec(schema, "STEP_MULTI_REQ")
        self._multi_request = bytearray(multi.size)
        self._multi_actions = multi.view(self._multi_request)[multi.ir.fields[0].name]
        self._views: dict[int | None, tuple[np.ndarray, StepView]] = {}
        ids = self.ids
        self._step_one = (ids.STEP_REQ, ids.STEP_RESP, None)
        # a batch of one goes to a 1-env server as a STEP_REQ (every backend answers it alike)
        # and comes back with an env axis of 1: the call's shape, not the backend, decides
        self._step_batch = (
            (ids.STEP_REQ, ids.STEP_RESP, 1)
            if self.num_envs == 1
            else (ids.STEP_BATCH_REQ, ids.STEP_BATCH_RESP, self.num_envs)
        )
        self._no_finals: list[tuple[int, StepView]] = []
        self._final_views: dict[int, tuple[np.ndarray, StepView]] = {}
        self._closed = False
        self._closed_why = "the client is closed"
        _CLIENTS.add(self)
        self._late = False  # a request timed out: its late reply is still due (``_settle``)
        # one request at a time: taken (never waited for) by each call that writes the request
        # area or exchanges, so a second thread is told at once instead of interleaving frames
        self._in_use = threading.Lock()

    # -- requests ------------------------------------------------------------------------------

    def reset(
        self, seed: int | Sequence[int | None] | None = None, *, copy: bool = False
    ) -> StepView:
        """Reset every env (env i gets ``seed + i``, or ``seed[i]`` from a list of one seed or
        None per env: RESET_SEEDS); fields have a leading env axis if N > 1."""
        seed = reset_seed(seed, self.num_envs)
        with self._call():
            if seed is None:
                body = self._exchange(self.ids.RESET_REQ, b"", self.ids.RESET_RESP)
            elif isinstance(seed, list):
                body = self._exchange(
                    self.ids.RESET_SEEDS_REQ,
                    seeds_body(self.schema, seed, self.num_envs),
                    self.ids.RESET_RESP,
                )
            else:
                self._seed_codec.encode_into(
                    self._seed_body, 0, {self._seed_codec.ir.fields[0].name: seed}
                )
                body = self._exchange(self.ids.RESET_SEED_REQ, self._seed_body, self.ids.RESET_RESP)
            self.finals = self._no_finals
            return self._results(body, None if self.num_envs == 1 else self.num_envs, False, copy)

    def step(self, actions: Any, *, copy: bool = False) -> StepView:
        """Step with one env's action (1-env server: fields without an env axis) or one action
        per env, shape (N, *action shape) (fields with a leading env axis of N, N = 1 too).
        Anything else is ``ActionError`` before any bytes move (``ActionShapes``)."""
        # The hot path: every line here costs each step (measured: benchmarks/RESULTS.md).
        values, count = self._shapes.count(actions)
        if not self._in_use.acquire(False):
            raise self._in_use_error()
        try:
            if self._closed:  # before the actions go to its request area (shm: the slots)
                raise TransportError(f"{self.url}: {self._closed_why}")
            if self._late:
                self._settle()  # before the actions go where the late request may still be read
            if count is None:
                self._actions[0] = values
                msg_type, expect, count = self._step_one
            else:
                self._actions[:] = values
                msg_type, expect, count = self._step_batch
            try:
                resp_type, body = self.channel.request(msg_type, self._request)
            except TransportError as exc:
                self._failed(exc)
                raise
            except KeyboardInterrupt:
                self._late = True  # as after a timeout: the request may still be read
                raise
            if resp_type != expect:
                self._unexpected(resp_type, body, expect)
            if self._same_step or copy:
                return self._results(body, count, self._same_step, copy)
            try:
                records = self.channel.result_records(body, self._result, count, False)
            except TransportError as exc:
                self._failed(exc)
                raise
            cached = self._views.get(count)
            if cached is None or cached[0] is not records:
                cached = self._views[count] = (records, StepView(records))
            return cached[1]
        finally:
            self._in_use.release()

    def step_multi(self, actions: Sequence[int] | np.ndarray, *, copy: bool = False) -> StepView:
        """STEP_MULTI (seed 000): 8 actions, 8 results (a leading axis of 8). The server is an
        8-env server (one action per env) or a 1-env server whose env has ``step_batch`` (one
        action per seat of one game)."""
        seats = len(self._multi_actions)
        if len(actions) != seats:
            raise ActionError(
                f"{self.url}: step_multi() takes one action per seat: {seats} (the seats of "
                f"schema {self.schema.name}'s STEP_MULTI_REQ, whatever num_envs the server has), "
                f"got {len(actions)}"
            )
        with self._call():
            self._multi_actions[:] = actions
            body = self._exchange(
                self.ids.STEP_MULTI_REQ, self._multi_request, self.ids.STEP_MULTI_RESP
            )
            return self._results(body, seats, self._same_step, copy)

    def observe(self, *, copy: bool = False) -> tuple[StepView, list[dict[str, Any]]]:
        """OBSERVE: every env's current result (no step, no auto-reset) and its ``info()`` map.

        The result is a view like ``step``'s (valid until the next call unless ``copy``)."""
        request = self.schema.ir.messages.get("OBSERVE_REQ")
        response = self.schema.ir.messages.get("OBSERVE_RESP")
        if request is None or response is None:
            raise ProtocolError(f"schema {self.schema.name} declares no OBSERVE_REQ/OBSERVE_RESP")
        with self._call():
            body = self._exchange(request.id, b"", response.id)
            results_len = self._result.size * self.num_envs
            if body.nbytes < results_len:
                raise ProtocolError(f"OBSERVE_RESP of {body.nbytes} bytes; expected {results_len}+")
            try:
                tail = bytes(body[results_len:])
                infos = msgpack.unpackb(tail) if body.nbytes > results_len else []
            except (ValueError, msgpack.UnpackException) as exc:
                raise ProtocolError(f"OBSERVE_RESP tail is not msgpack: {exc}") from exc
            if not isinstance(infos, list) or len(infos) != self.num_envs:
                raise ProtocolError(f"OBSERVE_RESP tail is not a list of {self.num_envs} info maps")
            count = None if self.num_envs == 1 else self.num_envs
            view = self._results(body[:results_len], count, False, copy)
        return view, [dict(info) if isinstance(info, dict) else {} for info in infos]

    # -- asynchronous batches (transport/async_batch.py) ----------------------------------------

    def send(
        self, actions: Sequence[Any] | np.ndarray, env_ids: Sequence[int] | np.ndarray
    ) -> None:
        """Start stepping envs ``env_ids`` (action ``actions[k]`` for env ``env_ids[k]``);
        ``recv`` returns their results as they finish. An env already in flight is refused.
        ``actions``: one action per env id, shape (K, *action shape), by step's rule with K in
        place of N (``ActionShapes.rows``): anything else is ``ActionError`` before any bytes
        move."""
        calls = self._async_calls()
        body = calls.send_body(actions, env_ids)  # checked before the call (as step's actions)
        with self._call():
            calls.send(body)

    def recv(self, batch_size: int | None = None, *, copy: bool = False) -> Received:
        """The first ``batch_size`` (default ``self.batch_size``: N) in-flight envs to finish,
        or all in flight if fewer: results, env ids and SAME_STEP finals (``Received``)."""
        size = self.batch_size if batch_size is None else batch_size
        whole = isinstance(size, int | np.integer) and not isinstance(size, bool)
        if not whole or not 0 < size < 1 << 32:
            raise ValueError(
                f"recv(batch_size={batch_size!r}): a batch size is an integer >= 1 (None: "
                f"client.batch_size, {self.batch_size})"
            )
        with self._call():
            try:
                return self._async_calls().recv(int(size), copy)
            except TransportTimeoutError as exc:
                # a socket backend drops the late RECV_RESP (shm, which settles, keeps it)
                if getattr(self.channel, "settle", None) is None:
                    text, retry = str(exc), hint_for(exc) or ""
                    late = text.replace(retry, RECV_LATE_HINT) if retry in text else ""
                    exc.args = (late or f"{text} ({RECV_LATE_HINT})",)
                raise

    def async_reset(self, seed: int | None = None) -> None:
        """Reset every env (env i: ``seed + i``) for ``recv`` to return (nothing in flight)."""
        checked = reset_seed(seed, self.num_envs, "async_reset", per_env=False)
        with self._call():
            self._async_calls().reset(checked if isinstance(checked, int) else None)

    def _async_calls(self) -> AsyncCalls:
        calls = self.__dict__.get("_async")
        if calls is None:
            calls = self.__dict__["_async"] = AsyncCalls(
                self.schema, self.num_envs, self._exchange, self._shapes
            )
        return calls

    @property
    def action_dtype(self) -> np.dtype[Any]:
        """The action field's element dtype: actions of it are taken without a range check."""
        return self._shapes.dtype

    @property
    def batch_size(self) -> int:
        """``recv``'s default batch size (EnvPool's ``batch_size``): N unless set."""
        return int(self.__dict__.get("_batch_size", self.num_envs))

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        if not 1 <= value <= self.num_envs:
            raise ValueError(f"batch_size must be in 1..{self.num_envs}, got {value}")
        self.__dict__["_batch_size"] = value

    def _action_space(self) -> str:
        """The action space as an ``ActionError`` names it; a Discrete space's size is asked
        of the server once (``spaces()``), when an error first needs it."""
        if self._space_text is None:
            act_n: int | None = None
            if self._shapes.one == () and not self._closed:
                try:
                    act_n = self.spaces().act_n
                except TransportError:
                    pass  # named without its size: "Discrete(?)"
            text = describe_action_space(self.schema, act_n)
            if act_n is None and self._shapes.one == ():
                return text
            self._space_text = text
        return self._space_text

    def spaces(self) -> Spaces:
        codec = body_codec(self.schema, "SPACES_RESP")
        with self._call():
            values = codec.decode(self._exchange(self.ids.SPACES_REQ, b"", self.ids.SPACES_RESP))
        first, second = (f.name for f in codec.ir.fields[:2])
        return Spaces(int(values[first]), int(values[second]))

    def health(self) -> bool:
        with self._call():
            body = self._exchange(self.ids.HEALTH_REQ, b"", self.ids.HEALTH_RESP)
            return body.nbytes >= 1 and body[0] == 1

    def close(self) -> None:
        """Close the connection (again: nothing). Refused at once (``TransportError``) while
        another thread is in a call on this client, which goes on: a socket or shm lease closed
        under a blocked call aborts libzmq and hangs shm (docs/decisions.md)."""
        if self._closed:
            return
        if not self._in_use.acquire(False):
            raise TransportError(
                f"{self.url}: close() while another thread is in a call on this client: it is "
                "not closed, and that call goes on; close it after the call returns (join that "
                "thread first), or give each thread its own client"
            )
        try:
            if self._closed:
                return
            self._closed = True
            goodbye = getattr(self.channel, "say_goodbye", None)
            if goodbye is not None:  # zmq: the server is not told when a client goes
                goodbye(self.ids.HELLO_REQ, encode_goodbye())
            self.channel.close()
        finally:
            self._in_use.release()

    def __reduce__(self) -> Any:
        raise TypeError(
            f"a transport Client ({self.url}) cannot be sent to another process: its connection, "
            "shm lease or ZeroMQ socket belong to this one; pass the URL and call "
            "transport.connect(url) there"
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            self.close()
        except TransportError:
            if exc_type is None:
                raise
            # an exception is already on its way out (a Ctrl-C while another thread is in a
            # call, whose close is refused): it goes on, not replaced by the refusal

    # -- internals -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _call(self) -> Iterator[None]:
        """This client for one call: refused at once while another thread is in one (the
        request area and the receive buffer are this client's; ``step`` does the same inline)."""
        if not self._in_use.acquire(False):
            raise self._in_use_error()
        try:
            yield
        finally:
            self._in_use.release()

    def _in_use_error(self) -> TransportError:
        return TransportError(
            f"{self.url}: another thread is in a call on this client: a client makes one "
            "request at a time; use one client per thread, or a lock around its calls"
        )

    def _exchange(self, msg_type: int, body: Any, expect: int) -> memoryview:
        """One request and its response (the caller holds ``_call``)."""
        if self._closed:
            raise TransportError(f"{self.url}: {self._closed_why}")
        if self._late:
            self._settle()
        try:
            resp_type, resp = self.channel.request(msg_type, body)
        except TransportError as exc:
            self._failed(exc)
            raise
        except KeyboardInterrupt:
            self._late = True  # as after a timeout: the request may still be read
            raise
        if resp_type != expect:
            self._unexpected(resp_type, resp, expect)
        return resp

    def _failed(self, exc: TransportError) -> None:
        """A channel's error, explained (``explain``); after a timeout a late reply is due."""
        if isinstance(exc, TransportTimeoutError):
            self._late = True
        explain(exc, self.url)

    def _settle(self) -> None:
        """After a timeout or Ctrl-C: a channel whose requests live where the server reads them
        (shm slots) waits for the late reply before the next request is written (``settle``);
        the others drop late replies by msg_id or by order on their own."""
        settle = getattr(self.channel, "settle", None)
        if settle is not None:
            try:
                settle()
            except TransportError as exc:
                explain(exc, self.url)
                raise
        self._late = False

    def _unexpected(self, resp_type: int, resp: memoryview, expect: int) -> None:
        """A response other than the one asked for: the server's ERROR as its typed error."""
        if resp_type == self.ids.ERROR:
            raise explain(session_error(resp), self.url)
        raise explain(
            ProtocolError(f"expected msg_type 0x{expect:02X}, got 0x{resp_type:02X}"), self.url
        )

    def _results(self, body: memoryview, count: int | None, finals: bool, copy: bool) -> StepView:
        """The response's results as a StepView (cached while the channel's records stay)."""
        try:
            records = self.channel.result_records(body, self._result, count, finals)
        except TransportError as exc:
            self._failed(exc)
            raise
        cached = self._views.get(count)
        if cached is None or cached[0] is not records:
            cached = self._views[count] = (records, StepView(records))
        if finals:
            ended = self.channel.final_records()
            self.finals = (
                [(i, self._final_view(i, r)) for i, r in ended] if ended else self._no_finals
            )
        return cached[1].copy() if copy else cached[1]

    def _final_view(self, index: int, record: np.ndarray) -> StepView:
        cached = self._final_views.get(index)
        if cached is None or cached[0] is not record:
            cached = self._final_views[index] = (record, StepView(record))
        return cached[1]


def handshake(
    channel: Channel,
    schema: Schema | None,
    autoreset: AutoReset = AutoReset.DISABLED,
    *,
    url: str = "",
) -> tuple[Schema, dict[str, Any]]:
    """HELLO_REQ / HELLO_RESP on a new channel; returns the session's schema and the server's
    info map. ``schema`` None discovers it: the server answers with its compiled IR, which must
    hash to the fingerprint it announced. A mismatch names both schemas and the server's URL."""
    where = f"the server at {url or getattr(channel, 'url', '') or '?'}"
    ids = MESSAGE_IDS if schema is None else MessageIds.from_schema(schema.ir)
    resp_type, body = channel.request(ids.HELLO_REQ, encode_hello_request(schema, int(autoreset)))
    if resp_type == ids.ERROR:
        error = decode_error(body)
        if isinstance(error, FingerprintMismatchError):
            raise FingerprintMismatchError(
                f"{where} refused the session: {_named(error)}",
                local=schema.fingerprint if schema is not None else 0,
            )
        raise error
    if resp_type != ids.HELLO_RESP:
        raise ProtocolError(f"expected HELLO_RESP, got msg_type 0x{resp_type:02X}")
    hello = decode_hello(body)
    server_name = hello.info.get(SCHEMA_NAME_KEY)
    if schema is None:
        check_hello(hello, hello.fingerprint, peer="server")  # the version
        schema = schema_from_ir_text(hello.info.get(SCHEMA_IR_KEY), hello.fingerprint, peer=where)
    elif hello.fingerprint != schema.fingerprint:
        raise FingerprintMismatchError(
            f"{where}: "
            + mismatch_text(
                server_name if isinstance(server_name, str) else "",
                hello.fingerprint,
                schema.name,
                schema.fingerprint,
            ),
            local=schema.fingerprint,
            remote=hello.fingerprint,
        )
    else:
        check_hello(hello, schema.fingerprint, peer="server")
    if hello.flags & AUTORESET_MASK != autoreset:
        raise ProtocolError(
            f"server answered auto-reset mode {hello.flags & AUTORESET_MASK}, asked {autoreset}"
        )
    # the schema's keys are the handshake's own (client.schema holds the schema)
    info = {k: v for k, v in hello.info.items() if k not in (SCHEMA_IR_KEY, SCHEMA_NAME_KEY)}
    return schema, {**info, "autoreset": autoreset.name.lower()}


def not_a_server(exc: BaseException) -> BaseException:
    """A peer that closes the connection or answers what breaks the protocol during the HELLO
    is no transport server on this backend (a zmq socket file on unix://, a web server on
    http://): a ``ConnectError`` saying so, ``exc`` chained. A refusal the peer explains (an
    ERROR, a version, schema or region mismatch) or a reply over ``max_body`` is left as it
    is. Node: ``notAServer``, the same words."""
    if not isinstance(exc, PeerGoneError | ProtocolError) or isinstance(
        exc,
        FingerprintMismatchError | VersionMismatchError | RegionMismatchError | ReplyTooLargeError,
    ):
        return exc
    error = ConnectError(
        f"{exc}, during the HELLO handshake (not a transport server on this backend?)"
    )
    error.__cause__ = exc
    return error


def _named(error: FingerprintMismatchError) -> str:
    """The server's mismatch text without the generic prefix ``error_from_code`` adds."""
    text = str(error)
    prefix = "server refused the session: "
    return text[len(prefix) :] if text.startswith(prefix) else text


def default_schema() -> Schema:
    """The pac_env schema the reference servers speak."""
    from transport.generated import pac_env

    return pac_env.SCHEMA


def resolve_schema(schema: Schema | str | Path | None) -> Schema:
    if schema is None:
        return default_schema()
    if isinstance(schema, Schema):
        return schema
    from transport.schema import load_schema

    return Schema(load_schema(os.fspath(schema)))
