"""Serving envs: the env interface, and the request handling every backend's server shares.

A backend's server accepts connections and moves frames; for each connection it creates a
``Session`` and calls ``Session.handle(msg_type, body)``, which returns the response to send.
The session owns the envs of that connection (or shares one env instance under a lock), checks
HELLO, actions, batch sizes and masks, and turns every refusal into one ERROR response.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from transport.codec import Schema, StructCodec
from transport.errors import (
    CodecError,
    FingerprintMismatchError,
    ProtocolError,
    VersionMismatchError,
)
from transport.protocol import (
    BODY_OFFSET,
    CLOSING_ERRORS,
    HEADER,
    HEADER_OFFSET,
    ErrorCode,
    MessageIds,
    RequestError,
    check_hello,
    decode_hello,
    encode_error,
    encode_hello,
)

StepOutput = Mapping[str, Any] | np.ndarray
"""What an env returns from reset/step: field values by name, or a record of the codec's dtype."""


@dataclass(frozen=True)
class Spaces:
    """Observation length and number of discrete actions."""

    obs_n: int
    act_n: int


@runtime_checkable
class Env(Protocol):
    """The env interface a server hosts (the same on the Node side).

    ``reset`` and ``step`` return the result's field values (a mapping, validated) or a record
    of the result codec's dtype (copied, not validated). An env may also define
    ``reset_into(seed, out)`` and ``step_into(action, out)``: they write the result straight
    into ``out``, a view of the response buffer (zero copy; the buffer is not cleared between
    calls and NaNs are not canonicalised), and return None.
    """

    def spaces(self) -> Spaces: ...

    def reset(self, seed: int | None = None) -> StepOutput: ...

    def step(self, action: int) -> StepOutput: ...


EnvFactory = Callable[[], Env]


class EnvGroup:
    """The N envs one session steps, with each env's last action mask and done flag."""

    def __init__(self, envs: list[Env], result: StructCodec, lock: threading.Lock | None) -> None:
        self.envs = envs
        self.lock = lock
        self.spaces = envs[0].spaces()
        mask_field = result.ir.role("action_mask")
        done_field = result.ir.role("done") or result.ir.role("terminated")
        self.mask_name = mask_field.name if mask_field else None
        self.done_name = done_field.name if done_field else None
        self.masks = np.ones((len(envs), self.spaces.act_n), dtype=np.uint8)
        self.done = np.zeros(len(envs), dtype=bool)
        self.was_reset = np.zeros(len(envs), dtype=bool)

    def remember(self, index: int, record: np.ndarray) -> None:
        if self.mask_name is not None:
            mask = record[self.mask_name]
            if mask.shape == self.masks[index].shape:
                np.copyto(self.masks[index], mask, casting="unsafe")
        if self.done_name is not None:
            self.done[index] = bool(record[self.done_name])
        self.was_reset[index] = True

    def check_action(self, index: int, action: int) -> None:
        if not self.was_reset[index]:
            raise RequestError(ErrorCode.NOT_RESET, f"env {index}: step before the first reset")
        if self.done[index]:
            raise RequestError(ErrorCode.NOT_RESET, f"env {index}: episode is done; reset first")
        if not 0 <= action < self.spaces.act_n:
            raise RequestError(
                ErrorCode.INVALID_ACTION,
                f"env {index}: action {action} is outside 0..{self.spaces.act_n - 1}",
            )
        if not self.masks[index, action]:
            raise RequestError(
                ErrorCode.MASKED_ACTION, f"env {index}: action {action} is masked out"
            )


