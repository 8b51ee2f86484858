"""Gymnasium spaces from a schema's roles, once for every adapter (docs/adapters.md, "Spaces").

- Observation: the result struct's ``observation`` fields. One field is a ``Box`` of the
  field's shape (``f32[2,5,5]``: shape (2, 5, 5)); several make a ``Dict`` of Boxes keyed by
  field name, in field order. Bounds: the field's declared ``low`` / ``high``, else the
  adapter's ``observation_bounds`` (or a reference env's known bounds), else (-inf, inf) for a
  float field and the dtype's range for an integer one (u8: 0..255; bool: False..True).
- Action: the request struct's ``action`` field. One integer is ``Discrete(act_n)`` (act_n from
  the server's ``spaces()``); an integer array is ``MultiDiscrete(high - low + 1, start=low)``
  (low defaults to 0); an f32/f64 array is ``Box(low, high, shape)`` (+-inf when undeclared).

The adapters return owned copies (``observation_of``): gymnasium code keeps observations
across steps, which views into the client's receive buffer would break.

A schema derived from gymnasium spaces (``transport.gym_schema``, ``transport.serve_gym``) may
carry the exact spaces in an enum ``GymSpaces`` (what the fields alone cannot say: a Box bound
infinite on some elements only, Discrete observations, MultiBinary, Tuple, Dict keys, a
Discrete start). Then the spaces are rebuilt from it, and ``observation_of`` returns
observations of their structure (a Discrete leaf: a scalar; a Tuple: a tuple; a nested Dict:
nested dicts) for the fields of that schema.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from transport.codec import Schema
from transport.errors import AdapterError
from transport.schema.ir import FieldIR, StructIR

if TYPE_CHECKING:
    from gymnasium import spaces
# gymnasium is imported where a space is made (~60 ms): `import transport` in a server or a CLI
# that makes none (most of a test run's hundreds of processes) does not pay for it

Observation = np.ndarray | dict[str, np.ndarray]
"""What an adapter returns as an observation: one array, or one per observation field."""

DISCRETE, MULTI_DISCRETE, BOX = "discrete", "multi_discrete", "box"

GYM_SPACES_ENUM = "GymSpaces"
"""The enum of a schema derived from gymnasium spaces that packs their exact description."""
_DESCRIPTIONS: dict[int, dict[str, Any] | None] = {}
_STRUCTURES: dict[int, tuple[FieldIR, dict[str, Any]]] = {}
_LIFTED: dict[int, FieldIR] = {}
"""Action fields of one element (``i32[1]``, ``f32[1]``) whose gymnasium space has shape ()
(a Discrete with a start, a Box of shape ()), by id: ``actions_of`` adds their axis."""


def gym_description_of(schema: Schema) -> dict[str, Any] | None:
    """The gymnasium spaces' description a derived schema packs in its ``GymSpaces`` enum
    (``transport.gym_schema``), or None (an ``AdapterError`` when it is there but unreadable)."""
    cached = _DESCRIPTIONS.get(schema.fingerprint, ())
    if cached != ():
        return cached  # type: ignore[return-value]
    enum = schema.ir.enums.get(GYM_SPACES_ENUM)
    found: dict[str, Any] | None = None
    if enum is not None:
        try:
            packed = sorted(int(v) for v in enum.values.values())
            data = bytearray()
            for i, value in enumerate(packed):
                if value >> 16 != i:
                    raise ValueError(f"value {value} is not part {i}")
                data += bytes(((value >> 8) & 0xFF, value & 0xFF))
            found = json.loads(data.decode("ascii"))
            if not isinstance(found, dict) or found.get("version") != 1:
                raise ValueError("not a version 1 description")
        except (ValueError, UnicodeDecodeError) as exc:
            raise AdapterError(f"schema {schema.name}: enum {GYM_SPACES_ENUM}: {exc}") from None
    _DESCRIPTIONS[schema.fingerprint] = found
    return found


def _bound_array(value: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    values = value if isinstance(value, list) else [value] * max(1, int(np.prod(shape)))
    if dtype.kind in "iub":
        return np.array(values, dtype=dtype).reshape(shape)
    return np.array([float(v) for v in values], dtype=np.float64).astype(dtype).reshape(shape)


def space_of_description(desc: dict[str, Any]) -> spaces.Space[Any]:
    """The gymnasium space a description node says (``transport.gym_schema``)."""
    from gymnasium import spaces

    kind = desc.get("type")
    try:
        if kind == "dict":
            return spaces.Dict([(str(k), space_of_description(d)) for k, d in desc["items"]])
        if kind == "tuple":
            return spaces.Tuple([space_of_description(d) for d in desc["items"]])
        if kind == "box":
            dtype = np.dtype(desc["dtype"])
            shape = tuple(int(n) for n in desc["shape"])
            low = _bound_array(desc["low"], shape, dtype)
            high = _bound_array(desc["high"], shape, dtype)
            return spaces.Box(low, high, shape, dtype=dtype.type)
        if kind == "discrete":
            return spaces.Discrete(int(desc["n"]), start=int(desc["start"]))
        if kind == "multi_discrete":
            shape = tuple(int(n) for n in desc["shape"])
            nvec = np.array(desc["nvec"], dtype=np.int64).reshape(shape)
            start = np.array(desc["start"], dtype=np.int64).reshape(shape)
            return spaces.MultiDiscrete(nvec, dtype=np.dtype(desc["dtype"]).type, start=start)
        if kind == "multi_binary":
            shape = tuple(int(n) for n in desc["shape"])
            one = len(shape) == 1 and not desc.get("n_sequence")  # MultiBinary(5), not ((5,))
            return spaces.MultiBinary(shape[0] if one else list(shape))
    except (KeyError, TypeError, ValueError) as exc:
        raise AdapterError(f"a gymnasium space description is broken ({exc}): {desc!r}") from None
    raise AdapterError(f"a gymnasium space description has an unknown type: {desc!r}")


def spaces_from_description(
    schema: Schema,
) -> tuple[spaces.Space[Any], spaces.Space[Any]] | None:
    """The exact (observation, action) spaces a derived schema carries, or None."""
    desc = gym_description_of(schema)
    if desc is None:
        return None
    return space_of_description(desc["observation"]), space_of_description(desc["action"])


def _structured(desc: dict[str, Any], leaves: dict[str, np.ndarray], single: bool) -> Any:
    kind = desc.get("type")
    if kind == "dict":
        return {str(k): _structured(d, leaves, single) for k, d in desc["items"]}
    if kind == "tuple":
        return tuple(_structured(d, leaves, single) for d in desc["items"])
    value = leaves[desc["field"]]
    return value[()] if single and kind == "discrete" else value


def _body_struct(schema: Schema, message: str) -> StructIR:
    found = schema.ir.messages.get(message)
    if found is None or found.body is None:
        raise AdapterError(f"schema {schema.name}: {message} has no body struct")
    return schema.ir.structs[found.body]


def observation_fields_of(schema: Schema) -> tuple[FieldIR, ...]:
    """The result struct's observation fields, in field order (at least one)."""
    result = _body_struct(schema, "STEP_RESP")
    fields = result.roles("observation")
    if not fields:
        raise AdapterError(f"the result struct {result.name} has no field with role observation")
    return fields


