"""The stream-protocol session: one client's conversation with a server, request by request.

A stream backend's server (unix, http, zmq) accepts connections and moves frames; for each
client it creates a ``Session`` and calls ``Session.handle(msg_type, body)``, which returns the
response to send. The session checks HELLO and body sizes, decodes request bodies, calls the
client's ``EnvRuntime`` (every env rule is there) and frames the response. Results are written
by the runtime straight into the session's send buffer (rows of its records): no copy.
"""

from __future__ import annotations

import struct
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

from transport.codec import Schema
from transport.protocol import (
    BODY_OFFSET,
    CLOSING_ERRORS,
    FINAL_COUNT,
    HEADER,
    HEADER_OFFSET,
    HEADER_SIZE,
    AutoReset,
    ErrorCode,
    MessageIds,
    RequestError,
    accept_hello,
    body_codec,
    encode_error,
    encode_hello_response,
)
from transport.runtime.async_session import AsyncHandlers, check_seed_flags
from transport.runtime.core import ACTION_CODES, describe
from transport.runtime.host import EnvHost
from transport.runtime.pool import shared_buffer


class _ViewsByLength:
    """``base[:extra + length]`` for a body ``length``, made once per length: a session hands
    on the same response views request after request (a SAME_STEP tail varies with the envs
    that ended, so past ``KEPT`` lengths the cache starts over)."""

    KEPT = 64

    def __init__(self, base: memoryview, extra: int = 0) -> None:
        self._base = base
        self._extra = extra
        self._views: dict[int, memoryview] = {}

    def get(self, length: int) -> memoryview:
        view = self._views.get(length)
        if view is None:
            if len(self._views) >= self.KEPT:
                self._views.clear()
            view = self._views[length] = self._base[: self._extra + length]
        return view


def cannot_make_envs(exc: BaseException) -> str:
    """What a client whose session (its envs) the server cannot make is told (Node:
    ``cannotMakeEnvs``, the same words)."""
    return f"the server cannot make this client's envs: {describe(exc)}"