class Session:
    """One client's conversation with a server: HELLO, then requests answered in place.

    Responses are written into one preallocated send buffer: the header at HEADER_OFFSET and the
    body at BODY_OFFSET, so a stream backend sends ``frame()`` in one call without copying.
    """

    def __init__(
        self,
        schema: Schema,
        envs: list[Env],
        *,
        env_name: str = "",
        server_lang: str = "python",
        lock: threading.Lock | None = None,
        seed: int | None = None,
    ) -> None:
        self.schema = schema
        self.first_seed = seed  # the seed of the first unseeded reset (env i: seed + i)
        self.ids = MessageIds.from_schema(schema.ir)
        self.result = schema[_body(schema, "STEP_RESP")]
        self.step_request = schema[_body(schema, "STEP_REQ")]
        self.reset_request = schema[_body(schema, "RESET_SEED_REQ")]
        action = self.step_request.ir.role("action")
        if action is None:
            raise ProtocolError("the STEP_REQ body struct has no field with role 'action'")
        self.action_name = action.name
        self.group = EnvGroup(envs, self.result, lock)
        self.num_envs = len(envs)
        self.hello_done = False
        self.info = {"num_envs": self.num_envs, "env": env_name, "server": server_lang}
        size = BODY_OFFSET + max(self.num_envs, 8) * self.result.size + 4096
        self.buffer = bytearray(size)
        self._results = [  # one 0-d record view per env, into the send buffer
            self.result.view(self.buffer, BODY_OFFSET + i * self.result.size)
            for i in range(self.num_envs)
        ]
        ids = self.ids
        self._handlers: dict[int, Callable[[memoryview], tuple[int, int]]] = {
            ids.RESET_REQ: self._reset,
            ids.RESET_SEED_REQ: self._reset_seed,
            ids.STEP_REQ: self._step,
            ids.STEP_MULTI_REQ: self._step_multi,
            ids.STEP_BATCH_REQ: self._step_batch,
            ids.HEALTH_REQ: self._health,
            ids.SPACES_REQ: self._spaces,
        }
        self.closing = False

    def handle(self, msg_type: int, body: memoryview) -> tuple[int, memoryview]:
        """Answer one request: (response msg_type, response body view into the send buffer).

        Never raises for a bad request: refusals become ERROR responses, and ``closing`` is set
        when the connection must be closed after sending it.
        """
        try:
            if msg_type == self.ids.HELLO_REQ:
                return self._hello(body)
            handler = self._handlers.get(msg_type)
            if handler is None:
                raise RequestError(
                    ErrorCode.UNKNOWN_MESSAGE, f"msg_type 0x{msg_type:02X} is not a request"
                )
            if not self.hello_done:
                raise RequestError(ErrorCode.HELLO_REQUIRED, "send HELLO_REQ first")
            resp_type, length = handler(body)
            return resp_type, memoryview(self.buffer)[BODY_OFFSET : BODY_OFFSET + length]
        except RequestError as exc:
            return self.error(exc.code, exc.text)
        except Exception as exc:  # an env bug must not take the server down
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            return self.error(ErrorCode.ENV_ERROR, detail)

    def error(self, code: ErrorCode, text: str) -> tuple[int, memoryview]:
        if code in CLOSING_ERRORS:
            self.closing = True
        return self.ids.ERROR, memoryview(encode_error(code, text))

    def frame(self, msg_type: int, msg_id: int, body: memoryview) -> memoryview:
        """Header + body as one contiguous view (copies the body only for ERROR responses)."""
        length = body.nbytes
        if body.obj is not self.buffer:
            self.buffer[BODY_OFFSET : BODY_OFFSET + length] = body
        HEADER.pack_into(self.buffer, HEADER_OFFSET, msg_type, msg_id, length)
        return memoryview(self.buffer)[HEADER_OFFSET : BODY_OFFSET + length]

    # -- requests ------------------------------------------------------------------------------

    def _hello(self, body: memoryview) -> tuple[int, memoryview]:
        try:
            hello = decode_hello(body)
            check_hello(hello, self.schema.fingerprint, peer="client")
        except FingerprintMismatchError as exc:
            return self.error(ErrorCode.FINGERPRINT_MISMATCH, str(exc))
        except VersionMismatchError as exc:
            return self.error(ErrorCode.VERSION_MISMATCH, str(exc))
        except ProtocolError as exc:
            return self.error(ErrorCode.BAD_FRAME, str(exc))
        self.hello_done = True
        return self.ids.HELLO_RESP, memoryview(encode_hello(self.schema.fingerprint, self.info))

    def _expect_size(self, body: memoryview, size: int, what: str) -> None:
        if body.nbytes != size:
            raise RequestError(
                ErrorCode.BAD_BODY_SIZE, f"{what} body is {body.nbytes} bytes, expected {size}"
            )

    def _write(self, index: int, output: StepOutput | None) -> None:
        if output is None:  # the env wrote the record in place (step_into / reset_into)
            self.group.remember(index, self._results[index])
            return
        offset = BODY_OFFSET + index * self.result.size
        try:
            self.result.encode_into(
                self.buffer, offset, output, validate=not isinstance(output, np.ndarray)
            )
        except CodecError as exc:
            raise RequestError(ErrorCode.ENV_ERROR, f"env {index} returned bad values: {exc}")
        self.group.remember(index, self._results[index])

    def _run(self, call: Callable[[], None]) -> None:
        lock = self.group.lock
        if lock is None:
            call()
            return
        with lock:
            call()

    def _reset_all(self, seed: int | None) -> tuple[int, int]:
        if seed is None and self.first_seed is not None and not self.group.was_reset.any():
            seed = self.first_seed

        def run() -> None:
            for i, env in enumerate(self.group.envs):
                env_seed = None if seed is None else seed + i
                reset_into = getattr(env, "reset_into", None)
                if reset_into is not None:
                    self._write(i, reset_into(env_seed, self._results[i]))
                else:
                    self._write(i, env.reset(env_seed))

        self._run(run)
        return self.ids.RESET_RESP, self.num_envs * self.result.size

    def _reset(self, body: memoryview) -> tuple[int, int]:
        self._expect_size(body, 0, "RESET_REQ")
        return self._reset_all(None)

    def _reset_seed(self, body: memoryview) -> tuple[int, int]:
        self._expect_size(body, self.reset_request.size, "RESET_SEED_REQ")
        seed_field = self.reset_request.ir.fields[0].name
        seed = int(self.reset_request.view(body)[seed_field])
        return self._reset_all(seed)

    def _step_envs(self, actions: np.ndarray) -> None:
        group = self.group
        for i in range(len(actions)):
            group.check_action(i, int(actions[i]))

        def run() -> None:
            for i, env in enumerate(group.envs):
                step_into = getattr(env, "step_into", None)
                if step_into is not None:
                    self._write(i, step_into(int(actions[i]), self._results[i]))
                else:
                    self._write(i, env.step(int(actions[i])))

        self._run(run)

    def _step(self, body: memoryview) -> tuple[int, int]:
        if self.num_envs != 1:
            raise RequestError(
                ErrorCode.BAD_BATCH, f"STEP_REQ needs a 1-env server; this one has {self.num_envs}"
            )
        self._expect_size(body, self.step_request.size, "STEP_REQ")
        self._step_envs(self.step_request.view(body, count=1)[self.action_name])
        return self.ids.STEP_RESP, self.result.size

    def _step_multi(self, body: memoryview) -> tuple[int, int]:
        multi = self.schema[_body(self.schema, "STEP_MULTI_REQ")]
        if self.num_envs != 8:
            raise RequestError(
                ErrorCode.BAD_BATCH,
                f"STEP_MULTI_REQ needs an 8-env server; this one has {self.num_envs}",
            )
        self._expect_size(body, multi.size, "STEP_MULTI_REQ")
        actions = multi.view(body)[multi.ir.fields[0].name]
        self._step_envs(actions)
        return self.ids.STEP_MULTI_RESP, 8 * self.result.size

    def _step_batch(self, body: memoryview) -> tuple[int, int]:
        size = self.step_request.size
        if body.nbytes != self.num_envs * size:
            raise RequestError(
                ErrorCode.BAD_BATCH,
                f"STEP_BATCH_REQ carries {body.nbytes // size if size else 0} actions "
                f"({body.nbytes} bytes); this server has {self.num_envs} envs",
            )
        self._step_envs(self.step_request.view(body, count=self.num_envs)[self.action_name])
        return self.ids.STEP_BATCH_RESP, self.num_envs * self.result.size

    def _health(self, body: memoryview) -> tuple[int, int]:
        self._expect_size(body, 0, "HEALTH_REQ")
        self.buffer[BODY_OFFSET] = 1
        return self.ids.HEALTH_RESP, 1

    def _spaces(self, body: memoryview) -> tuple[int, int]:
        self._expect_size(body, 0, "SPACES_REQ")
        codec = self.schema[_body(self.schema, "SPACES_RESP")]
        spaces = self.group.spaces
        codec.encode_into(
            self.buffer,
            BODY_OFFSET,
            {codec.ir.fields[0].name: spaces.obs_n, codec.ir.fields[1].name: spaces.act_n},
        )
        return self.ids.SPACES_RESP, codec.size


