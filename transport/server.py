"""Serving envs: the env interface, and the request handling every backend's server shares.

A backend's server accepts connections and moves frames; for each connection it creates a
``Session`` and calls ``Session.handle(msg_type, body)``, which returns the response to send.
The session owns the envs of that connection (or shares one env instance under a lock), checks
HELLO, actions, batch sizes and masks, and turns every refusal into one ERROR response.
"""

from __future__ import annotations

import contextlib
import struct
import threading
import traceback
import weakref
from collections.abc import Callable, Mapping, Sequence
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
    AUTORESET_MASK,
    BODY_OFFSET,
    CLOSING_ERRORS,
    FINAL_COUNT,
    HEADER,
    HEADER_OFFSET,
    AutoReset,
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

    Optionally ``step_batch(actions)``: one action per seat of a multi-player game (seed 000's
    self-play ``stepBatch``), one result per seat. A 1-env server whose env has it answers
    STEP_MULTI_REQ (8 seats) by calling it once; the server checks the range of every action
    and that the game was reset and is not over, the env checks the rest (each seat's mask).
    """

    def spaces(self) -> Spaces: ...

    def reset(self, seed: int | None = None) -> StepOutput: ...

    def step(self, action: int) -> StepOutput: ...


EnvFactory = Callable[[], Env]

_NO_LOCK = contextlib.nullcontext()
_STRUCT_CODES = {
    "i8": "b",
    "u8": "B",
    "i16": "h",
    "u16": "H",
    "i32": "i",
    "u32": "I",
    "i64": "q",
    "u64": "Q",
}


class EnvGroup:
    """The N envs one session steps, and the checks a step request must pass.

    The last result of env i stays in the session's send buffer (errors are sent from a buffer
    of their own), so the action mask and done flag are read there: no per-step copy.
    """

    def __init__(
        self,
        envs: list[Env],
        result: StructCodec,
        results: np.ndarray,
        lock: threading.Lock | None,
    ) -> None:
        self.envs = envs
        self.lock = lock
        self.spaces = envs[0].spaces()
        mask = result.ir.role("action_mask")
        self.masks = results[mask.name] if mask else None  # (N, mask_len) view of the results
        # (N,) views of the results whose truth ends an episode (done, or terminated/truncated)
        self.ends = [results[f.name] for f in result.ir.episode_end_fields()]
        self.was_reset = np.zeros(len(envs), dtype=bool)
        self.all_reset = False

    def check_action(self, index: int, action: int) -> None:
        if not self.all_reset and not self.was_reset[index]:
            raise RequestError(ErrorCode.NOT_RESET, f"env {index}: step before the first reset")
        if self.is_done(index):
            raise RequestError(ErrorCode.NOT_RESET, f"env {index}: episode is done; reset first")
        if not 0 <= action < self.spaces.act_n:
            raise RequestError(
                ErrorCode.INVALID_ACTION,
                f"env {index}: action {action} is outside 0..{self.spaces.act_n - 1}",
            )
        masks = self.masks
        if masks is not None and action < masks.shape[1] and not masks[index, action]:
            raise RequestError(
                ErrorCode.MASKED_ACTION, f"env {index}: action {action} is masked out"
            )

    def is_done(self, index: int) -> bool:
        return any(end[index] for end in self.ends)

    def done_mask(self) -> np.ndarray | None:
        """(N,) bool: the envs whose episode ended (None when the result has no end fields)."""
        if not self.ends:
            return None
        done = self.ends[0].astype(bool)
        for end in self.ends[1:]:
            done |= end.astype(bool)
        return done

    def check_actions(self, actions: np.ndarray, *, skip_done: bool = False) -> None:
        """The same checks for one action per env, vectorised; reports the first bad env.

        ``skip_done``: envs whose episode is done are not checked (their action is ignored:
        NEXT_STEP auto-reset).
        """
        bad = ~self.was_reset if not self.all_reset else None
        done = self.done_mask()
        if done is not None and not skip_done:
            bad = done if bad is None else bad | done
        bad_range = (actions < 0) | (actions >= self.spaces.act_n)
        if self.masks is not None:
            inside = np.minimum(np.maximum(actions, 0), self.masks.shape[1] - 1)
            masked = self.masks[np.arange(len(actions)), inside] == 0
            bad_range = bad_range | masked
        if skip_done and done is not None:
            bad_range &= ~done
        if (bad is not None and bad.any()) or bad_range.any():
            first = bad_range if bad is None else bad | bad_range
            index = int(np.argmax(first))
            self.check_action(index, int(actions[index]))

    def mark_reset(self, index: int) -> None:
        self.was_reset[index] = True
        self.all_reset = bool(self.was_reset.all())


class Session:
    """One client's conversation with a server: HELLO, then requests answered in place.

    Results are written into one preallocated send buffer: the header at HEADER_OFFSET and the
    body at BODY_OFFSET, so a stream backend sends ``frame()`` in one call without copying. ERROR
    bodies never go there: the last result of every env stays readable for the action checks.
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
        factory: EnvFactory | None = None,
        workers: int = 0,
        num_envs: int | None = None,
    ) -> None:
        self.schema = schema
        self.factory = factory  # recreates an env whose reset fails after it raised
        self.first_seed = seed  # the seed of the first unseeded reset (env i: seed + i)
        self.ids = MessageIds.from_schema(schema.ir)
        self.result = schema[_body(schema, "STEP_RESP")]
        self.step_request = schema[_body(schema, "STEP_REQ")]
        self.multi_request = schema[_body(schema, "STEP_MULTI_REQ")]
        self.reset_request = schema[_body(schema, "RESET_SEED_REQ")]
        self.spaces_result = schema[_body(schema, "SPACES_RESP")]
        action = self.step_request.ir.role("action")
        if action is None:
            raise ProtocolError("the STEP_REQ body struct has no field with role 'action'")
        self.action_name = action.name
        self._action = struct.Struct("<" + _STRUCT_CODES[action.elem])
        self._action_offset = action.offset
        self.num_envs = len(envs) if num_envs is None else num_envs
        self.hello_done = False
        self.closing = False
        self.autoreset = AutoReset.DISABLED
        self.info = {"num_envs": self.num_envs, "env": env_name, "server": server_lang}
        size = self.result.size
        results_size = max(self.num_envs, 8) * size
        # SAME_STEP auto-reset appends: u32 count, then per ended env (u32 index, final result)
        self.buffer = bytearray(BODY_OFFSET + results_size + 4 + self.num_envs * (4 + size))
        self._finals = 0  # how many final results the current response carries
        self._body = memoryview(self.buffer)[BODY_OFFSET:]
        results = self.result.view(self.buffer, BODY_OFFSET, count=self.num_envs)
        self._records = [  # one 0-d record view per env, into the send buffer
            self.result.view(self.buffer, BODY_OFFSET + i * self.result.size)
            for i in range(self.num_envs)
        ]
        self.pool: Any = None  # workers > 0: a transport.workers.WorkerPool runs the envs
        if workers > 0:
            envs = self._start_pool(workers, results)
        self.group = EnvGroup(envs, self.result, results, lock)
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

    def _start_pool(self, workers: int, results: np.ndarray) -> list[Env]:
        from transport.workers import PoolEnvStub, WorkerPool

        if self.factory is None:
            raise ValueError("workers need an env factory (each worker creates its envs)")
        pool = WorkerPool(
            self.factory, self.schema, self.result.ir.name, self.num_envs, workers, results
        )
        self.pool = pool
        weakref.finalize(self, pool.close)  # the session is dropped with its connection
        return [PoolEnvStub(pool) for _ in range(self.num_envs)]

    def close(self) -> None:
        """Stop the worker processes (if any) now instead of when the session is collected."""
        if self.pool is not None:
            self.pool.close()

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
                raise RequestError(
                    ErrorCode.UNKNOWN_MESSAGE, f"msg_type 0x{msg_type:02X} is not a request"
                )
            if not self.hello_done:
                raise RequestError(ErrorCode.HELLO_REQUIRED, "send HELLO_REQ first")
            resp_type, length = handler(body)
            return resp_type, self._body[:length]
        except RequestError as exc:
            return self.error(exc.code, exc.text)
        except Exception as exc:  # a bug must not take the server down (env errors: _recover)
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
            return memoryview(self.buffer)[HEADER_OFFSET : BODY_OFFSET + length]
        return memoryview(HEADER.pack(msg_type, msg_id, length) + bytes(body))

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
        try:
            self.autoreset = AutoReset(hello.flags & AUTORESET_MASK)
        except ValueError:
            return self.error(
                ErrorCode.BAD_FRAME, f"unknown auto-reset mode in flags {hello.flags}"
            )
        self.hello_done = True
        info = {**self.info, "autoreset": self.autoreset.name.lower()}
        return self.ids.HELLO_RESP, memoryview(
            encode_hello(self.schema.fingerprint, info, flags=int(self.autoreset))
        )

    def _expect_size(self, body: memoryview, size: int, what: str) -> None:
        if body.nbytes != size:
            raise RequestError(
                ErrorCode.BAD_BODY_SIZE, f"{what} body is {body.nbytes} bytes, expected {size}"
            )

    def _write(self, index: int, output: StepOutput | None) -> None:
        if output is not None:  # None: the env wrote the record in place (step_into/reset_into)
            try:
                self.result.encode_into(
                    self.buffer,
                    BODY_OFFSET + index * self.result.size,
                    output,
                    validate=not isinstance(output, np.ndarray),
                )
            except CodecError as exc:
                raise RequestError(
                    ErrorCode.ENV_ERROR, f"env {index}: returned bad values: {exc}"
                ) from None

    def _reset_all(self, seed: int | None) -> tuple[int, int]:
        group = self.group
        if seed is None and self.first_seed is not None and not group.was_reset.any():
            seed = self.first_seed
        failures: list[tuple[int, Exception]] = []
        if self.pool is not None:
            failures = self.pool.reset(
                [None if seed is None else seed + i for i in range(self.num_envs)]
            )
            failed = {i for i, _ in failures}
            for i in range(self.num_envs):
                if i not in failed:
                    group.mark_reset(i)
            if failures:
                raise self._recover(failures, seed)
            return self.ids.RESET_RESP, self.num_envs * self.result.size
        with group.lock or _NO_LOCK:
            for i, env in enumerate(group.envs):
                env_seed = None if seed is None else seed + i
                try:
                    reset_into = getattr(env, "reset_into", None)
                    if reset_into is not None:
                        self._write(i, reset_into(env_seed, self._records[i]))
                    else:
                        self._write(i, env.reset(env_seed))
                except Exception as exc:  # the other envs still reset
                    failures.append((i, exc))
                    continue
                group.mark_reset(i)
            if failures:
                raise self._recover(failures, seed)
        return self.ids.RESET_RESP, self.num_envs * self.result.size

    def _reset(self, body: memoryview) -> tuple[int, int]:
        self._expect_size(body, 0, "RESET_REQ")
        return self._reset_all(None)

    def _reset_seed(self, body: memoryview) -> tuple[int, int]:
        self._expect_size(body, self.reset_request.size, "RESET_SEED_REQ")
        seed_field = self.reset_request.ir.fields[0].name
        seed = int(self.reset_request.view(body)[seed_field])
        return self._reset_all(seed)

    def _reset_one(self, index: int) -> None:
        env = self.group.envs[index]
        reset_into = getattr(env, "reset_into", None)
        if reset_into is not None:
            self._write(index, reset_into(None, self._records[index]))
        else:
            self._write(index, env.reset(None))

    def _step_one(self, index: int, action: int) -> None:
        """Step env ``index`` (or auto-reset it), honouring the session's auto-reset mode."""
        group = self.group
        if self.autoreset == AutoReset.NEXT_STEP and group.is_done(index):
            self._reset_one(index)  # the action of a done env is ignored
            return
        env = group.envs[index]
        step_into = getattr(env, "step_into", None)
        if step_into is not None:
            self._write(index, step_into(action, self._records[index]))
        else:
            self._write(index, env.step(action))
        if self.autoreset == AutoReset.SAME_STEP and group.is_done(index):
            self._keep_final(index)
            self._reset_one(index)

    def _keep_final(self, index: int, final: Any = None) -> None:
        """Copy env ``index``'s final result into the response tail (SAME_STEP)."""
        size = self.result.size
        tail = BODY_OFFSET + self.num_envs * size + 4 + self._finals * (4 + size)
        FINAL_COUNT.pack_into(self.buffer, tail, index)
        if final is None:
            final = self._body[index * size : (index + 1) * size]
        self.buffer[tail + 4 : tail + 4 + size] = final
        self._finals += 1

    def _pool_step(self, actions: Any) -> None:
        """Fan the step out to the worker processes and gather (``workers`` > 0)."""
        pool = self.pool
        ended, failures = pool.step(actions, self.autoreset)
        for i in ended:
            self._keep_final(i, pool.final_record(i).tobytes())
        if failures:
            raise self._recover(failures, None)

    def _results_length(self, count: int) -> int:
        """Body length of a step response; SAME_STEP adds the tail with its count."""
        length = count * self.result.size
        if self.autoreset != AutoReset.SAME_STEP:
            return length
        FINAL_COUNT.pack_into(self.buffer, BODY_OFFSET + length, self._finals)
        return length + 4 + self._finals * (4 + self.result.size)

    def _step_all(self, actions: np.ndarray) -> None:
        group = self.group
        group.check_actions(actions, skip_done=self.autoreset == AutoReset.NEXT_STEP)
        self._finals = 0
        if self.pool is not None:
            self._pool_step(actions)
            return
        failures: list[tuple[int, Exception]] | None = None
        with group.lock or _NO_LOCK:
            for i in range(len(actions)):
                try:  # free unless an env raises (zero-cost exceptions)
                    self._step_one(i, int(actions[i]))
                except Exception as exc:  # the other envs still step
                    if failures is None:
                        failures = []
                    failures.append((i, exc))
            if failures is not None:
                raise self._recover(failures, None)

    def _recover(self, failures: list[tuple[int, Exception]], seed: int | None) -> RequestError:
        """Reset (or recreate from the factory) each env that raised; the ERROR to answer.

        The text starts with ``env {i}:`` (the first env that failed), so clients can name the
        env (``EnvError.env_id``). The other envs of the request did step (or reset).
        """
        texts = []
        for index, exc in failures:
            if isinstance(exc, RequestError):
                detail = exc.text.removeprefix(f"env {index}: ")
            else:
                detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            fate = self._restore(index, None if seed is None else seed + index)
            texts.append(f"env {index}: {detail} ({fate})")
        return RequestError(ErrorCode.ENV_ERROR, "; ".join(texts))

    def _restore(self, index: int, seed: int | None) -> str:
        """Reset env ``index`` after it raised; if that raises too, recreate it from the factory."""
        group = self.group
        if self.pool is not None:
            fate, ok = self.pool.restore(index, seed)
            if ok:
                group.mark_reset(index)
            else:
                group.was_reset[index] = False
                group.all_reset = False
            return str(fate)
        env = group.envs[index]
        attempts: list[tuple[str, Callable[[], Env]]] = [("the env was reset", lambda: env)]
        if self.factory is not None:
            attempts.append(("the env was recreated", self.factory))
        for fate, make in attempts:
            try:
                fresh = make()
                reset_into = getattr(fresh, "reset_into", None)
                if reset_into is not None:
                    self._write(index, reset_into(seed, self._records[index]))
                else:
                    self._write(index, fresh.reset(seed))
            except Exception:
                continue
            group.envs[index] = fresh
            group.mark_reset(index)
            return fate
        group.was_reset[index] = False  # every step is NOT_RESET until a reset succeeds
        group.all_reset = False
        return "the env could not be reset: send a reset"

    def _step(self, body: memoryview) -> tuple[int, int]:
        if self.num_envs != 1:
            raise RequestError(
                ErrorCode.BAD_BATCH, f"STEP_REQ needs a 1-env server; this one has {self.num_envs}"
            )
        self._expect_size(body, self.step_request.size, "STEP_REQ")
        (action,) = self._action.unpack_from(body, self._action_offset)
        group = self.group
        if not (self.autoreset == AutoReset.NEXT_STEP and group.is_done(0)):
            group.check_action(0, action)
        self._finals = 0
        if self.pool is not None:
            self._pool_step([action])
            return self.ids.STEP_RESP, self._results_length(1)
        with group.lock or _NO_LOCK:
            try:
                self._step_one(0, action)
            except Exception as exc:
                raise self._recover([(0, exc)], None) from None
        return self.ids.STEP_RESP, self._results_length(1)

    def _step_multi(self, body: memoryview) -> tuple[int, int]:
        multi = self.multi_request
        step_batch = self._step_batch_method()
        if self.num_envs != 8 and step_batch is None:
            raise RequestError(
                ErrorCode.BAD_BATCH,
                f"STEP_MULTI_REQ needs an 8-env server or one env with step_batch; this one has "
                f"{self.num_envs} envs",
            )
        self._expect_size(body, multi.size, "STEP_MULTI_REQ")
        actions = multi.view(body)[multi.ir.fields[0].name]
        if step_batch is not None:
            self._step_seats(step_batch, actions)
        else:
            self._step_all(actions)
        return self.ids.STEP_MULTI_RESP, self._results_length(8)

    def _step_batch_method(self) -> Callable[[np.ndarray], Sequence[StepOutput]] | None:
        """A 1-env server's ``env.step_batch``: STEP_MULTI then steps that one env (seed 000's
        self-play game: one action per seat, one result per seat)."""
        if self.num_envs != 1 or self.pool is not None:
            return None
        return getattr(self.group.envs[0], "step_batch", None)

    def _step_seats(
        self, step_batch: Callable[[np.ndarray], Sequence[StepOutput]], actions: np.ndarray
    ) -> None:
        group = self.group
        if self.autoreset != AutoReset.DISABLED:
            raise RequestError(
                ErrorCode.BAD_BATCH,
                "STEP_MULTI_REQ to an env with step_batch: the env's seats do not auto-reset "
                "(connect with autoreset disabled)",
            )
        if not group.all_reset or group.is_done(0):
            group.check_action(0, 0)  # NOT_RESET: before the first reset, or the game is over
        bad = (actions < 0) | (actions >= group.spaces.act_n)
        if bad.any():
            seat = int(np.argmax(bad))
            raise RequestError(
                ErrorCode.INVALID_ACTION,
                f"env 0: action {int(actions[seat])} of seat {seat} is outside "
                f"0..{group.spaces.act_n - 1}",
            )
        with group.lock or _NO_LOCK:
            try:
                outputs = step_batch(actions)
                if len(outputs) != len(actions):
                    raise ValueError(
                        f"step_batch returned {len(outputs)} results for {len(actions)} actions"
                    )
                for seat, output in enumerate(outputs):
                    self._write(seat, output)
            except Exception as exc:
                raise self._recover([(0, exc)], None) from None

    def _step_batch(self, body: memoryview) -> tuple[int, int]:
        size = self.step_request.size
        if body.nbytes != self.num_envs * size:
            raise RequestError(
                ErrorCode.BAD_BATCH,
                f"STEP_BATCH_REQ carries {body.nbytes // size if size else 0} actions "
                f"({body.nbytes} bytes); this server has {self.num_envs} envs",
            )
        self._step_all(self.step_request.view(body, count=self.num_envs)[self.action_name])
        return self.ids.STEP_BATCH_RESP, self._results_length(self.num_envs)

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
        workers: int = 0,
    ) -> None:
        if num_envs < 1:
            raise ValueError("num_envs must be at least 1")
        self.schema = schema
        self.num_envs = num_envs
        self.env_name = env_name
        self.server_lang = server_lang
        self.seed = seed
        if workers < 0:
            raise ValueError("workers must be 0 (in-process) or more")
        self.workers = workers  # > 0: each session's envs run in that many worker processes
        if not isinstance(env_or_factory, type) and isinstance(env_or_factory, Env):
            if num_envs != 1:
                raise ValueError("pass an env factory to serve more than one env")
            if workers:
                raise ValueError("pass an env factory to run envs in worker processes")
            self._shared: Env | None = env_or_factory
            self._factory: EnvFactory | None = None
            self._lock: threading.Lock | None = threading.Lock()
        else:
            self._shared, self._factory, self._lock = None, env_or_factory, None

    def __call__(self) -> Session:
        if self._factory is not None and self.workers:
            envs: list[Env] = []  # created in the worker processes
        elif self._factory is not None:
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
            factory=self._factory,
            workers=self.workers,
            num_envs=self.num_envs,
        )
