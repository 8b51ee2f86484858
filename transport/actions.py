"""The client's one rule for what an action argument means (``ActionShapes``, docs/client.md
"Actions") and the words its errors use: an action space's description (``Discrete(92)``,
``Box(...)``) and what a caller passed. Below the client: async batches, connect_many, the
adapters and the collector apply the same rule."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from transport.codec import Schema
from transport.errors import ActionError, AdapterError, ProtocolError
from transport.protocol import body_codec

NUMPY_NAMES = {
    "i8": "int8",
    "u8": "uint8",
    "i16": "int16",
    "u16": "uint16",
    "i32": "int32",
    "u32": "uint32",
    "i64": "int64",
    "u64": "uint64",
    "f32": "float32",
    "f64": "float64",
}
"""The NumPy name of each scalar type, as action-space descriptions spell it."""


def _bound_text(values: tuple[float, ...] | None, default: float) -> str:
    """One bound as gymnasium prints it: a number when every element has it, else a list."""
    if values is None:
        return repr(float(default))
    if len(set(values)) == 1:
        return repr(float(values[0]))
    return "[" + ", ".join(repr(float(v)) for v in values) + "]"


def _multi_discrete_text(nvec: list[int], start: list[int]) -> str:
    text = ", ".join(str(n) for n in nvec)
    starts = "" if not any(start) else ", start=[" + ", ".join(str(v) for v in start) + "]"
    return f"MultiDiscrete([{text}]{starts})"


def _described_bound(value: Any, integer: bool) -> str:
    """A bound of a gymnasium space's description (``transport.gym_schema``: one value when
    every element has it, else the flat list; floats may be "inf" / "-inf") as a message names
    it: an integer Box's as integers (``-5``), a float Box's as gymnasium prints them."""
    values = value if isinstance(value, list) else [value]
    texts = [str(int(v)) if integer else repr(float(v)) for v in values]
    if len(set(texts)) == 1:
        return texts[0]
    return "[" + ", ".join(texts) + "]"


def _described_space(desc: dict[str, Any]) -> str | None:
    """The space a gymnasium description node says, in gymnasium's spelling (None: unknown)."""
    kind = desc.get("type")
    if kind == "discrete":
        start = int(desc.get("start", 0))
        return f"Discrete({int(desc['n'])}" + (f", start={start}" if start else "") + ")"
    if kind == "box":
        dtype = np.dtype(desc["dtype"])
        shape = tuple(int(n) for n in desc["shape"])
        integer = dtype.kind in "iub"
        low = _described_bound(desc["low"], integer)
        high = _described_bound(desc["high"], integer)
        return f"Box({low}, {high}, {shape!r}, {dtype.name})"
    if kind == "multi_discrete":
        return _multi_discrete_text([int(v) for v in desc["nvec"]], [int(v) for v in desc["start"]])
    if kind == "multi_binary":
        sizes = [int(n) for n in desc["shape"]]
        if desc.get("n_sequence"):
            return f"MultiBinary({tuple(sizes)!r})"
        return f"MultiBinary({sizes[0] if len(sizes) == 1 else sizes})"
    return None


def describe_action_space(schema: Schema, act_n: int | None) -> str:
    """The action space of ``schema`` as a message names it (gymnasium's spelling):
    ``Discrete(92)``, ``MultiDiscrete([3, 4, 5])`` or ``Box(-1.0, 1.0, (2,), float32)``.
    ``act_n`` None (the server did not say): ``Discrete(?)``. A schema derived from gymnasium
    spaces that carries their description (``GymSpaces``, transport/spaces.py) is named by it:
    an integer Box stays a Box (``Box(-5, 5, (2,), int16)``), not the MultiDiscrete its i32
    field alone would say. Node: ``describeActionSpace``."""
    field = body_codec(schema, "STEP_REQ").ir.role("action")
    if field is None:
        return "no action space (the STEP_REQ body has no action field)"
    from transport.spaces import gym_description_of  # the adapters' module: not at import

    try:
        described = gym_description_of(schema)
        action = described.get("action") if described is not None else None
        text = _described_space(action) if isinstance(action, dict) else None
    except (AdapterError, KeyError, TypeError, ValueError):
        text = None  # an unreadable description: the field's own
    if text is not None:
        return text
    if not field.is_array:
        return f"Discrete({'?' if act_n is None else act_n})"
    dims = field.dims
    if field.kind != "float":
        high = field.bound("high") or (0.0,) * field.count
        low = field.bound("low") or (0.0,) * field.count
        nvec = [int(h - lo + 1) for lo, h in zip(low, high, strict=True)]
        return _multi_discrete_text(nvec, [int(v) for v in low])
    low_text = _bound_text(field.bound("low"), -np.inf)
    high_text = _bound_text(field.bound("high"), np.inf)
    return f"Box({low_text}, {high_text}, {dims!r}, {NUMPY_NAMES.get(field.elem, field.elem)})"