def action_field_of(schema: Schema) -> FieldIR:
    """The request struct's action field."""
    request = _body_struct(schema, "STEP_REQ")
    action = request.role("action")
    if action is None:
        raise AdapterError(f"the request struct {request.name} has no field with role action")
    return action


def action_kind_of(field: FieldIR) -> str:
    """``discrete`` (one integer), ``multi_discrete`` (an integer array), ``box`` (floats)."""
    if not field.is_array:
        return DISCRETE
    return BOX if field.kind == "float" else MULTI_DISCRETE


def _dtype(schema: Schema, struct: StructIR, field: FieldIR) -> np.dtype[Any]:
    return np.dtype(schema[struct.name].dtype[field.name].base)


def _integer_default(value: float, dtype: np.dtype[Any], upper: bool) -> int:
    """A default bound (``observation_bounds``, +-inf when none) for an integer field: inside
    the dtype's range, +-inf its ends (a cast of inf to an integer dtype is undefined: numpy
    gave ``Box(0, 0)`` for u8), a fraction rounded inward."""
    info = np.iinfo(dtype)
    if math.isinf(value):
        whole = int(info.max) if value > 0 else int(info.min)
    elif math.isnan(value):
        whole = int(info.max) if upper else int(info.min)
    else:
        whole = math.floor(value) if upper else math.ceil(value)
    return min(max(whole, int(info.min)), int(info.max))


def _whole(text: str) -> int:
    """An integer bound's IR text ("255"; "255.0" from a hand-written IR) as an exact int."""
    try:
        return int(text)
    except ValueError:
        return int(float(text))


def _declared(
    field: FieldIR, which: str, shape: tuple[int, ...], dtype: np.dtype[Any]
) -> np.ndarray | None:
    """The field's declared ``low`` / ``high`` as an array of its dtype; None when absent. An
    integer field's bounds come from the IR's text, exact (a float would round an i64 / u64
    bound past the dtype's end)."""
    raw = field.low if which == "low" else field.high
    if raw is None:
        return None
    if isinstance(raw, str):  # one bound for every element: no per-element parse
        one = _whole(raw) if dtype.kind in "iu" else np.float64(float(raw)).astype(dtype)
        return np.full(shape, one, dtype=dtype)
    if dtype.kind in "iu":
        return np.array([_whole(t) for t in raw], dtype=dtype).reshape(shape)
    return np.array([float(t) for t in raw], dtype=np.float64).astype(dtype).reshape(shape)