def _body(schema: Schema, message: str) -> str:
    body = schema.ir.messages[message].body
    if body is None:
        raise ProtocolError(f"message {message} of schema {schema.name} has no body struct")
    return body


class SessionFactory:
    """Makes one Session per connection: fresh envs from a factory, or one shared env + lock."""

    def __init__(
        self,
        schema: Schema,
        env_or_factory: Env | EnvFactory,
        *,
        num_envs: int = 1,
        env_name: str = "",
        server_lang: str = "python",
        seed: int | None = None,
    ) -> None:
        if num_envs < 1:
            raise ValueError("num_envs must be at least 1")
        self.schema = schema
        self.num_envs = num_envs
        self.env_name = env_name
        self.server_lang = server_lang
        self.seed = seed
        if not isinstance(env_or_factory, type) and isinstance(env_or_factory, Env):
            if num_envs != 1:
                raise ValueError("pass an env factory to serve more than one env")
            self._shared: Env | None = env_or_factory
            self._factory: EnvFactory | None = None
            self._lock: threading.Lock | None = threading.Lock()
        else:
            self._shared, self._factory, self._lock = None, env_or_factory, None

    def __call__(self) -> Session:
        if self._factory is not None:
            envs = [self._factory() for _ in range(self.num_envs)]
        else:
            assert self._shared is not None
            envs = [self._shared]
        return Session(
            self.schema,
            envs,
            env_name=self.env_name,
            server_lang=self.server_lang,
            lock=self._lock,
            seed=self.seed,
        )
