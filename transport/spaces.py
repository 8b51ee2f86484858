"""Gymnasium spaces from a schema's roles, once for every adapter (docs/adapters.md, "Spaces").

- Observation: the result struct's ``observation`` fields. One field is a ``Box`` of the
  field's shape (``f32[2,5,5]``: shape (2, 5, 5)); several make a ``Dict`` of Boxes keyed by
  field name, in field order. Bounds: the field's declared ``low`` / ``high``, else the
  adapter's ``observation_bounds`` (or a reference env's known bounds), else (-inf, inf).
- Action: the request struct's ``action`` field. One integer is ``Discrete(act_n)`` (act_n from
  the server's ``spaces()``); an integer array is ``MultiDiscrete(high - low + 1, start=low)``
  (low defaults to 0); an f32/f64 array is ``Box(low, high, shape)`` (+-inf when undeclared).

The adapters return owned copies (``observation_of``): gymnasium code keeps observations
across steps, which views into the client's receive buffer would break.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from transport.codec import Schema
from transport.errors import AdapterError
from transport.schema.ir import FieldIR, StructIR

Observation = np.ndarray | dict[str, np.ndarray]
"""What an adapter returns as an observation: one array, or one per observation field."""

DISCRETE, MULTI_DISCRETE, BOX = "discrete", "multi_discrete", "box"


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


def _box(field: FieldIR, dtype: np.dtype[Any], default: tuple[float, float] | None) -> spaces.Box:
    """A Box of the field's shape (a scalar field: shape (1,)) and its bounds."""
    shape = field.dims or (1,)
    lo_default, hi_default = default if default is not None else (-np.inf, np.inf)
    low, high = field.bound("low"), field.bound("high")
    lows = np.full(shape, lo_default) if low is None else np.reshape(low, shape)
    highs = np.full(shape, hi_default) if high is None else np.reshape(high, shape)
    return spaces.Box(lows.astype(dtype), highs.astype(dtype), shape, dtype=dtype.type)


def observation_space_of(
    schema: Schema, bounds: tuple[float, float] | None = None
) -> spaces.Space[Any]:
    """One observation field: its Box; several: a Dict of their Boxes (see the module doc).
    ``bounds`` apply to fields that declare no ``low`` / ``high``."""
    result = _body_struct(schema, "STEP_RESP")
    fields = observation_fields_of(schema)
    boxes: dict[str, spaces.Space[Any]] = {
        f.name: _box(f, _dtype(schema, result, f), bounds) for f in fields
    }
    if len(boxes) == 1:
        return next(iter(boxes.values()))
    return spaces.Dict(boxes)


def action_space_of(schema: Schema, act_n: int) -> spaces.Space[Any]:
    """The action space: Discrete(act_n), MultiDiscrete or Box (see the module doc)."""
    field = action_field_of(schema)
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
    for field in fields:
        shape = field.dims or (1,)
        if num_envs is not None:
            shape = (num_envs, *shape)
        out[field.name] = np.array(view[field.name], copy=True).reshape(shape)
    if len(fields) == 1:
        return out[fields[0].name]
    return out


def actions_of(actions: Any, field: FieldIR, num_envs: int | None = None) -> Any:
    """An adapter's action(s) in the shape the client sends: an int for one Discrete action,
    else an array of the action field's shape (with a leading env axis for ``num_envs``)."""
    if not field.is_array:
        if num_envs is None:
            return int(actions)
        return np.asarray(actions).reshape(num_envs)
    shape = field.dims if num_envs is None else (num_envs, *field.dims)
    return np.asarray(actions).reshape(shape)
