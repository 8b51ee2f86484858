"""Every env semantic, once: the rules all backends' servers follow (docs/protocol.md).

- ``Runner``: where a client's envs run (``LocalEnvs`` in this process, ``WorkerPool`` in
  worker processes) and the per-env auto-reset rule both share. A runner writes each env's
  result in place into a record view it was given (a row of a response buffer, an shm slot).
- ``EnvRuntime``: one client's envs as the protocol sees them: "reset first", episode ends,
  action range and mask checks, seeds (env i gets seed + i; the server's first seed), the three
  auto-reset modes, env-error recovery (reset, else recreate from the factory), ``step_batch``
  seats, OBSERVE. Refusals are ``RequestError`` (one ERROR response); backends never check.
``EnvHost`` (``transport.runtime.host``) builds them: it imports the runners, which import this
module, so this module never imports them back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import traceback
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from transport import native
from transport.codec import Schema, StructCodec
from transport.errors import REMOTE_TRACEBACK_MARKER, CodecError
from transport.protocol import AutoReset, ErrorCode, RequestError, body_codec
from transport.runtime.env import Spaces, StepOutput, awaited_text
from transport.schema.ir import INTEGER_RANGES, FieldIR

FATE_RESET = "the env was reset"
FATE_RECREATED = "the env was recreated"
FATE_FAILED = "the env could not be reset: send a reset"

log = logging.getLogger("transport.server")

ENV_ERROR_TEXT_MAX = 1024
"""Bytes of an ENV_ERROR text, message and trimmed traceback: the size of an shm slot's
error_text area (``transport.schema.compiler.ERROR_TEXT_SIZE``), the smallest carrier, so that
every backend delivers the same text."""
TRACEBACK_FRAMES = 4
_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
"""Frames of an env's traceback carried to the client: the last ones (the env's own code)."""

Failures = list[tuple[int, Exception]]
"""(env index, exception) of each env that raised; the other envs did their step."""

StepBatch = Callable[[np.ndarray], Sequence[StepOutput]]

_NEXT_STEP = AutoReset.NEXT_STEP
_SAME_STEP = AutoReset.SAME_STEP
"""The auto-reset modes the per-step paths compare with, as module names: on Python 3.11 each
``AutoReset.X`` lookup on the enum class costs ~50 ns, several times per step."""
_min_of = np.minimum.reduce  # whole-array reductions without ndarray.min's Python wrapper
_max_of = np.maximum.reduce

MASKED_ACTION_POLICIES = ("reject", "pass", "noop")
"""What a server does with an action its env's mask forbids (``serve(masked_actions=...)``):
``reject`` answers MASKED_ACTION; ``pass`` steps the env with it; ``noop`` does not step that env
and returns its previous result with the env's ``masked_action_penalty`` (default 0.0) as
reward."""
PENALTY_ATTRIBUTE = "masked_action_penalty"

EACH_CHECK_MAX = 16
"""Up to this many envs, a batch's Discrete actions are checked env by env (~0.2 us an env);
above it, vectorised (~6 us for any count up to a few hundred)."""


def check_masked_actions(policy: str) -> str:
    """``policy`` if it is one of ``MASKED_ACTION_POLICIES``; else a ValueError naming them."""
    if policy not in MASKED_ACTION_POLICIES:
        raise ValueError(
            f"masked_actions={policy!r}: expected one of {', '.join(MASKED_ACTION_POLICIES)}"
        )
    return policy


def penalty_of(env: Any, reward: FieldIR | None = None) -> float:
    """An env's ``masked_action_penalty`` (the reward of a ``noop`` masked action), else 0.0;
    with the schema's ``reward`` field, refused unless that field holds it exactly (an integer
    reward would turn -0.5 into 0)."""
    value = getattr(env, PENALTY_ATTRIBUTE, 0.0)
    try:
        penalty = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{PENALTY_ATTRIBUTE} must be a number, not {value!r}") from None
    if reward is not None and reward.elem in INTEGER_RANGES:
        lo, hi = INTEGER_RANGES[reward.elem]
        if not (penalty.is_integer() and lo <= penalty <= hi):
            raise ValueError(
                f"{PENALTY_ATTRIBUTE} = {value!r} does not fit the reward field "
                f"{reward.name!r} ({reward.elem}: whole numbers {lo}..{hi})"
            )
    return penalty


ACTION_CODES = {
    "i8": "b",
    "u8": "B",
    "i16": "h",
    "u16": "H",
    "i32": "i",
    "u32": "I",
    "i64": "q",
    "u64": "Q",
}
"""Action field types a server carries (one discrete action, an integer, per env) and their
``struct`` format codes."""


FLOAT_ACTION_TYPES = ("f32", "f64")
"""Element types of a Box action (an f32/f64 array); an integer array is MultiDiscrete."""


# -- action values -------------------------------------------------------------------------------


class ActionRule:
    """What one action may be, from the schema's action field (docs/schema.md, "Actions"):
    ``discrete`` (one integer, 0..act_n-1 from the env's spaces), ``multi_discrete`` (an
    integer array, each element in its declared low..high) or ``box`` (a float array, finite
    unless ``allow_nonfinite``, inside its declared low..high)."""

    def __init__(self, field: FieldIR | None) -> None:
        self.field = field
        if field is None or not field.is_array:
            self.kind = "discrete"
        else:
            self.kind = "box" if field.elem in FLOAT_ACTION_TYPES else "multi_discrete"
        self.dims: tuple[int, ...] = field.dims if field is not None and field.is_array else ()
        low = field.bound("low") if field is not None else None
        high = field.bound("high") if field is not None else None
        if self.kind == "multi_discrete" and low is None and field is not None:
            low = (0.0,) * field.count
        dtype = np.int64 if self.kind == "multi_discrete" else np.float64
        self.low = None if low is None else np.reshape(np.array(low, dtype=dtype), self.dims)
        self.high = None if high is None else np.reshape(np.array(high, dtype=dtype), self.dims)
        self.finite = not (field is not None and field.allow_nonfinite)
        # finite bounds on both sides refuse NaN and +-inf by themselves (comparisons with NaN
        # are false): the flat screen needs no isfinite pass then
        self._bounds_refuse_nonfinite = (
            self.low is not None
            and self.high is not None
            and bool(np.isfinite(self.low).all() and np.isfinite(self.high).all())
        )
        self._span = self._uniform_span()
        self._screened: tuple[Any, tuple[Any, int, int, int, int]] | None = None

    def _uniform_span(self) -> tuple[Any, Any] | None:
        """(low, high) when every element has the same bounds and no value may be NaN
        (Box without ``allow_nonfinite``, MultiDiscrete): ``accepts_all`` then needs only the
        batch's min and max. An infinite bound stands for "finite" (a Box refuses +-inf). The
        bounds stay NumPy scalars of their dtype: an f32 batch is compared in f64, as ``bad``
        compares it (a Python float would compare in f32 and pass 0.4f against 0.4)."""
        if self.kind == "discrete" or not self.finite:
            return None
        spans: list[Any] = []
        for bound, unbounded in ((self.low, -np.inf), (self.high, np.inf)):
            if bound is None:
                spans.append(np.float64(unbounded))
            elif bound.size and (bound == bound.flat[0]).all():
                spans.append(bound.flat[0])
            else:
                return None
        return spans[0], spans[1]

    def accepts_all(self, actions: np.ndarray) -> bool:
        """True when ``bad`` would refuse none of the array actions (Box, MultiDiscrete) of
        ``actions``: uniform bounds in one C pass over a Box batch with packed rows
        (``tp_screen_floats``) or with the batch's min and max, other bounds with whole-array
        reductions (~3 us for 8 x f32[6], where ``bad``'s per-env reductions take ~30). False
        says only that ``bad`` must name the envs (a NaN that ``allow_nonfinite`` lets through
        also lands there)."""
        span = self._span
        if span is not None and actions.size:  # a NaN min or max fails both comparisons
            low, high = span
            if self.kind == "box":
                rows = self._float_rows(actions)
                if rows is not None:
                    return bool(_screen_floats(*rows, low, high, low == -np.inf, high == np.inf))
            least, most = _min_of(actions, None), _max_of(actions, None)
            if low == -np.inf:
                if not least > low:
                    return False
            elif not least >= low:
                return False
            return bool(most < high) if high == np.inf else bool(most <= high)
        with np.errstate(invalid="ignore"):
            if self.kind == "box" and self.finite and not self._bounds_refuse_nonfinite:
                if not np.isfinite(actions).all():
                    return False
            if self.low is not None and not (actions >= self.low).all():
                return False
            return self.high is None or bool((actions <= self.high).all())

    def _float_rows(self, actions: np.ndarray) -> tuple[Any, int, int, int, int] | None:
        """(address, row stride, rows, floats per row, item size) of an (N, ...) f32/f64 batch
        whose rows are each contiguous (shm slots, packed rows) for ``tp_screen_floats``; None
        when it is not one. The last batch's is kept by a weak reference (a server hands the
        same slots' view every step)."""
        screened = self._screened
        if screened is not None and screened[0]() is actions:
            return screened[1]
        dtype = actions.dtype
        if dtype.kind != "f" or dtype.itemsize not in (4, 8) or not dtype.isnative:
            return None
        shape, strides = actions.shape, actions.strides
        expected = dtype.itemsize
        for d in range(len(shape) - 1, 0, -1):  # each row's elements packed in C order
            if shape[d] != 1 and strides[d] != expected:
                return None
            expected *= shape[d]
        rows = (
            native.ffi.cast("char *", actions.__array_interface__["data"][0]),
            int(strides[0]),
            int(shape[0]),
            int(actions.size // shape[0]),
            dtype.itemsize,
        )
        self._screened = (weakref.ref(actions), rows)
        return rows

    def bad(self, actions: np.ndarray, act_n: int) -> np.ndarray:
        """(N,) bool: the actions (N of them, each of ``dims``) this rule refuses."""
        if self.kind == "discrete":
            bad: np.ndarray = (actions < 0) | (actions >= act_n)
            return bad
        axes = tuple(range(1, actions.ndim))
        out = np.zeros(actions.shape[0], dtype=bool)
        if self.kind == "box":
            values = actions.astype(np.float64)
            if self.finite:
                out |= ~np.isfinite(values).all(axis=axes)
            else:
                values = np.nan_to_num(values, nan=0.0, posinf=np.inf, neginf=-np.inf)
        else:
            values = actions
        with np.errstate(invalid="ignore"):
            if self.low is not None:
                out |= (values < self.low).any(axis=axes)
            if self.high is not None:
                out |= (values > self.high).any(axis=axes)
        return out

    def describe(self, action: Any, act_n: int) -> str:
        """Why ``action`` is refused, for the INVALID_ACTION text."""
        if self.kind == "discrete":
            return f"action {action} is outside 0..{act_n - 1}"
        low = "-inf" if self.low is None else _numbers(self.low)
        high = "inf" if self.high is None else _numbers(self.high)
        finite = " and finite" if self.kind == "box" and self.finite else ""
        if finite:  # NaN or +-inf that the bounds alone let through (none declared, or -inf
            # under a high only): "not finite", not "not inside -inf..inf"
            values = np.asarray(action, dtype=np.float64)
            with np.errstate(invalid="ignore"):  # NaN is inside no declared bound
                inside = (self.low is None or bool((values >= self.low).all())) and (
                    self.high is None or bool((values <= self.high).all())
                )
            if inside and not np.isfinite(values).all():
                return f"action {_numbers(action)} is not finite"
        return f"action {_numbers(action)} is not inside {low}..{high}{finite}"


def _numbers(values: Any) -> str:
    """``[1, 0.5, NaN]``: numbers as JavaScript's String() writes them (the Node texts match)."""
    texts = []
    for v in np.asarray(values, dtype=np.float64).flat:
        x = float(v)
        if x != x:
            texts.append("NaN")
        elif x in (np.inf, -np.inf):
            texts.append("Infinity" if x > 0 else "-Infinity")
        else:
            texts.append(str(int(x)) if x.is_integer() else repr(x))
    return "[" + ", ".join(texts) + "]"


def step_before_reset(index: int) -> RequestError:
    """The NOT_RESET of a step of env ``index`` before its first reset (the runtime's check,
    and the shm client's at SEND: ``async_batches.check_reset_sent``)."""
    return RequestError(ErrorCode.NOT_RESET, f"env {index}: step before the first reset")


def check_action_value(rule: ActionRule, index: int, action: Any, act_n: int) -> None:
    """One env's action against its type's rule: INVALID_ACTION (naming the env) when refused."""
    if rule.kind == "discrete":
        if not 0 <= action < act_n:
            raise RequestError(
                ErrorCode.INVALID_ACTION, f"env {index}: {rule.describe(action, act_n)}"
            )
        return
    values = np.asarray(action)
    if values.shape != rule.dims:
        raise RequestError(
            ErrorCode.INVALID_ACTION,
            f"env {index}: action of shape {values.shape}; the schema's is {rule.dims}",
        )
    if rule.bad(values[np.newaxis], act_n)[0]:
        raise RequestError(ErrorCode.INVALID_ACTION, f"env {index}: {rule.describe(action, act_n)}")


def action_values(actions: np.ndarray) -> list[Any]:
    """Each env's action as its env's ``step`` receives it, from an (N, *action_shape) array of
    the action field's dtype: a Python int (Discrete), else an owned array of the action's
    shape and dtype (Box, MultiDiscrete: the env may keep it). The one rule of every runner
    (in this process and in a worker pool's processes)."""
    return actions.tolist() if actions.ndim == 1 else [a.copy() for a in actions]


def action_dtype(schema: Schema) -> np.dtype[Any]:
    """One action's NumPy dtype: the STEP_REQ action field's (a subarray dtype for an array
    action; ``<i8`` when the body has no action field)."""
    request = body_codec(schema, "STEP_REQ")
    action = request.ir.role("action")
    return request.dtype[action.name] if action is not None else np.dtype("<i8")


def describe(exc: BaseException) -> str:
    """An exception as one line: ``ValueError: text``."""
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def remote_traceback(exc: BaseException) -> str:
    """The last ``TRACEBACK_FRAMES`` frames of ``exc``'s traceback and its one-line form, as the
    client shows them after the message ("" for an exception without a traceback)."""
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith(_RUNTIME_DIR)  # the runtime's frames say nothing
    ][-TRACEBACK_FRAMES:]
    if not frames:
        return ""
    return "".join(traceback.format_list(frames)) + describe(exc)


def with_traceback(message: str, trace: str, limit: int = ENV_ERROR_TEXT_MAX) -> str:
    """``message``, then the marker and ``trace`` cut from the front (whole lines, the last frames
    kept) so the whole text is at most ``limit`` bytes of UTF-8; the message alone when there is
    no room for a useful part of the trace."""
    if not trace:
        return message
    room = limit - len(message.encode()) - len(REMOTE_TRACEBACK_MARKER.encode())
    data = trace.encode()
    if len(data) > room:
        elided = b"  ...\n"
        data = data[len(data) - (room - len(elided)) :] if room > 2 * len(elided) else b""
        cut = data.find(b"\n")
        data = elided + data[cut + 1 :] if cut >= 0 else b""
        if len(data) <= len(elided):
            return message
    return message + REMOTE_TRACEBACK_MARKER + data.decode("utf-8", "ignore")


def records_of(rows: np.ndarray) -> list[np.ndarray]:
    """One 0-d record view per row of an (N,) record array (any row stride)."""
    return [rows[i, ...] for i in range(rows.shape[0])]


def ended_rows(
    rows: Sequence[np.ndarray], mask: Callable[[], np.ndarray | None]
) -> np.ndarray | None:
    """``mask()`` (the (N,) bool of envs whose episode ended) when any of the end columns
    ``rows`` ((N,) each) is set, else None without building it."""
    for column in rows:
        if np.count_nonzero(column):
            return mask()
    return None


# -- native screens (issue 24: a batch's whole-array checks in one C pass each) ------------------

_screen_actions = native.lib.tp_screen_actions
_screen_floats = native.lib.tp_screen_floats
_strided_any = native.lib.tp_strided_any
_NO_MASK = native.ffi.NULL


class NativeColumn:
    """A 1-d integer or bool ndarray (native byte order, any row stride: shm slots, packed rows)
    as the native screens read it: the address of its first item, its stride, item size and
    signedness. ``array`` holds the array (the memory stays mapped while the address is in
    use), unless it was made with ``keep=False``: its user then checks that the array lives."""

    __slots__ = ("array", "count", "itemsize", "ptr", "signed", "stride")

    def __init__(self, array: np.ndarray, keep: bool = True) -> None:
        self.array: np.ndarray | None = array if keep else None
        self.ptr = native.ffi.cast("char *", array.__array_interface__["data"][0])
        self.stride = int(array.strides[0])
        self.itemsize = array.dtype.itemsize
        self.signed = 1 if array.dtype.kind == "i" else 0
        self.count = int(array.shape[0])

    @staticmethod
    def of(array: Any, kinds: str = "biu", keep: bool = True) -> NativeColumn | None:
        """The column's native view, or None when the screens cannot read it (NumPy does)."""
        if (
            not isinstance(array, np.ndarray)
            or array.ndim != 1
            or array.shape[0] == 0
            or array.dtype.kind not in kinds
            or not array.dtype.isnative
            or array.dtype.itemsize not in (1, 2, 4, 8)
        ):
            return None
        return NativeColumn(array, keep)

    def any(self) -> bool:
        """True when some item is not 0 (``np.count_nonzero(array) > 0``), in one C pass."""
        return bool(_strided_any(self.ptr, self.stride, self.itemsize, self.count))


def native_columns(columns: Sequence[Any]) -> list[NativeColumn] | None:
    """Every column's native view, or None when one of them has none (NumPy reads them all)."""
    out = []
    for column in columns:
        view = NativeColumn.of(column)
        if view is None:
            return None
        out.append(view)
    return out


def _native_mask_rows(masks: Any) -> tuple[Any, int] | None:
    """(address of row 0, row stride) of an (R, W) byte mask (one byte per entry, unit column
    stride, any row stride) for ``tp_screen_actions``; None when it is not one."""
    if (
        not isinstance(masks, np.ndarray)
        or masks.ndim != 2
        or masks.shape[0] == 0
        or masks.dtype.itemsize != 1
        or masks.dtype.kind not in "bu"
        or masks.strides[1] != 1
    ):
        return None
    return native.ffi.cast("char *", masks.__array_interface__["data"][0]), int(masks.strides[0])


def _item_reader(column: np.ndarray) -> Any:
    """A 1-d integer or bool column as a memoryview (``view[i]``: a Python int or bool, same
    truth as the NumPy scalar), else the column itself."""
    if column.ndim == 1 and column.dtype.kind in "biu" and column.dtype.isnative:
        try:
            return memoryview(column)  # type: ignore[arg-type]
        except (TypeError, ValueError, BufferError):
            pass
    return column


def _flat_rows(rows: np.ndarray | None, n: int) -> tuple[np.ndarray | None, np.ndarray]:
    """An (R, W) byte array with unit column stride (mask rows, any row stride) as (one flat
    uint8 view from its first byte to the end of row n-1, each row's start in it), so that
    ``flat[starts + column]`` gathers one entry per row; (None, empty) when it is not one."""
    empty = np.zeros(0, dtype=np.intp)
    if (
        rows is None
        or not isinstance(rows, np.ndarray)
        or rows.ndim != 2
        or rows.dtype.itemsize != 1
        or rows.strides[1] != 1
        or n < 1
        or rows.shape[0] < n
        or rows.strides[0] < rows.shape[1]
    ):
        return None, empty
    width, stride = rows.shape[1], rows.strides[0]
    flat = np.lib.stride_tricks.as_strided(
        rows[0].view(np.uint8), shape=((n - 1) * stride + width,), strides=(1,), writeable=False
    )
    return flat, np.arange(n, dtype=np.intp) * stride


# -- runners -------------------------------------------------------------------------------------


class Runner:
    """Where a client's ``num_envs`` envs run; results land in ``results`` (an (R,) record array
    with the codec's field names, R >= num_envs: the extra rows are step_batch seats).

    A subclass provides the per-env operations; the auto-reset rule (``step_one``) and the loops
    over envs are here, once. ``finals[i]`` receives env i's SAME_STEP final result.
    """

    def __init__(
        self,
        codec: StructCodec,
        results: np.ndarray,
        finals: np.ndarray | None,
        num_envs: int,
        *,
        base: int = 0,
    ) -> None:
        self.codec = codec
        self.results = results
        # one writable 0-d record per env; none for column records (an shm column region a
        # vector env writes field by field: per-env records of it are copies)
        self.records = records_of(results) if isinstance(results, np.ndarray) else []
        self.finals = finals
        self.final_records = records_of(finals) if finals is not None else []
        self.num_envs = num_envs
        self.base = base  # numbers the envs in error texts (a worker's first env)
        self._ends = tuple(f.name for f in codec.ir.episode_end_fields())
        self._end_columns = [results[name] for name in self._ends]  # (R,) views: is_done
        self._end_rows = [column[:num_envs] for column in self._end_columns]  # (N,): ended()
        self._end_native = native_columns(self._end_rows) if num_envs else None
        # the end columns as per-item readers for the per-env loops: a memoryview item read is
        # ~3x cheaper than a NumPy scalar read (integer and bool columns; else the column)
        self._end_items: list[Any] = [_item_reader(column) for column in self._end_columns]

    # -- what a runner provides ------------------------------------------------------------

    def spaces(self) -> Spaces:
        raise NotImplementedError

    def reset_one(self, index: int, seed: int | None) -> None:
        """Reset env ``index``; its result is in ``records[index]``."""
        raise NotImplementedError

    def step_env(self, index: int, action: int) -> None:
        """Step env ``index`` once (no auto-reset); its result is in ``records[index]``."""
        raise NotImplementedError

    def restore(self, index: int, seed: int | None) -> tuple[str, bool]:
        """After env ``index`` raised: reset it, else recreate it. (fate text, ok)."""
        raise NotImplementedError

    def observe_one(self, index: int) -> dict[str, Any]:
        """Rewrite env ``index``'s result from ``env.observe()`` (if it has one); its info map."""
        raise NotImplementedError

    def step_batch(self) -> StepBatch | None:
        """The env's ``step_batch`` (a 1-env runner in this process), else None."""
        return None

    def write(self, index: int, output: StepOutput | None) -> None:
        """Put an env's output into row ``index`` (None: the env wrote it in place)."""
        raise NotImplementedError

    def close(self) -> None:
        """Drop the envs (and stop what runs them)."""

    # -- the rules every runner shares -----------------------------------------------------

    def is_done(self, index: int) -> bool:
        for column in self._end_columns:  # a loop, not any(<generator>): ~100 ns less a step
            if column[index]:
                return True
        return False

    def step_one(self, index: int, action: int, mode: AutoReset) -> bool:
        """Step env ``index`` under the auto-reset ``mode``; True when a final result was kept.

        NEXT_STEP: an env whose last result ended its episode is reset instead (the action is
        ignored). SAME_STEP: the step that ends an episode keeps its result in ``finals[i]`` and
        resets the env at once (the reset result is the step's result).
        """
        if mode == _NEXT_STEP and self.is_done(index):
            self.reset_one(index, None)
            return False
        self.step_env(index, action)
        if mode == _SAME_STEP and self.is_done(index):
            self.final_records[index][...] = self.records[index]
            self.reset_one(index, None)
            return True
        return False

    def reset(self, seeds: Sequence[int | None]) -> Failures:
        """Reset every env (env i with ``seeds[i]``); an env that raises does not stop the rest."""
        failures: Failures = []
        for i in range(self.num_envs):
            try:
                self.reset_one(i, seeds[i])
            except Exception as exc:
                failures.append((i, exc))
        return failures

    def done_rows(self) -> np.ndarray | None:
        """(N,) bool, owned: the envs whose result ends an episode (None: no end fields)."""
        columns = self._end_columns
        if not columns:
            return None
        n = self.num_envs
        done = columns[0][:n].astype(bool)
        for column in columns[1:]:
            np.logical_or(done, column[:n], out=done)
        return done

    def ended(self) -> np.ndarray | None:
        """``done_rows()`` when some env's result ends an episode, else None: the common case
        (no env ended) costs one C pass (else one ``count_nonzero``) per end field."""
        columns = self._end_native
        if columns is None:
            return ended_rows(self._end_rows, self.done_rows)
        for column in columns:
            if column.any():
                return self.done_rows()
        return None

    def step(
        self, actions: Sequence[int] | np.ndarray, mode: AutoReset
    ) -> tuple[list[int], Failures]:
        """Step every env; (envs whose final result was kept, failures)."""
        return self.step_except(actions, mode, None)

    def step_except(
        self, actions: Sequence[int] | np.ndarray, mode: AutoReset, skip: np.ndarray | None
    ) -> tuple[list[int], Failures]:
        """Step every env but those ``skip`` marks (a bool per env: masked ``noop`` actions);
        (envs whose final result was kept, failures). Runners in this process only.

        Envs are called in env order, as gymnasium's SyncVectorEnv calls them (envs that share
        state, e.g. one space's RNG, give the same results). DISABLED and NEXT_STEP are
        vectorised (issue 24): the envs NEXT_STEP resets instead of stepping are one NumPy mask
        over the result rows, and the envs between two of them are called in one tight loop
        (``step_many``). SAME_STEP resets an env right after the step that ended it, before
        the next env steps: env by env (``step_one``)."""
        n = self.num_envs
        values: Sequence[Any]
        if isinstance(actions, np.ndarray):
            values = action_values(actions[:n])
        else:
            values = actions
        failures: Failures = []
        if mode == _SAME_STEP:
            ids = None if skip is None else np.flatnonzero(~skip[:n]).tolist()
            return self.step_same(ids, values, failures), failures
        resetting: list[int] = []
        if mode == _NEXT_STEP:
            done = self.ended()
            if done is not None:
                resetting = np.flatnonzero(done).tolist()
                skip = done if skip is None else skip[:n] | done
        if not resetting:
            ids = None if skip is None else np.flatnonzero(~skip[:n]).tolist()
            self.step_many(ids, values, failures)
            return [], failures
        stepped = np.flatnonzero(~skip[:n])  # type: ignore[index]
        cuts = np.searchsorted(stepped, resetting).tolist()
        first = 0
        for index, cut in zip(resetting, cuts, strict=True):
            if cut > first:
                self.step_many(stepped[first:cut].tolist(), values, failures)
            first = cut
            try:
                self.reset_one(index, None)
            except Exception as exc:
                failures.append((index, exc))
        if first < stepped.size:
            self.step_many(stepped[first:].tolist(), values, failures)
        if len(failures) > 1:
            failures.sort(key=lambda failure: failure[0])
        return [], failures

    def keep_finals(self, done: np.ndarray) -> list[int]:
        """SAME_STEP: copy the rows ``done`` marks into ``finals`` (one vectorised copy); the
        env indices."""
        ids = np.flatnonzero(done)
        if self.finals is not None:
            if ids.size == 1 and self.records:
                i = int(ids[0])
                self.final_records[i][...] = self.records[i]
            else:
                self.finals[ids] = self.results[ids]
        return ids.tolist()

    def step_many(self, ids: list[int] | None, values: Sequence[Any], failures: Failures) -> None:
        """Step envs ``ids`` (None: every env) once, no auto-reset, env i with ``values[i]``;
        each env that raises is added to ``failures`` and the others still step."""
        for i in range(self.num_envs) if ids is None else ids:
            try:
                self.step_env(i, values[i])
            except Exception as exc:
                failures.append((i, exc))

    def step_same(
        self, ids: list[int] | None, values: Sequence[Any], failures: Failures
    ) -> list[int]:
        """SAME_STEP: step envs ``ids`` (None: every env) in env order, each one's final
        result kept and the env reset right after the step that ended it (``step_one``); the
        envs whose final result was kept. Each env that raises is added to ``failures``."""
        ended: list[int] = []
        step_one = self.step_one
        for i in range(self.num_envs) if ids is None else ids:
            try:
                if step_one(i, values[i], _SAME_STEP):
                    ended.append(i)
            except Exception as exc:  # the other envs still step
                failures.append((i, exc))
        return ended

    def submit(self, ids: Sequence[int], actions: Sequence[Any], mode: AutoReset) -> None:
        """Asynchronous batches: start stepping envs ``ids``; ``poll`` reports each as it ends.
        In this process the envs step now, in order (a worker pool steps them concurrently)."""
        done = self.__dict__.setdefault("_completed", [])
        for i, action in zip(ids, actions, strict=True):
            try:
                done.append((i, self.step_one(i, action, mode), None))
            except Exception as exc:  # the other envs still step
                done.append((i, False, exc))

    def poll(self, want: int) -> list[tuple[int, bool, Exception | None]]:
        """At least ``want`` submitted envs that finished (env, final result kept, failure),
        waiting for them; never more than were submitted."""
        done: list[tuple[int, bool, Exception | None]] = self.__dict__.setdefault("_completed", [])
        taken = done[:want]
        del done[:want]
        return taken

    concurrent = False
    """True when submitted envs run while the caller goes on (a worker pool): a server then
    publishes each as ``poll_ready`` reports it, while it keeps reading requests."""

    def completion_word(self) -> tuple[Any, int]:
        """A concurrent runner's word that changes when a submitted env finishes, and its value
        now, armed so that the next finish wakes a FUTEX_WAIT on it (a server waits on it with
        its own doorbell)."""
        raise NotImplementedError

    def poll_ready(self, check_workers: bool = False) -> list[tuple[int, bool, Exception | None]]:
        """Every submitted env that finished by now, without waiting (``check_workers``: also
        fail the envs of workers that died)."""
        done: list[tuple[int, bool, Exception | None]] = self.__dict__.setdefault("_completed", [])
        taken = done[:]
        del done[:]
        return taken

    def observe(self) -> tuple[list[dict[str, Any]], Failures]:
        """Every env's current result and info map (no step, no auto-reset)."""
        infos: list[dict[str, Any]] = []
        failures: Failures = []
        for i in range(self.num_envs):
            try:
                infos.append(self.observe_one(i))
            except Exception as exc:
                infos.append({})
                failures.append((i, exc))
        return infos, failures


# -- the runtime ---------------------------------------------------------------------------------


class EnvRuntime:
    """One client's envs under the protocol's rules (see the module docstring).

    Every method raises ``RequestError`` for a refusal; env exceptions are recovered from here
    (the env is reset or recreated) and answered as one ENV_ERROR naming each env that failed.
    """

    def __init__(
        self,
        runner: Runner,
        *,
        seats: int,
        first_seed: int | None = None,
        lock: threading.Lock | None = None,
        masked_actions: str = "reject",
        penalties: Sequence[float] | None = None,
        action: FieldIR | None = None,
    ) -> None:
        """``action``: the schema's action field (None: one integer, Discrete)."""
        self.runner = runner
        self.masked_actions = check_masked_actions(masked_actions)
        self.penalties = [0.0] * runner.num_envs if penalties is None else list(penalties)
        self.num_envs = runner.num_envs
        self.seats = seats
        self.first_seed = first_seed  # the seed of the first unseeded reset (env i: seed + i)
        self._lock: contextlib.AbstractContextManager[Any] = lock or contextlib.nullcontext()
        self._env_lock = lock  # step_one takes it only if there is one (a with costs ~100 ns)
        self.autoreset = AutoReset.DISABLED
        self.spaces = runner.spaces()
        self._act_n = self.spaces.act_n
        codec, results = runner.codec, runner.results
        mask = codec.ir.role("action_mask")
        self.action_rule = ActionRule(action)
        self._discrete = self.action_rule.kind == "discrete"  # the hot path's common case
        self._action_batch = (runner.num_envs, *self.action_rule.dims)  # N array actions
        self._env_index = np.arange(runner.num_envs)
        # the mask is over Discrete actions; an array action has none
        if mask is None or self.action_rule.kind != "discrete":
            mask = None
        self.masks = results[mask.name] if mask else None  # (R, mask_len) view of the results
        reward = codec.ir.role("reward")
        self.rewards = results[reward.name] if reward else None  # (R,) view: noop penalties
        self._mask_width = 0 if self.masks is None else self.masks.shape[1]
        self.ends = [results[f.name] for f in codec.ir.episode_end_fields()]
        self._end_rows = [end[: self.num_envs] for end in self.ends]
        # check_actions' screen: each env's mask entry for its action as one gather from a flat
        # byte view of the mask rows (one index array: ~2x cheaper than masks[env, action])
        self._mask_flat, self._mask_at = _flat_rows(self.masks, self.num_envs)
        # the same screen in one C pass (tp_screen_actions): the mask rows' address, the end
        # columns' native views, and the last actions array's (kept by a weak reference: a
        # server hands the same slots' view every step; a caller's own array is not kept alive)
        self._mask_native = _native_mask_rows(self.masks)
        self._ends_native = native_columns(self._end_rows) if self.num_envs else None
        self._screened: tuple[Any, NativeColumn] | None = None
        self._unsigned: dict[np.dtype[Any], np.dtype[Any]] = {}
        self.was_reset = np.zeros(self.num_envs, dtype=bool)
        self.all_reset = False
        self.watchdog: ProgressWatchdog | None = None  # decision-boundary runs (host.runtime)
        self._no_seeds: list[int | None] = [None] * self.num_envs

    # -- state -------------------------------------------------------------------------------

    def mark_reset(self, index: int) -> None:
        if self.watchdog is not None:
            self.watchdog.reset(index)
        self.was_reset[index] = True
        self.all_reset = bool(self.was_reset.all())

    def mark_all_reset(self, failed: Sequence[int] = ()) -> None:
        """``mark_reset`` for every env but ``failed`` (vectorised: one reset of N envs)."""
        ok = np.ones(self.num_envs, dtype=bool)
        if failed:
            ok[list(failed)] = False
        if self.watchdog is not None:
            self.watchdog.requests[: self.num_envs][ok] = 0
            self.watchdog.zeros[: self.num_envs][ok] = 0
        self.was_reset |= ok
        self.all_reset = bool(self.was_reset.all())

    def forget_resets(self) -> None:
        """A fresh session on the same envs (a second HELLO on a connection, docs/protocol.md
        "Session"): every env is NOT_RESET until the client resets it (Node: ``forgetResets``)."""
        self.was_reset[:] = False
        self.all_reset = False

    def mark_lost(self, index: int) -> None:
        """Env ``index`` has no valid state: every step is NOT_RESET until a reset succeeds."""
        self.was_reset[index] = False
        self.all_reset = False

    def is_done(self, index: int) -> bool:
        for end in self.ends:  # a loop, not any(<generator>): ~100 ns less a step
            if end[index]:
                return True
        return False

    def done_mask(self) -> np.ndarray | None:
        """(N,) bool: the envs whose episode ended (None when the result has no end fields)."""
        if not self.ends:
            return None
        n = self.num_envs
        done = self.ends[0][:n].astype(bool)
        for end in self.ends[1:]:
            done |= end[:n].astype(bool)
        return done

    def _all_may_step(self, skip_done: bool) -> bool:
        """Every env has a state and, unless ``skip_done`` (NEXT_STEP ignores a done env's
        action: envs that end often, like EnvPool's, still pass), an episode that goes on."""
        if not self.all_reset:
            return False
        if not skip_done:
            ends = self._ends_native
            if ends is not None:
                for column in ends:
                    if column.any():
                        return False
            else:
                for end in self._end_rows:
                    if np.count_nonzero(end):
                        return False
        return True

    def _accepts_all_arrays(self, actions: np.ndarray, skip_done: bool) -> bool:
        """``check_actions``' screen for array actions (Box, MultiDiscrete; no masks): True
        when every env may step and every action has the schema's shape and passes
        ``ActionRule.accepts_all`` (min and max of the batch for uniform bounds: ~3 us for
        8 x f32[6], where the full check takes ~20); False sends the batch through the full
        check, which names the first bad env."""
        return (
            actions.shape == self._action_batch
            and self._all_may_step(skip_done)
            and self.action_rule.accepts_all(actions)
        )

    def _accepts_all(self, actions: np.ndarray, skip_done: bool = False) -> bool:
        """``check_actions``' screen for its common case: True when every env has a state and
        an episode that goes on (or, with ``skip_done``, any episode: a done env's action is
        ignored) and every Discrete action is in range and not masked (nothing to refuse, no
        ``noop``), in ~5 whole-array operations instead of ~15; False sends the batch through
        the full check, which finds the first bad env."""
        if not self._all_may_step(skip_done):
            return False
        screened = self._screen_native(actions)
        if screened is not None:
            return screened
        kind = actions.dtype.kind
        if kind == "i":  # negative values read as unsigned are huge: one max checks both ends
            unsigned = self._unsigned.get(actions.dtype)
            if unsigned is None:
                unsigned = self._unsigned[actions.dtype] = np.dtype(
                    actions.dtype.str.replace("i", "u")
                )
            values = actions.view(unsigned)
        elif kind == "u" and actions.dtype.itemsize < 8:  # u64 + intp offsets: float64
            values = actions
        else:
            return False
        if int(values.max()) >= self._act_n:
            return False
        if self.masks is None or self.masked_actions == "pass":
            return True
        if self._mask_width < self._act_n:
            return False  # actions past the mask: the full check says which are masked
        flat = self._mask_flat
        if flat is not None:
            taken = flat[self._mask_at + actions]
        else:
            taken = self.masks[self._env_index, actions]
        return int(np.count_nonzero(taken)) == self.num_envs

    def _screen_native(self, actions: np.ndarray) -> bool | None:
        """``_accepts_all``'s range and mask screen of (N,) integer actions in one C pass
        (``tp_screen_actions``); None when the actions or the masks are not what it reads
        (the NumPy screen then runs)."""
        screened = self._screened
        if screened is not None and screened[0]() is actions:
            column = screened[1]
        else:
            view = NativeColumn.of(actions, "iu", keep=False)
            if view is None or view.count != self.num_envs:
                return None
            self._screened = (weakref.ref(actions), view)
            column = view
        if self.masks is None or self.masked_actions == "pass":
            mask, mask_stride = _NO_MASK, 0
        elif self._mask_width < self._act_n:
            return False  # actions past the mask: the full check says which are masked
        elif self._mask_native is None:
            return None
        else:
            mask, mask_stride = self._mask_native
        return bool(
            _screen_actions(
                column.ptr,
                column.stride,
                column.itemsize,
                column.signed,
                column.count,
                self._act_n,
                mask,
                mask_stride,
            )
        )

    def accepts_array_subset(self, ids: list[int], actions: np.ndarray) -> bool:
        """The screen of array actions (Box, MultiDiscrete) for envs ``ids`` (an asynchronous
        SEND): True when nothing can be refused or become a noop (every env reset, none done,
        no masks, each action of the schema's shape and inside its bounds, in one vectorised
        ``ActionRule.bad``), so the per-env checks can be skipped (a NumPy call each: ~35 us per
        env of a MuJoCo SEND). False: the per-env checks find and name the refused env."""
        rule = self.action_rule
        if rule.kind == "discrete" or self.masks is not None or not self.all_reset:
            return False
        if actions.ndim != 1 + len(rule.dims) or actions.shape[1:] != rule.dims:
            return False
        for i in ids:
            if self.is_done(i):
                return False
        return rule.accepts_all(actions)

    def set_autoreset(self, mode: int) -> AutoReset:
        """The client's auto-reset mode (HELLO flags, or the shm HELLO command)."""
        try:
            self.autoreset = AutoReset(mode)
        except ValueError:
            raise RequestError(ErrorCode.BAD_FRAME, f"unknown auto-reset mode {mode}") from None
        return self.autoreset

    # -- checks ------------------------------------------------------------------------------

    def check_action(self, index: int, action: Any) -> bool:
        """Refuse a bad action (RequestError); True when it is masked out and the policy is
        ``noop`` (the env must not step)."""
        return self._check_action(index, action, self.is_done(index))

    def _check_action(self, index: int, action: Any, done: bool) -> bool:
        """``check_action`` given ``done`` (env ``index``'s episode ended), which a step has
        already read."""
        if not self.all_reset and not self.was_reset[index]:
            raise step_before_reset(index)
        if done:
            raise RequestError(ErrorCode.NOT_RESET, f"env {index}: episode is done; reset first")
        if self._discrete:  # check_action_value's first case, inline (each step)
            if not 0 <= action < self._act_n:
                check_action_value(self.action_rule, index, action, self._act_n)
        else:
            check_action_value(self.action_rule, index, action, self._act_n)
        masks = self.masks
        if masks is not None and action < self._mask_width and not masks[index, action]:
            if self.masked_actions == "reject":
                raise RequestError(
                    ErrorCode.MASKED_ACTION, f"env {index}: action {action} is masked out"
                )
            return self.masked_actions == "noop"
        return False

    def check_actions(self, actions: np.ndarray, *, skip_done: bool = False) -> np.ndarray | None:
        """The same checks for one action per env, vectorised; reports the first bad env.
        Returns the envs (bool per env) whose masked action the ``noop`` policy turns into no
        step, or None when there are none.

        ``skip_done``: envs whose episode is done are not checked (NEXT_STEP ignores their
        action).
        """
        n = self.num_envs
        if n <= EACH_CHECK_MAX and self._discrete:
            return self._check_each(actions, skip_done)
        if len(actions) != n:
            actions = actions[:n]
        if self._discrete:
            if actions.shape == (n,) and self._accepts_all(actions, skip_done):
                return None
        elif self._accepts_all_arrays(actions, skip_done):
            return None
        bad = ~self.was_reset if not self.all_reset else None
        done = self.done_mask()
        any_done = done is not None and bool(done.any())
        if any_done and not skip_done:
            bad = done if bad is None else bad | done
        act_n = self._act_n
        masks = self.masks
        if self._discrete:  # ActionRule.bad's first case, inline (each step)
            if actions.dtype.kind == "u":
                bad_range = actions >= act_n
            else:
                bad_range = (actions < 0) | (actions >= act_n)
        elif self.action_rule.accepts_all(actions):
            bad_range = np.zeros(len(actions), dtype=bool)
        else:
            bad_range = self.action_rule.bad(actions, act_n)
        noop: np.ndarray | None = None
        if masks is not None:
            width = masks.shape[1]
            if width >= act_n and not bad_range.any():  # every action indexes the mask
                masked = masks[self._env_index, actions] == 0
            else:
                inside = np.minimum(np.maximum(actions, 0), width - 1)
                masked = masks[self._env_index, inside] == 0
                if width < act_n:  # actions past the mask are not masked
                    masked &= actions < width
            if self.masked_actions == "reject":
                bad_range |= masked
            elif self.masked_actions == "noop" and masked.any():
                noop = masked & ~bad_range
                if any_done and skip_done:
                    noop &= ~done  # type: ignore[operator]
        if any_done and skip_done:
            bad_range &= ~done  # type: ignore[operator]
        if (bad is not None and bad.any()) or bad_range.any():
            first = bad_range if bad is None else bad | bad_range
            index = int(np.argmax(first))
            action = actions[index]
            self.check_action(index, int(action) if action.ndim == 0 else action)
        return noop if noop is not None and noop.any() else None

    def _check_each(self, actions: np.ndarray, skip_done: bool) -> np.ndarray | None:
        """``check_actions`` env by env with the one-env rule (``_check_action``): a few
        Discrete actions are checked faster one by one in Python than by NumPy's dozen
        whole-array operations."""
        noop: np.ndarray | None = None
        for index, action in enumerate(actions[: self.num_envs].tolist()):
            done = self.is_done(index)
            if done and skip_done:  # ignored, unless the env has no state (lost, never reset)
                if not self.all_reset and not self.was_reset[index]:
                    self._check_action(index, action, done)  # NOT_RESET
                continue
            if self._check_action(index, action, done):
                if noop is None:
                    noop = np.zeros(self.num_envs, dtype=bool)
                noop[index] = True
        return noop

    def _noop(self, index: int) -> None:
        """A masked action under ``noop``: env ``index`` keeps its previous result (not done: a
        done env is refused or reset before this) with its penalty as reward."""
        if self.rewards is not None:
            self.rewards[index] = self.penalties[index]

    # -- requests ----------------------------------------------------------------------------

    def reset(self, seeds: Sequence[int | None] | None = None) -> None:
        """Reset every env (env i with ``seeds[i]``). Before any env was reset, an unseeded env
        i gets the server's first seed + i."""
        seeds = self._no_seeds if seeds is None else seeds
        first = self.first_seed
        if first is not None and not self.was_reset.any():
            seeds = [first + i if s is None else s for i, s in enumerate(seeds)]
        with self._lock:
            failures = self.runner.reset(seeds)
            self.mark_all_reset([i for i, _ in failures])
            if failures:
                raise self._recover(failures, seeds, lambda i: _seeded("RESET", seeds[i]))

    def reset_seed(self, seed: int) -> None:
        """Reset every env; env i gets ``seed + i``."""
        self.reset([seed + i for i in range(self.num_envs)])

    def reset_one(self, index: int, seed: int | None) -> None:
        """Reset env ``index`` alone (an shm slot's RESET)."""
        with self._lock:
            try:
                self.runner.reset_one(index, seed)
            except Exception as exc:
                seeds: list[int | None] = [None] * self.num_envs
                seeds[index] = seed
                raise self._recover_one(index, exc, seeds, _seeded("RESET", seed)) from None
            self.mark_reset(index)

    def step_one(self, index: int, action: Any) -> bool:
        """Step env ``index`` alone; True when SAME_STEP kept its final result.

        The per-step path of a batch-1 server (shm, streams): ``done`` is read once, the lock is
        taken only when there is one (a shared env), the modes are module names."""
        mode = self.autoreset
        done = self.is_done(index)
        # NEXT_STEP resets a done env, its action ignored (reset once in this session: else
        # NOT_RESET)
        reset = done and mode == _NEXT_STEP and (self.all_reset or bool(self.was_reset[index]))
        if not reset and self._check_action(index, action, done):
            self._noop(index)
            return False
        lock = self._env_lock
        if lock is not None:
            lock.acquire()
        try:
            try:
                ended = self.runner.step_one(index, action, mode)
            except Exception as exc:
                request = f"STEP action {_action_text(action)}"
                raise self._recover_one(index, exc, None, request) from None
            watchdog = self.watchdog
            if watchdog is not None:
                skip = np.zeros(self.num_envs, dtype=bool)
                skip[index] = reset or ended
                stalled = watchdog.check([index], skip)
                if stalled:
                    request = f"STEP action {_action_text(action)}"
                    raise self._recover(stalled, None, lambda i: request)
            return ended
        finally:
            if lock is not None:
                lock.release()

    def step(self, actions: np.ndarray) -> list[int]:
        """Step every env (one action each); the envs whose SAME_STEP final result was kept."""
        mode = self.autoreset
        noop = self.check_actions(actions, skip_done=mode == _NEXT_STEP)
        with self._lock:
            # the envs NEXT_STEP resets, for the watchdog (it counts no request for them)
            watched = self.watchdog is not None
            resetting = self.done_mask() if watched and mode == _NEXT_STEP else None
            if noop is None:
                ended, failures = self.runner.step(actions, mode)
            else:
                ended, failures = self.runner.step_except(actions, mode, noop)
                for index in np.flatnonzero(noop).tolist():
                    self._noop(index)
            if not failures and self.watchdog is not None:
                skip = np.zeros(self.num_envs, dtype=bool)
                for skipped in (resetting, noop):
                    if skipped is not None:
                        skip |= skipped[: self.num_envs]
                skip[ended] = True
                failures = self.watchdog.check(range(self.num_envs), skip)
            if failures:
                raise self._recover(
                    failures, None, lambda i: f"STEP action {_action_text(actions[i])}"
                )
        return ended

    def step_batch(self) -> StepBatch | None:
        """The env's ``step_batch`` when STEP_MULTI steps seats of one env (else None)."""
        if self.num_envs != 1:
            return None
        return self.runner.step_batch()

    def check_multi(self) -> StepBatch | None:
        """Refuse STEP_MULTI where it has no meaning; the env's ``step_batch`` if it steps seats."""
        step_batch = self.step_batch()
        if step_batch is None and self.num_envs != self.seats:
            raise RequestError(
                ErrorCode.BAD_BATCH,
                f"STEP_MULTI_REQ needs an {self.seats}-env server "
                "or one vector env with a batch step; "
                f"this one has {self.num_envs} envs",
            )
        return step_batch

    def step_multi(self, actions: np.ndarray) -> list[int]:
        """STEP_MULTI: seats of one env with ``step_batch``, else one action per env of a
        ``seats``-env server. Results are in rows 0..seats-1."""
        step_batch = self.check_multi()
        if step_batch is None:
            return self.step(actions)
        self._step_seats(step_batch, actions)
        return []

    def _step_seats(self, step_batch: StepBatch, actions: np.ndarray) -> None:
        if self.autoreset != AutoReset.DISABLED:
            raise RequestError(
                ErrorCode.BAD_BATCH,
                "STEP_MULTI_REQ to an env with step_batch: the env's seats do not auto-reset "
                "(connect with autoreset disabled)",
            )
        if not self.all_reset or self.is_done(0):
            self.check_action(0, 0)  # NOT_RESET: before the first reset, or the game is over
        if self.action_rule.kind != "discrete":
            raise RequestError(
                ErrorCode.BAD_BATCH,
                "STEP_MULTI_REQ to an env with step_batch takes Discrete actions",
            )
        act_n = self.spaces.act_n
        bad = self.action_rule.bad(actions, act_n)
        if bad.any():
            seat = int(np.argmax(bad))
            if self.action_rule.kind == "discrete":
                reason = f"action {int(actions[seat])} of seat {seat} is outside 0..{act_n - 1}"
            else:
                reason = f"seat {seat}: {self.action_rule.describe(actions[seat], act_n)}"
            raise RequestError(ErrorCode.INVALID_ACTION, f"env 0: {reason}")
        with self._lock:
            try:
                outputs = step_batch(actions)
                if len(outputs) != len(actions):
                    raise ValueError(
                        f"step_batch returned {len(outputs)} results for {len(actions)} actions"
                    )
                for seat, output in enumerate(outputs):
                    self.runner.write(seat, output)
            except Exception as exc:
                request = f"STEP_MULTI seat actions {_numbers(actions)}"
                raise self._recover_one(0, exc, None, request) from None

    def observe(self) -> list[dict[str, Any]]:
        """OBSERVE: every env's current result (``observe()``, else its last result) in its row,
        and its ``info()`` map. No auto-reset, no check of done."""
        if not self.all_reset:
            index = int(np.argmin(self.was_reset))
            raise RequestError(ErrorCode.NOT_RESET, f"env {index}: observe before the first reset")
        with self._lock:
            infos, failures = self.runner.observe()
            if failures:
                raise self._recover(failures, None, lambda i: "OBSERVE")
        return infos

    def close(self) -> None:
        self.runner.close()

    # -- recovery ----------------------------------------------------------------------------

    def _recover_one(
        self, index: int, exc: Exception, seeds: Sequence[int | None] | None, request: str
    ) -> RequestError:
        """``_recover`` for one env; a refusal that is not an env error passes unchanged."""
        if isinstance(exc, RequestError) and exc.code != ErrorCode.ENV_ERROR:
            return exc
        return self._recover([(index, exc)], seeds, lambda i: request)

    def _recover(
        self,
        failures: Failures,
        seeds: Sequence[int | None] | None,
        request: Callable[[int], str],
    ) -> RequestError:
        """Reset (or recreate) each env that raised; the ENV_ERROR to answer.

        The text starts with ``env {i}:`` (the first env that failed), so clients can name the
        env (``EnvError.env_id``), and ends with the first failure's last traceback frames
        (``with_traceback``). Each failure is logged once, with its whole traceback, the env and
        the request (``request(i)``: message name and action or seed), on the server's
        ``transport.server`` logger (stderr unless the application configures logging). The
        other envs of the request did step (or reset).
        """
        texts = []
        trace = ""
        shared: tuple[int, str, list[int]] | None = None  # one exception of several envs
        for index, exc in failures:
            if shared is not None and shared[0] == id(exc):  # a vector env's call: said once
                fate, ok = self.runner.restore(index, None if seeds is None else seeds[index])
                if ok:
                    self.mark_reset(index)
                else:
                    self.mark_lost(index)
                if fate == shared[1]:
                    shared[2].append(index)
                    continue
                texts.append(f"env {index}: the same error ({fate})")
                continue
            if shared is not None and len(shared[2]) > 1:
                texts.append(_same_error(shared[2], shared[1]))
            if isinstance(exc, RequestError):  # from a worker process: its text and last frames
                text = exc.text.removeprefix(f"env {index}: ")
                detail, _, worker_trace = text.partition(REMOTE_TRACEBACK_MARKER)
                trace = trace or worker_trace
                full = ""
                if worker_trace:
                    full = f"{detail}\nlast frames, in a worker:\n{worker_trace}"
            else:
                detail = describe(exc)
                full = "".join(traceback.format_exception(exc)).rstrip()
                trace = trace or remote_traceback(exc)
            fate, ok = self.runner.restore(index, None if seeds is None else seeds[index])
            if ok:
                self.mark_reset(index)
            else:
                self.mark_lost(index)
            shared = (id(exc), fate, [index])
            texts.append(f"env {index}: {detail} ({fate})")
            log.error(
                "transport: env %d raised during %s (%s)%s",
                index,
                request(index),
                fate,
                f"\n{full}" if full else f": {detail}",
            )
        if shared is not None and len(shared[2]) > 1:
            texts.append(_same_error(shared[2], shared[1]))
        return RequestError(
            ErrorCode.ENV_ERROR,
            with_traceback("; ".join(texts), trace),
            tuple(index for index, _ in failures),
        )


def _same_error(envs: list[int], fate: str) -> str:
    """The envs after the first that one exception failed (one call of a vector env)."""
    others = envs[1:]
    if len(others) > 1 and others[-1] - others[0] == len(others) - 1:
        named = f"envs {others[0]}..{others[-1]}"
    else:
        named = (
            "envs " + ", ".join(str(i) for i in others) if len(others) > 1 else f"env {others[0]}"
        )
    return f"{named}: the same error ({fate})"


def _action_text(action: Any) -> str:
    """One env's action for a log line: ``3``, or ``[1, 0.5]`` for an array action (as Node)."""
    return _numbers(action) if np.ndim(action) else _numbers([action])[1:-1]


def _seeded(name: str, seed: int | None) -> str:
    """A request's name for a log line, with its seed when it has one."""
    return name if seed is None else f"{name} seed {seed}"


# -- what a server serves ------------------------------------------------------------------------


def write_result(codec: StructCodec, index: int, output: StepOutput, out: Any, at: int) -> None:
    """Encode an env's output at byte ``at`` of ``out`` (validated unless it is a record)."""
    try:
        codec.encode_into(out, at, output, validate=not isinstance(output, np.ndarray))
    except CodecError as exc:
        awaited = awaited_text(output)
        raise RequestError(
            ErrorCode.ENV_ERROR,
            f"env {index}: {awaited}" if awaited else f"env {index}: returned bad values: {exc}",
        ) from None


# -- decision-boundary runs: the no-progress watchdog ---------------------------------------


class NoProgressError(RuntimeError):
    """An env stopped advancing (the server side; the client raises
    ``transport.errors.NoProgressError`` from the ENV_ERROR text this one's message makes)."""


class ProgressWatchdog:
    """The no-progress watchdog of decision-boundary runs (seed 004), for schemas that declare
    ``[env] max_frames`` / ``stall_requests`` and a result field with role ``frames``.

    After each step it reads every stepped env's ``frames``: ``frames == 0`` for
    ``stall_requests`` requests in a row, or ``frames >= max_frames`` (no decision within the
    budget), is a ``NoProgressError`` whose text carries the env's request numbers since its
    reset and its last state (the result's scalar and counter fields, JSON). The runtime then
    recovers from it as from any env exception: the env is reset, the client gets ENV_ERROR.
    """

    def __init__(
        self, results: np.ndarray, frames: str, max_frames: int | None, stall: int | None
    ) -> None:
        self.results = results
        self.frames = results[frames]
        self.max_frames = max_frames
        self.stall = stall
        n = len(results)
        self.requests = np.zeros(n, dtype=np.int64)  # steps since the env's last reset
        self.zeros = np.zeros(n, dtype=np.int64)  # frames == 0 in a row
        names = results.dtype.names or ()
        self.state = [
            name
            for name in names
            if (results.dtype[name].shape == () and results.dtype[name].kind in "iubf")
            or (results.dtype[name].base.kind in "iu" and len(results.dtype[name].shape) == 1)
        ]

    @staticmethod
    def of(schema: Schema, results: np.ndarray) -> ProgressWatchdog | None:
        """The watchdog a schema declares (None: no decision-boundary runs declared)."""
        env = schema.ir.env
        if env is None or (env.max_frames is None and env.stall_requests is None):
            return None
        frames = schema[env.result].ir.role("frames")
        if frames is None:
            return None
        return ProgressWatchdog(results, frames.name, env.max_frames, env.stall_requests)

    def reset(self, index: int) -> None:
        self.requests[index] = 0
        self.zeros[index] = 0

    def check(self, indices: Sequence[int], skip: np.ndarray | None) -> Failures:
        """Count one request of each env in ``indices`` (``skip[i]``: it was reset, not
        stepped); the envs that made no progress, with their NoProgressError."""
        failures: Failures = []
        for index in indices:
            if skip is not None and skip[index]:
                self.reset(index)
                continue
            self.requests[index] += 1
            frames = int(self.frames[index])
            seq = int(self.requests[index])
            if self.max_frames is not None and frames >= self.max_frames:
                why = f"no decision within {self.max_frames} frames (ran {frames})"
                first = seq
            elif frames == 0:
                self.zeros[index] += 1
                if self.stall is None or self.zeros[index] < self.stall:
                    continue
                why = f"frames 0 for {self.zeros[index]} requests in a row"
                first = seq - int(self.zeros[index]) + 1
            else:
                self.zeros[index] = 0
                continue
            failures.append((index, NoProgressError(self.text(index, why, first, seq))))
            self.reset(index)
        return failures

    def text(self, index: int, why: str, first: int, last: int) -> str:
        """The structured text a client parses (both languages write it alike)."""
        import json

        record = self.results[index]
        state = {name: np.asarray(record[name]).tolist() for name in self.state}
        return (
            f"no progress: {why} (requests {first}..{last} since reset); "
            f"last state: {json.dumps(state, separators=(',', ':'))}"
        )