class Session:
    """One client of a stream server: HELLO, then requests answered in place.

    Results are written into one preallocated send buffer: the header at HEADER_OFFSET and the
    body at BODY_OFFSET, so a stream backend sends ``frame()`` in one call without copying. Other
    bodies (ERROR, HELLO, health, spaces, OBSERVE's tail) never go there: the last result of
    every env stays readable for the runtime's checks.
    """

    def __init__(self, host: EnvHost) -> None:
        schema = host.schema
        self.schema: Schema = schema
        self.host = host
        self.ids = MessageIds.from_schema(schema.ir)
        self.result = host.result
        self.step_request = host.step_request
        self.multi_request = body_codec(schema, "STEP_MULTI_REQ")
        self.reset_request = body_codec(schema, "RESET_SEED_REQ")
        self.seeds_request = body_codec(schema, "RESET_SEEDS_REQ")
        self._seed_flag_at = self.seeds_request.ir.fields[1].offset  # EnvSeed.has_seed
        self.spaces_result = body_codec(schema, "SPACES_RESP")
        self.action_name = host.action.name
        # one integer (Discrete) is unpacked; an array action (Box, MultiDiscrete) is viewed
        self._array_action = host.action.is_array
        self._action = struct.Struct("<" + ACTION_CODES.get(host.action.elem, "B"))
        self._action_offset = host.action.offset
        self.num_envs = n = host.num_envs
        self._batch_shape = (n,)
        self._request_dtype = self.step_request.dtype
        self.hello_done = False
        self.closing = False
        self.info = {
            "num_envs": n,
            "env": host.env_name,
            "server": host.server_lang,
            "masked_actions": host.masked_actions,
        }
        envs = host.create_envs()
        rows = max(host.rows(envs), self.multi_request.ir.fields[0].count)
        size = self.result.size
        # SAME_STEP auto-reset appends: u32 count, then per ended env (u32 index, final result).
        # With worker processes the rows live in a shared mapping: the workers write them in
        # place (the pool finds them: ``find_shared``), nothing is copied back
        alloc: Callable[[int], Any] = shared_buffer if host.workers else bytearray
        self.buffer = alloc(BODY_OFFSET + rows * size + 4 + n * (4 + size))
        self._body = memoryview(self.buffer)[BODY_OFFSET:]
        # per-request views made once (issue 24): response bodies and frames by length, and
        # the STEP_BATCH actions array of the last request body view (a backend that hands
        # the same view object again, its body in the same place, reuses the array, and with
        # it the runtime's screens and the env's caches keyed on the array)
        self._body_views = _ViewsByLength(self._body)
        self._frames = _ViewsByLength(memoryview(self.buffer)[HEADER_OFFSET:], HEADER_SIZE)
        self._batch_body: memoryview | None = None
        self._batch_actions: np.ndarray = np.zeros(0)
        results = self.result.view(self.buffer, BODY_OFFSET, count=rows)
        self._finals_buffer = alloc(n * size)
        finals = self.result.view(self._finals_buffer, 0, count=n)
        self.runtime = host.runtime(envs, results, finals)
        # the session is dropped with its client: its envs are closed then, or at ``close``
        self._close = weakref.finalize(self, self.runtime.close)
        ids = self.ids
        self._handlers: dict[int, Callable[[memoryview], tuple[int, int]]] = {
            ids.RESET_REQ: self._reset,
            ids.RESET_SEED_REQ: self._reset_seed,
            ids.RESET_SEEDS_REQ: self._reset_seeds,
            ids.STEP_REQ: self._step,
            ids.STEP_MULTI_REQ: self._step_multi,
            ids.STEP_BATCH_REQ: self._step_batch,
        }
        self._other: dict[int, Callable[[memoryview], tuple[int, bytes]]] = {
            ids.HEALTH_REQ: self._health,
            ids.SPACES_REQ: self._spaces,
        }
        self._async = AsyncHandlers.of(self)
        if self._async is not None:
            self._other.update(self._async.handlers)
        observe = schema.ir.messages.get("OBSERVE_REQ")
        response = schema.ir.messages.get("OBSERVE_RESP")
        if observe is not None and response is not None:
            self._observe_resp = response.id
            self._other[observe.id] = self._observe

    def close(self) -> None:
        """Close the session's envs (stop its worker processes) now instead of when it is
        collected; once."""
        self._close()
        # the handler tables hold bound methods (of this session and of its async handlers):
        # without them the session, its buffers and their memfd mappings (worker pools) go
        # when the listener drops it, not at the next cyclic collection
        self._handlers.clear()
        self._other.clear()
        if self._async is not None:
            self._async.handlers.clear()
            self._async = None

    def handle(self, msg_type: int, body: memoryview) -> tuple[int, memoryview]:
        """Answer one request: (response msg_type, response body).

        Never raises for a bad request: refusals become ERROR responses, and ``closing`` is set
        when the connection must be closed after sending it.
        """
        try:
            handler = self._handlers.get(msg_type)
            if handler is None:
                if msg_type == self.ids.HELLO_REQ:
                    return self._hello(body)
                other = self._other.get(msg_type)
                if other is None:
                    raise RequestError(
                        ErrorCode.UNKNOWN_MESSAGE, f"msg_type 0x{msg_type:02X} is not a request"
                    )
                if not self.hello_done:
                    raise RequestError(ErrorCode.HELLO_REQUIRED, "send HELLO_REQ first")
                if self._async is not None and msg_type not in self._async.handlers:
                    if msg_type not in (self.ids.HEALTH_REQ, self.ids.SPACES_REQ):
                        self._async.batches.check_idle(msg_type)
                resp_type, data = other(body)
                return resp_type, memoryview(data)
            if not self.hello_done:
                raise RequestError(ErrorCode.HELLO_REQUIRED, "send HELLO_REQ first")
            if self._async is not None and self._async.batches.count:
                self._async.batches.check_idle(msg_type)
            resp_type, length = handler(body)
            return resp_type, self._body_views.get(length)
        except RequestError as exc:
            return self.error(exc.code, exc.text)
        except Exception as exc:  # a bug must not take the server down (env errors: runtime)
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            return self.error(ErrorCode.INTERNAL, detail)

    def error(self, code: ErrorCode, text: str) -> tuple[int, memoryview]:
        if code in CLOSING_ERRORS:
            self.closing = True
        return self.ids.ERROR, memoryview(encode_error(code, text))

    def frame(self, msg_type: int, msg_id: int, body: memoryview) -> memoryview:
        """Header + body as one contiguous view: in place for results, a new buffer otherwise."""
        length = body.nbytes
        if body.obj is self.buffer:
            HEADER.pack_into(self.buffer, HEADER_OFFSET, msg_type, msg_id, length)
            return self._frames.get(length)
        return memoryview(HEADER.pack(msg_type, msg_id, length) + bytes(body))

    # -- requests ------------------------------------------------------------------------------

    def _hello(self, body: memoryview) -> tuple[int, memoryview]:
        try:
            hello, mode = accept_hello(body, self.schema)
        except RequestError as exc:
            return self.error(exc.code, exc.text)
        if self.hello_done:  # a second HELLO: a fresh session on the same envs (Node: the same)
            if self._async is not None:
                self._async.batches.check_idle(self.ids.HELLO_REQ)
            self.runtime.forget_resets()
        self.runtime.set_autoreset(mode)
        self.hello_done = True
        info = {**self.info, "autoreset": mode.name.lower()}
        return self.ids.HELLO_RESP, memoryview(
            encode_hello_response(self.schema, hello, info, int(mode))
        )

    def _expect_size(self, body: memoryview, size: int, what: str) -> None:
        if body.nbytes != size:
            raise RequestError(
                ErrorCode.BAD_BODY_SIZE, f"{what} body is {body.nbytes} bytes, expected {size}"
            )

    def _reset(self, body: memoryview) -> tuple[int, int]:
        self._expect_size(body, 0, "RESET_REQ")
        self.runtime.reset()
        return self.ids.RESET_RESP, self.num_envs * self.result.size

    def _reset_seed(self, body: memoryview) -> tuple[int, int]:
        self._expect_size(body, self.reset_request.size, "RESET_SEED_REQ")
        seed_field = self.reset_request.ir.fields[0].name
        self.runtime.reset_seed(int(self.reset_request.view(body)[seed_field]))
        return self.ids.RESET_RESP, self.num_envs * self.result.size

    def _reset_seeds(self, body: memoryview) -> tuple[int, int]:
        """RESET_SEEDS: env i with its own seed (or unseeded): any list of seeds."""
        size = self.seeds_request.size
        self._expect_size(body, self.num_envs * size, "RESET_SEEDS_REQ")
        check_seed_flags(body, size, self._seed_flag_at, "RESET_SEEDS_REQ")
        entries = self.seeds_request.view(body, 0, count=self.num_envs)
        seeds = [
            int(seed) if has else None
            for seed, has in zip(
                entries["seed"].tolist(), entries["has_seed"].tolist(), strict=True
            )
        ]
        self.runtime.reset(seeds)
        return self.ids.RESET_RESP, self.num_envs * self.result.size

    def _step(self, body: memoryview) -> tuple[int, int]:
        if self.num_envs != 1:
            raise RequestError(
                ErrorCode.BAD_BATCH, f"STEP_REQ needs a 1-env server; this one has {self.num_envs}"
            )
        self._expect_size(body, self.step_request.size, "STEP_REQ")
        if self._array_action:
            action = self.step_request.view(body)[self.action_name].copy()
        else:
            (action,) = self._action.unpack_from(body, self._action_offset)
        ended = self.runtime.step_one(0, action)
        return self.ids.STEP_RESP, self._results_length(1, [0] if ended else None)

    def _step_multi(self, body: memoryview) -> tuple[int, int]:
        multi = self.multi_request
        runtime = self.runtime
        runtime.check_multi()  # a BAD_BATCH refusal comes before the body size
        self._expect_size(body, multi.size, "STEP_MULTI_REQ")
        actions = multi.view(body)[multi.ir.fields[0].name]
        ended = runtime.step_multi(actions)
        return self.ids.STEP_MULTI_RESP, self._results_length(runtime.seats, ended)

    def _step_batch(self, body: memoryview) -> tuple[int, int]:
        if body is self._batch_body:  # the same view as last time: its size was checked
            actions = self._batch_actions
        else:
            size = self.step_request.size
            if size and body.nbytes % size:
                raise RequestError(
                    ErrorCode.BAD_BODY_SIZE,
                    f"STEP_BATCH_REQ body is {body.nbytes} bytes, "
                    f"not a whole number of {size}-byte actions",
                )
            if body.nbytes != self.num_envs * size:
                raise RequestError(
                    ErrorCode.BAD_BATCH,
                    f"STEP_BATCH_REQ carries {body.nbytes // size if size else 0} actions "
                    f"({body.nbytes} bytes); this server has {self.num_envs} envs",
                )
            # the size is checked above: a view of the body as N request records, made directly
            actions = np.ndarray(self._batch_shape, self._request_dtype, body)[self.action_name]
            self._batch_body, self._batch_actions = body, actions
        ended = self.runtime.step(actions)
        return self.ids.STEP_BATCH_RESP, self._results_length(self.num_envs, ended)

    def _results_length(self, count: int, ended: list[int] | None) -> int:
        """Body length of a step response; SAME_STEP adds the tail of final results."""
        size = self.result.size
        length = count * size
        if self.runtime.autoreset != AutoReset.SAME_STEP:
            return length
        tail = BODY_OFFSET + length
        FINAL_COUNT.pack_into(self.buffer, tail, len(ended) if ended else 0)
        at = tail + 4
        for index in ended or ():
            FINAL_COUNT.pack_into(self.buffer, at, index)
            self.buffer[at + 4 : at + 4 + size] = self._finals_buffer[
                index * size : (index + 1) * size
            ]
            at += 4 + size
        return at - BODY_OFFSET

    def _health(self, body: memoryview) -> tuple[int, bytes]:
        self._expect_size(body, 0, "HEALTH_REQ")
        return self.ids.HEALTH_RESP, b"\x01"

    def _spaces(self, body: memoryview) -> tuple[int, bytes]:
        self._expect_size(body, 0, "SPACES_REQ")
        codec = self.spaces_result
        spaces = self.runtime.spaces
        first, second = (f.name for f in codec.ir.fields[:2])
        return self.ids.SPACES_RESP, codec.encode({first: spaces.obs_n, second: spaces.act_n})

    def _observe(self, body: memoryview) -> tuple[int, bytes]:
        """OBSERVE_RESP: the N current results, then a msgpack array of N info maps."""
        self._expect_size(body, 0, "OBSERVE_REQ")
        infos = self.runtime.observe()
        try:
            tail = msgpack.packb(infos)
        except (TypeError, ValueError) as exc:
            raise RequestError(
                ErrorCode.ENV_ERROR, f"env 0: info() returned a map msgpack cannot carry: {exc}"
            ) from None
        return self._observe_resp, bytes(self._body[: self.num_envs * self.result.size]) + tail
