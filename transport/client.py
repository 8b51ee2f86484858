"""The client API: ``transport.connect(url) -> Client`` over any registered backend.

A backend provides a ``Channel``: it sends one request and returns the response body as a view
into a receive buffer that it reuses. The client turns those bytes into NumPy views once per
buffer (``StepView``), so a steady-state ``step`` allocates nothing: the arrays it returns are
views that stay valid until the next call on the same client. ``copy=True`` returns owned arrays.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from transport.async_batch import AsyncCalls, Received
from transport.backends.base import Channel
from transport.codec import Schema
from transport.errors import (
    ConnectError,
    FingerprintMismatchError,
    PeerGoneError,
    ProtocolError,
    TransportError,
    TransportTimeoutError,
)
from transport.protocol import (
    AUTORESET_MASK,
    MESSAGE_IDS,
    SCHEMA_IR_KEY,
    SCHEMA_NAME_KEY,
    AutoReset,
    MessageIds,
    body_codec,
    check_hello,
    decode_error,
    decode_hello,
    encode_hello_request,
    mismatch_text,
    schema_from_ir_text,
)
from transport.runtime.env import Spaces

DEFAULT_TIMEOUT = 10.0

HINTS: tuple[tuple[type[TransportError], str], ...] = (
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
        ProtocolError,
        "client and server disagree: check that both use the same transport version and "
        "schema, then connect again",
    ),
)
"""What to do about each client-side transport error, said after its message."""


def explain(exc: TransportError, url: str) -> TransportError:
    """``exc`` with the URL before its message and what to do after it (once; the same object,
    its type and attributes unchanged): every transport error a client raises names both."""
    text = str(exc)
    for kind, hint in HINTS:
        if isinstance(exc, kind):
            if hint in text:
                return exc
            named = text if url in text else f"{url}: {text}"
            exc.args = (f"{named} ({hint})",)
            break
    return exc


class StepView:
    """The fields of a step or reset response as NumPy arrays, by attribute or by key.

    Views into the client's receive buffer unless made with ``copy=True``: valid until the next
    call on the client that returned them. ``observation`` of a batched call has shape (N, 612).
    """

    __slots__ = ("_fields", "record")

    def __init__(self, record: np.ndarray) -> None:
        self.record = record
        self._fields = {name: record[name] for name in record.dtype.names or ()}

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, name: str) -> np.ndarray:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def keys(self) -> list[str]:
        return list(self._fields)

    def copy(self) -> StepView:
        return StepView(self.record.copy())

    def __repr__(self) -> str:
        shape = self.record.shape
        return f"StepView({', '.join(self._fields)}; envs={shape[0] if shape else 1})"


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
        # an array action (Box, MultiDiscrete): one env's action is an array of this many dims
        self._action_ndim = len(action.dims) if action.is_array else -1
        self._seed_codec = body_codec(schema, "RESET_SEED_REQ")
        self._seed_body = bytearray(self._seed_codec.size)
        multi = body_codec(schema, "STEP_MULTI_REQ")
        self._multi_request = bytearray(multi.size)
        self._multi_actions = multi.view(self._multi_request)[multi.ir.fields[0].name]
        self._views: dict[int | None, tuple[np.ndarray, StepView]] = {}
        ids = self.ids
        self._step_one = (ids.STEP_REQ, ids.STEP_RESP, None)
        self._step_batch = (ids.STEP_BATCH_REQ, ids.STEP_BATCH_RESP, self.num_envs)
        self._no_finals: list[tuple[int, StepView]] = []
        self._final_views: dict[int, tuple[np.ndarray, StepView]] = {}
        self._closed = False
        self._late = False  # a request timed out: its late reply is still due (``_settle``)

    # -- requests ------------------------------------------------------------------------------

    def reset(
        self, seed: int | Sequence[int | None] | None = None, *, copy: bool = False
    ) -> StepView:
        """Reset every env (env i gets ``seed + i``, or ``seed[i]`` from a list of one seed or
        None per env: RESET_SEEDS); fields have a leading env axis if N > 1."""
        if seed is None:
            body = self._exchange(self.ids.RESET_REQ, b"", self.ids.RESET_RESP)
        elif not isinstance(seed, int | np.integer):
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

    def step(self, actions: int | Sequence[int] | np.ndarray, *, copy: bool = False) -> StepView:
        """Step with one action (1-env server) or one per env (fields get a leading env axis)."""
        # The hot path: every line here costs each step (measured: benchmarks/RESULTS.md).
        if self._late:
            self._settle()  # before the actions go where the late request may still be read
        if (
            isinstance(actions, int)
            or isinstance(actions, np.integer)
            or (self._action_ndim >= 0 and np.ndim(actions) == self._action_ndim)
        ):
            if self.num_envs != 1:
                raise ValueError(f"this server has {self.num_envs} envs: pass one action per env")
            self._actions[0] = actions
            msg_type, expect, count = self._step_one
        else:
            if len(actions) != self.num_envs:
                raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")
            self._actions[:] = actions
            msg_type, expect, count = self._step_batch
        if self._closed:
            raise TransportError(f"{self.url}: the client is closed")
        try:
            resp_type, body = self.channel.request(msg_type, self._request)
        except TransportError as exc:
            self._failed(exc)
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

    def step_multi(self, actions: Sequence[int] | np.ndarray, *, copy: bool = False) -> StepView:
        """STEP_MULTI (seed 000): 8 actions, 8 results (a leading axis of 8). The server is an
        8-env server (one action per env) or a 1-env server whose env has ``step_batch`` (one
        action per seat of one game)."""
        seats = len(self._multi_actions)
        if len(actions) != seats:
            raise ValueError(f"expected {seats} actions, got {len(actions)}")
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
        body = self._exchange(request.id, b"", response.id)
        results_len = self._result.size * self.num_envs
        if body.nbytes < results_len:
            raise ProtocolError(f"OBSERVE_RESP of {body.nbytes} bytes; expected {results_len}+")
        try:
            infos = msgpack.unpackb(bytes(body[results_len:])) if body.nbytes > results_len else []
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
        ``recv`` returns their results as they finish. An env already in flight is refused."""
        self._async_calls().send(actions, env_ids)

    def recv(self, batch_size: int | None = None, *, copy: bool = False) -> Received:
        """The first ``batch_size`` (default ``self.batch_size``: N) in-flight envs to finish,
        or all in flight if fewer: results, env ids and SAME_STEP finals (``Received``)."""
        return self._async_calls().recv(batch_size or self.batch_size, copy)

    def async_reset(self, seed: int | None = None) -> None:
        """Reset every env (env i: ``seed + i``) for ``recv`` to return (nothing in flight)."""
        self._async_calls().reset(seed)

    def _async_calls(self) -> AsyncCalls:
        calls = self.__dict__.get("_async")
        if calls is None:
            calls = self.__dict__["_async"] = AsyncCalls(self)
        return calls

    @property
    def batch_size(self) -> int:
        """``recv``'s default batch size (EnvPool's ``batch_size``): N unless set."""
        return int(self.__dict__.get("_batch_size", self.num_envs))

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        if not 1 <= value <= self.num_envs:
            raise ValueError(f"batch_size must be in 1..{self.num_envs}, got {value}")
        self.__dict__["_batch_size"] = value

    def spaces(self) -> Spaces:
        codec = body_codec(self.schema, "SPACES_RESP")
        body = self._exchange(self.ids.SPACES_REQ, b"", self.ids.SPACES_RESP)
        values = codec.decode(body)
        first, second = (f.name for f in codec.ir.fields[:2])
        return Spaces(int(values[first]), int(values[second]))

    def health(self) -> bool:
        body = self._exchange(self.ids.HEALTH_REQ, b"", self.ids.HEALTH_RESP)
        return body.nbytes >= 1 and body[0] == 1

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------------

    def _exchange(self, msg_type: int, body: Any, expect: int) -> memoryview:
        if self._closed:
            raise TransportError(f"{self.url}: the client is closed")
        if self._late:
            self._settle()
        try:
            resp_type, resp = self.channel.request(msg_type, body)
        except TransportError as exc:
            self._failed(exc)
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
        """After a timeout: a channel whose requests live where the server reads them (shm
        slots) waits for the late reply before the next request is written (``settle``); the
        others drop late replies by msg_id or by order on their own."""
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
            raise decode_error(resp)
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