def _box(field: FieldIR, dtype: np.dtype[Any], default: tuple[float, float] | None) -> spaces.Box:
    """A Box of the field's shape (a scalar field: shape (1,)) and its bounds: the declared
    ones, else ``default``, else unbounded: (-inf, inf) for a float field, the dtype's range for
    an integer one, False..True for a bool."""
    from gymnasium import spaces

    shape = field.dims or (1,)
    lo_default, hi_default = default if default is not None else (-np.inf, np.inf)
    lo: float | int = lo_default
    hi: float | int = hi_default
    if dtype.kind == "b":  # a bool field: False..True (inf cast to bool would be True..True)
        lo, hi = 0, 1
    elif dtype.kind in "iu":  # an integer field: never +-inf cast to the dtype
        lo = _integer_default(float(lo_default), dtype, upper=False)
        hi = _integer_default(float(hi_default), dtype, upper=True)
    low, high = _declared(field, "low", shape, dtype), _declared(field, "high", shape, dtype)
    lows = np.full(shape, lo, dtype=dtype) if low is None else low
    highs = np.full(shape, hi, dtype=dtype) if high is None else high
    return spaces.Box(lows, highs, shape, dtype=dtype.type)


def observation_space_of(
    schema: Schema, bounds: tuple[float, float] | None = None
) -> spaces.Space[Any]:
    """One observation field: its Box; several: a Dict of their Boxes (see the module doc).
    ``bounds`` apply to fields that declare no ``low`` / ``high``."""
    from gymnasium import spaces

    result = _body_struct(schema, "STEP_RESP")
    fields = observation_fields_of(schema)
    described = spaces_from_description(schema)
    if described is not None:
        desc = gym_description_of(schema)
        assert desc is not None
        _STRUCTURES[id(fields[0])] = (fields[0], desc["observation"])
        return described[0]
    boxes: dict[str, spaces.Space[Any]] = {
        f.name: _box(f, _dtype(schema, result, f), bounds) for f in fields
    }
    if len(boxes) == 1:
        return next(iter(boxes.values()))
    return spaces.Dict(boxes)


def action_space_of(schema: Schema, act_n: int) -> spaces.Space[Any]:
    """The action space: Discrete(act_n), MultiDiscrete or Box (see the module doc)."""
    from gymnasium import spaces

    described = spaces_from_description(schema)
    field = action_field_of(schema)
    if described is not None:
        if described[1].shape == () and field.is_array and field.dims == (1,):
            _LIFTED[id(field)] = field
        return described[1]
    kind = action_kind_of(field)
    if kind == DISCRETE:
        return spaces.Discrete(act_n)
    if kind == MULTI_DISCRETE:
        high = field.bound("high")
        assert high is not None  # the compiler requires it
        low = field.bound("low") or (0.0,) * field.count
        start = np.reshape(np.array(low, dtype=np.int64), field.dims)
        nvec = np.reshape(np.array(high, dtype=np.int64), field.dims) - start + 1
        return spaces.MultiDiscrete(nvec, dtype=np.int64, start=start)
    request = _body_struct(schema, "STEP_REQ")
    return _box(field, _dtype(schema, request, field), None)


def observation_of(
    view: Any, fields: tuple[FieldIR, ...], num_envs: int | None = None
) -> Observation:
    """The adapter's observation from a result view: an owned array of the field's shape (with
    a leading env axis when ``num_envs`` is given), or a dict of them for several fields."""
    out: dict[str, np.ndarray] = {}
    entry = _STRUCTURES.get(id(fields[0])) if fields else None
    structure = entry[1] if entry is not None and entry[0] is fields[0] else None
    for field in fields:
        shape = field.dims if structure is not None else field.dims or (1,)
        if num_envs is not None:
            shape = (num_envs, *shape)
        out[field.name] = np.array(view[field.name], copy=True).reshape(shape)
    if structure is not None:  # a gymnasium-derived schema: the spaces' own structure
        return _structured(structure, out, num_envs is None)  # type: ignore[no-any-return]
    if len(fields) == 1:
        return out[fields[0].name]
    return out


def actions_of(actions: Any, field: FieldIR, num_envs: int | None = None) -> Any:
    """An adapter's action(s) for ``Client.step``: what the caller gave, unchanged. The
    client's one rule (``transport.actions.ActionShapes``, docs/client.md "Actions") takes it or
    raises ``ActionError`` naming the space; nothing is reshaped here, so an array of another
    shape (transposed, flat, a wrong count) is refused rather than redistributed among envs.

    The one change: a gymnasium-derived schema whose action space has shape () while its field
    has one element (a ``Discrete`` with a start, a ``Box`` of shape (): ``i32[1]``, ``f32[1]``)
    gets that axis added to an action of the space's shape (``num_envs``: shape (N,)); and a
    numpy integer for one env's Discrete action goes as the Python int of the same value."""
    if num_envs is None and not field.is_array:  # one env's Discrete action (never lifted)
        if type(actions) is int or not isinstance(actions, np.integer):
            return actions
        return int(actions)  # the same integer (SB3's DummyVecEnv passes np.int64): the client's
        # fast path takes a Python int; other numpy scalars take its checked path
    if _LIFTED.get(id(field)) is not field:  # every field but those action_space_of lifts
        return actions
    array = np.asarray(actions)
    if array.shape == (() if num_envs is None else (num_envs,)) and array.dtype.kind in "biuf":
        return array[..., np.newaxis]
    return actions