def describe_given(actions: Any) -> str:
    """What a caller passed, for an ActionError: ``int 3``, ``float 0.5``, ``ndarray of shape
    (3,), dtype float64``, ``list of shape (2,), dtype int64``."""
    kind = type(actions).__name__
    if isinstance(actions, int | float | np.generic) and not isinstance(actions, np.void):
        return f"{kind} {actions!s}"
    try:
        array = np.asarray(actions)
    except (ValueError, TypeError):
        return f"{kind} (not numbers of one shape)"
    return f"{kind} of shape {array.shape!r}, dtype {array.dtype}"


_SAFE, _CHECK_RANGE, _LOSSY, _NOT_NUMBERS = 0, 1, 2, 3
"""How values of a given dtype go into the action field: as they are, after a range check,
refused (floats into integers) or refused (not numbers)."""


_largest = np.maximum.reduce  # the ufuncs themselves: ndarray.max() adds a Python call
_smallest = np.minimum.reduce
_absolute = np.absolute
_UNSIGNED = {size: np.dtype(f"u{size}") for size in (1, 2, 4, 8)}


class ActionShapes:
    """The one rule for what an action argument means (docs/client.md, "Actions"), applied by
    the client before any bytes move, so every backend gives the same answer.

    With S the shape of one env's action (``()`` for Discrete, the field's dims for Box and
    MultiDiscrete) and N the server's envs, an argument whose shape is

    - S is one env's action: a 1-env server steps it and the result has no env axis; an N > 1
      server refuses it (one action per env);
    - (N, *S) is one action per env: the result has a leading env axis of N (N = 1 included: a
      batch of one is answered as a batch of one);
    - anything else is refused, a scalar for a Box included (never broadcast).

    Values: integers of any width go into an integer field when they fit its type (checked
    when the cast is not safe), bools too; floats into an integer field are refused (they would
    be truncated), integers and floats into a float field are taken (gymnasium's Box casts the
    same way) when the field holds them finitely (``-3.5e38`` for an f32 field is refused: it
    would be written as -inf; NaN and +-inf are the server's to judge). A 1-env server always
    gets a STEP_REQ; the result's shape follows the call.

    ``count`` applies it to ``step`` (N envs); ``rows`` to a call for K env ids (``send``):
    the same rule with K in place of N, its batch form (K, *S) only, the same texts."""

    def __init__(
        self, schema: Schema, num_envs: int, space: Any, *, batch_only: bool = False
    ) -> None:
        field = body_codec(schema, "STEP_REQ").ir.role("action")
        if field is None:
            raise ProtocolError("the STEP_REQ body struct has no field with role 'action'")
        self.one: tuple[int, ...] = field.dims if field.is_array else ()
        self.batch: tuple[int, ...] = (num_envs, *self.one)
        self.num_envs = num_envs
        self.batch_only = batch_only  # one action per env only (connect_many's batches)
        self.dtype: np.dtype[Any] = np.dtype(body_codec(schema, "STEP_REQ").dtype[field.name].base)
        self.integer = self.dtype.kind in "iu"
        self.lo = self.hi = 0
        self.top = self.inf_from = 0.0  # a float field's largest finite value, and past it
        if self.integer:
            info = np.iinfo(self.dtype)
            self.lo, self.hi = int(info.min), int(info.max)
        elif self.dtype.kind == "f":
            floats = np.finfo(self.dtype)
            self.top = float(floats.max)
            # the first magnitude the cast rounds to inf (max + half its ulp; below it rounds
            # to max, as the Node client's Math.fround does)
            self.inf_from = self.top + 2.0 ** (floats.maxexp - floats.nmant - 2)
        self.elem = field.elem
        self._space = space  # () -> str: the action space's description (asked when needed)
        self._casts: dict[np.dtype[Any], int] = {}

    def count(self, actions: Any, *, what: str = "step()") -> tuple[Any, int | None]:
        """``(values, count)``: the argument as the field takes it and None (one env's action)
        or N (one action per env); ``ActionError`` when it is neither or its values do not fit."""
        if type(actions) is int:  # the hot path of a Discrete 1-env server
            if (
                self.one
                or self.num_envs != 1
                or self.batch_only
                or not self.lo <= actions <= self.hi
            ):
                return self._slow(actions, what)
            return actions, None
        if type(actions) is np.ndarray:
            shape = actions.shape
            if shape == self.batch:
                count: int | None = self.num_envs
            elif shape == self.one and self.num_envs == 1 and not self.batch_only:
                count = None
            else:
                return self._slow(actions, what)
            # ``_takes``, inline: each step of an array action passes here
            cast = self._casts.get(actions.dtype)
            if cast is None:
                cast = self._casts[actions.dtype] = self._cast(actions.dtype)
            if cast == _SAFE or (cast == _CHECK_RANGE and self._fits(actions)):
                return actions, count
        return self._slow(actions, what)

    def rows(self, actions: Any, k: int, *, what: str = "send()") -> np.ndarray:
        """One action per env id of a call for ``k`` env ids (``send``): the rule of ``count``
        with K in place of N, batch form only (shape (K, *S); a 1-env call's shape S is refused
        as ``batch_only`` refuses it). The values as an array of that shape, taken as they are
        (a float64 array for an f32 field: rounded where they are written); ``ActionError``
        naming ``what`` and the K env ids otherwise."""
        if type(actions) is np.ndarray and actions.shape == (k, *self.one):
            if self._takes(actions):
                return actions
        values, _ = self._slow(actions, what, k)
        return np.asarray(values)

    def _takes(self, array: np.ndarray) -> bool:
        """Whether the values of ``array`` (of an accepted shape) go into the field as they are."""
        cast = self._casts.get(array.dtype)
        if cast is None:
            cast = self._casts[array.dtype] = self._cast(array.dtype)
        return cast == _SAFE or (cast == _CHECK_RANGE and self._fits(array))

    def _slow(self, actions: Any, what: str, k: int | None = None) -> tuple[Any, int | None]:
        """The argument as an array (lists, scalars, other array types), checked; the
        ActionError that says why it is refused. ``k``: a call for K env ids (``rows``)."""
        given = describe_given(actions)
        single = k is None and self.num_envs == 1 and not self.batch_only
        n = self.num_envs if k is None else k
        batch = self.batch if k is None else (k, *self.one)
        if type(actions) is int and not self.lo <= actions <= self.hi and self.integer:
            if self.one == () and single:
                raise self._error(what, given, self._outside(str(actions)), k)
        try:
            array = np.asarray(actions)
        except (ValueError, TypeError):
            raise self._error(what, given, "not numbers of one shape", k) from None
        cast = self._cast(array.dtype)
        if cast == _NOT_NUMBERS:
            raise self._error(what, given, "its values are not numbers", k)
        if array.shape == batch:
            count: int | None = n
        elif array.shape == self.one and single:
            count = None
        else:
            raise self._error(what, given, self._wanted(array.shape, k), k)
        if cast == _LOSSY:
            raise self._error(
                what,
                given,
                f"its {array.dtype} values would be truncated to the {self.elem} action "
                "field; pass integers",
                k,
            )
        if cast == _CHECK_RANGE and not self._fits(array):
            why = self._outside("a value") if self.integer else self._beyond(array)
            raise self._error(what, given, why, k)
        return (array if array.ndim else array[()]), count

    def _outside(self, value: str) -> str:
        """Why an integer the field's type cannot hold is refused. A Discrete space whose size
        is known is named by its actions, 0..n-1 (the server's INVALID_ACTION stays the check of
        the values the field holds); any other space by the field's type."""
        if self.one == ():
            found = _DISCRETE.fullmatch(self._space())
            if found is not None and int(found[1]) > 0:
                return (
                    f"{value} is outside 0..{int(found[1]) - 1} (and does not fit the "
                    f"{self.elem} action field)"
                )
        return (
            f"{value} is outside {self.lo}..{self.hi}: it does not fit the {self.elem} action field"
        )

    def _beyond(self, array: np.ndarray) -> str:
        """Why a float ``array`` does not fit the float action field: its first finite value
        past the field's largest (it would be written as +-inf)."""
        with np.errstate(invalid="ignore"):
            bad = (np.isfinite(array) & (np.abs(array) >= self.inf_from)).reshape(-1)
        value = float(array.reshape(-1)[int(np.argmax(bad))])
        sign = "-" if value < 0 else ""
        return (
            f"{value!r} is outside -{self.top!r}..{self.top!r}: the {self.elem} action field "
            f"cannot hold it (it would become {sign}inf)"
        )

    def _cast(self, dtype: np.dtype[Any]) -> int:
        kind = dtype.kind
        if kind not in "biuf":
            return _NOT_NUMBERS
        if not self.integer:
            # integers of any width fit f32 and f64, and so does a float the field's type holds
            # (float64 -> float32 rounds); a wider float may be beyond the field's range
            if kind != "f" or np.can_cast(dtype, self.dtype, "safe"):
                return _SAFE
            return _CHECK_RANGE
        if kind == "f":
            return _LOSSY
        return _SAFE if np.can_cast(dtype, self.dtype, "safe") else _CHECK_RANGE

    def _fits(self, array: np.ndarray) -> bool:
        """Whether every value of an integer ``array`` fits the action field. Each step of a
        trainer that passes int64 actions to an int32 field asks: one reduction (the largest
        value read as unsigned: from 0 to ``hi``, every value fits) decides the common case of
        no negative action; otherwise its minimum and maximum do."""
        if array.size == 0:
            return True
        if not self.integer:
            return self._fits_float(array)
        if array.dtype.kind == "u":  # nothing below 0: the field's minimum is 0 or less
            return int(_largest(array, None)) <= self.hi
        size = array.dtype.itemsize
        # a negative value read as unsigned is 2**(bits - 1) or more: past hi when hi is less
        if array.dtype.isnative and size in _UNSIGNED and self.hi < 1 << (8 * size - 1):
            if int(_largest(array.view(_UNSIGNED[size]), None)) <= self.hi:
                return True  # every value is in 0..hi
        return int(_smallest(array, None)) >= self.lo and int(_largest(array, None)) <= self.hi

    def _fits_float(self, array: np.ndarray) -> bool:
        """Whether a float ``array`` wider than the float action field holds only values the
        field holds finitely: NaN and +-inf pass (the server's check of a Box action decides on
        them, ``allow_nonfinite``). Two reductions decide the common case."""
        limit = self.inf_from
        if _largest(_absolute(array), None) < limit:
            return True  # a NaN makes the comparison false: the exact check below decides
        with np.errstate(invalid="ignore"):
            return not bool((np.isfinite(array) & (_absolute(array) >= limit)).any())

    def _wanted(self, shape: tuple[int, ...], k: int | None = None) -> str:
        """What to pass instead of an argument of ``shape``; a batch of the wrong length
        first says the two counts. ``k``: a call for K env ids."""
        n = self.num_envs if k is None else k
        batch = self.batch if k is None else (k, *self.one)
        if len(shape) == len(batch) and shape[1:] == self.one:
            plural = "" if n == 1 else "s"
            return f"expected {n} action{plural}, got {shape[0]}; " + self._wanted((), k)
        if k is not None:
            return f"pass one action per env id: an array of shape {batch!r}"
        if self.num_envs == 1 and not self.batch_only:
            if self.one == ():
                return "pass one integer (one action) or an array of shape (1,) (a batch of one)"
            return (
                f"pass an array of shape {self.one!r} (one action) or {self.batch!r} (a batch "
                "of one)"
            )
        return f"pass one action per env: an array of shape {self.batch!r}"

    def _error(self, what: str, given: str, why: str, k: int | None = None) -> ActionError:
        if k is None:
            envs = f"{self.num_envs} env" + ("" if self.num_envs == 1 else "s")
        else:
            envs = f"{k} env id" + ("" if k == 1 else "s")
        return ActionError(f"{what}: {given} is not an action for {self._space()} ({envs}): {why}")


_DISCRETE = re.compile(r"Discrete\((\d+)\)")
"""A Discrete space whose size is known, as ``describe_action_space`` names it."""
