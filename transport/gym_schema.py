"""A schema derived from a gymnasium env's spaces (``transport-schema from-gym``, ``serve_gym``).

``schema_toml(observation_space, action_space)`` writes the TOML of an env schema whose result
struct holds the observation (one field per leaf space), ``reward`` (f64), ``terminated`` and
``truncated`` (bool), and whose request struct holds the action. The text depends only on the
spaces, so the same spaces always give the same fingerprint.

Field names: a single leaf observation is ``observation``; a Dict's leaves are named by their
keys (nested Dicts and Tuples join the path with ``_``: ``{"a": {"b": ...}}`` -> ``a_b``, a Tuple's
items are ``obs_0``, ``obs_1``, ...; a key that is not a legal field name, or clashes, becomes
``obs_<leaf index>``). Leaves: ``Box`` (its dtype and shape; bounds written when finite; a Box
of bools is a bool array, its bounds in the description),
``Discrete(n, start)`` (an i64 scalar, ``low = start``, ``high = start + n - 1``),
``MultiDiscrete`` (its dtype, ``low = start``, ``high = start + nvec - 1``), ``MultiBinary`` (i8,
0..1). The action is one field: ``Discrete(n)`` a u8/u16/u32 (``act_n = n``), ``Discrete(n,
start != 0)`` an ``i32[1]`` with bounds, ``MultiDiscrete`` / ``MultiBinary`` / an integer ``Box``
an i32 array with bounds, a float ``Box`` an f32/f64 array.

What the schema language cannot say exactly (a Box bound infinite on some elements only, a
Discrete observation, MultiBinary vs MultiDiscrete, a Tuple, Dict keys, a Discrete start) is
carried by the schema itself: an enum ``GymSpaces`` (``transport.spaces.GYM_SPACES_ENUM``)
whose values pack the canonical JSON description of both spaces, two bytes per value. It is
written only when the plain schema would rebuild other spaces, is covered by the fingerprint
and travels with the schema wherever discovery takes it (every backend, the Node side), and
``transport.spaces`` rebuilds the exact gymnasium spaces from it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np
from gymnasium import spaces

from transport.codec import Schema
from transport.errors import SchemaError
from transport.schema import compile_schema
from transport.schema.rules import check_field_name
from transport.spaces import (
    GYM_SPACES_ENUM,
    action_space_of,
    observation_space_of,
    spaces_from_description,
)

_DTYPES = {
    "float32": "f32",
    "float64": "f64",
    "uint8": "u8",
    "uint16": "u16",
    "uint32": "u32",
    "uint64": "u64",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "bool": "bool",  # a Box of bools (PettingZoo's Go): a bool array field, no bounds
}
_RESERVED = {"reward", "terminated", "truncated"}
_CARRIED = "Box, Discrete, MultiDiscrete, MultiBinary, and Dict / Tuple of these"
_ACTIONS = "Box, Discrete, MultiDiscrete or MultiBinary (one field: not a Dict or Tuple)"
_I32 = (-(2**31), 2**31 - 1)


def _refuse(space: Any, where: str, why: str = "", *, action: bool = False) -> SchemaError:
    """The refusal of a space at ``where``; without ``why``: what the transport carries there
    (an action is one field, so fewer kinds than an observation)."""
    name = type(space).__name__
    carried = f"an action may be {_ACTIONS}" if action else f"the transport carries {_CARRIED}"
    reason = why or f"a {name} space has no fixed size; {carried}"
    return SchemaError(f"{where}: {name} space {space!r} cannot be carried: {reason}")


def _number(value: float) -> Any:
    """A bound as JSON: an int when integral, a float, or "inf" / "-inf"."""
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return int(value)
    return float(value)


def _bound_json(values: Any) -> Any:
    """One value when every element is equal, else the flat row-major list (integers of an
    integer array exactly, not through a float)."""
    array = np.asarray(values)
    exact = array.dtype.kind in "iub"
    if array.size and bool((array == array.flat[0]).all()):  # one pass, not a list (a 1M Box)
        first = array.flat[0]
        return int(first) if exact else _number(float(first))
    if exact:
        return [int(v) for v in array.ravel()]
    return [_number(float(v)) for v in array.astype(np.float64).ravel()]


def _dims(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(int(n)) for n in shape) + "]" if shape else ""


class _Fields:
    """The observation leaves: their field lines and their description (field names in it)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names: set[str] = set(_RESERVED)
        self.count = 0

    def name_for(self, path: list[str]) -> str:
        wanted = "_".join(re.sub(r"[^A-Za-z0-9_]", "_", p) for p in path) or "observation"
        if (
            not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,63}", wanted)
            or check_field_name(wanted) is not None
            or wanted in self.names
        ):
            wanted = f"obs_{self.count}"
            while wanted in self.names:
                wanted += "_"
        self.names.add(wanted)
        self.count += 1
        return wanted

    def leaf(self, space: Any, path: list[str], where: str) -> dict[str, Any]:
        name = self.name_for(path)
        desc, type_, low, high = _leaf(space, where, action=False)
        line = f'  {{ name = "{name}", type = "{type_}", role = "observation"'
        if low is not None and high is not None:
            line += f", low = {_toml(low)}, high = {_toml(high)}"
        self.lines.append(line + " },")
        return {**desc, "field": name}

    def tree(self, space: Any, path: list[str], where: str) -> dict[str, Any]:
        if isinstance(space, spaces.Dict):
            if not space.spaces:
                raise _refuse(space, where, "an empty Dict has nothing to carry")
            for key in space.spaces:
                if not isinstance(key, str):
                    raise _refuse(
                        space,
                        where,
                        f"its key {key!r} is not a str ({type(key).__name__}): Dict keys "
                        "must be strings (the observation is carried as a dict keyed by str)",
                    )
            items = [
                [key, self.tree(sub, [*path, str(key)], f"{where}[{key!r}]")]
                for key, sub in space.spaces.items()
            ]
            return {"type": "dict", "items": items}
        if isinstance(space, spaces.Tuple):
            if not space.spaces:
                raise _refuse(space, where, "an empty Tuple has nothing to carry")
            subs = [
                self.tree(
                    sub, [*path, f"obs_{i}"] if not path else [*path, str(i)], f"{where}[{i}]"
                )
                for i, sub in enumerate(space.spaces)
            ]
            return {"type": "tuple", "items": subs}
        return self.leaf(space, path, where)


def _toml(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value) if isinstance(value, float) else str(value)


def _finite(values: np.ndarray) -> Any:
    """The TOML bound of a Box (None when some element is infinite: the schema cannot say it)."""
    raw = np.asarray(values)
    if raw.dtype.kind in "iub":
        return _bound_json(raw)
    array = raw.astype(np.float64)
    if not np.all(np.isfinite(array)):
        return None
    flat = [float(v) for v in array.ravel()]
    return flat[0] if all(v == flat[0] for v in flat) else flat


def _leaf(space: Any, where: str, *, action: bool) -> tuple[dict[str, Any], str, Any, Any]:
    """A leaf space's description, its field type and its TOML bounds (None: unbounded)."""
    if isinstance(space, spaces.Box):
        dtype = np.dtype(space.dtype)
        elem = _DTYPES.get(dtype.name)
        if elem is None:
            raise _refuse(space, where, f"dtype {dtype.name} has no schema type")
        shape = tuple(int(n) for n in space.shape)
        if math.prod(shape) == 0:
            raise _refuse(space, where, "it has no elements")
        desc = {
            "type": "box",
            "dtype": dtype.name,
            "shape": list(shape),
            "low": _bound_json(space.low),
            "high": _bound_json(space.high),
        }
        low, high = _finite(space.low), _finite(space.high)
        if dtype.kind == "b":
            if action:
                raise _refuse(space, where, "a Box action of bools (use MultiBinary)")
            low = high = None  # a bool field takes no bounds; the description keeps them
        if action and dtype.kind in "iu":
            elem, low, high = "i32", _bound_json(space.low), _bound_json(space.high)
            if not (_I32[0] <= float(np.min(space.low)) and float(np.max(space.high)) <= _I32[1]):
                raise _refuse(space, where, "an integer Box action must fit i32 bounds")
        wire = _dims(shape) if shape else "[1]" if action else ""  # a Box action is an array
        return desc, f"{elem}{wire}", low, high
    if isinstance(space, spaces.Discrete):
        n, start = int(space.n), int(space.start)
        desc = {"type": "discrete", "n": n, "start": start}
        if not action:
            return desc, "i64", start, start + n - 1
        if start == 0 and n <= 2**32:
            type_ = "u8" if n <= 256 else "u16" if n <= 65536 else "u32"
            return desc, type_, None, None
        if start == 0 and n > 2**32:
            raise _refuse(
                space, where, f"a Discrete action has at most 2**32 values (a u32), not {n}"
            )
        if not (_I32[0] <= start and start + n - 1 <= _I32[1]):
            raise _refuse(space, where, "a Discrete action with a start must fit i32")
        return desc, "i32[1]", start, start + n - 1
    if isinstance(space, spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec, dtype=np.int64)
        begin = np.asarray(space.start, dtype=np.int64)
        if action and not (_I32[0] <= begin.min() and (begin + nvec - 1).max() <= _I32[1]):
            raise _refuse(space, where, "a MultiDiscrete action must fit i32")
        shape = tuple(int(n) for n in nvec.shape)
        elem = "i32" if action else _DTYPES.get(np.dtype(space.dtype).name, "i64")
        desc = {
            "type": "multi_discrete",
            "dtype": np.dtype(space.dtype).name,
            "shape": list(shape),
            "nvec": [int(v) for v in nvec.ravel()],
            "start": [int(v) for v in begin.ravel()],
        }
        return desc, f"{elem}{_dims(shape)}", _bound_json(begin), _bound_json(begin + nvec - 1)
    if isinstance(space, spaces.MultiBinary):
        shape = tuple(int(n) for n in np.atleast_1d(np.asarray(space.n)))
        desc = {"type": "multi_binary", "shape": list(shape)}
        if len(shape) == 1 and not isinstance(space.n, int | np.integer):
            # MultiBinary((21,)) (EnvPool's Jumanji envs) is not equal to MultiBinary(21)
            desc["n_sequence"] = True
        return desc, f"{'u8' if action else 'i8'}{_dims(shape)}", 0, 1
    if isinstance(space, spaces.Dict | spaces.Tuple):
        raise _refuse(space, where, f"an action may be {_ACTIONS}")
    raise _refuse(space, where, action=action)


def describe_spaces(observation_space: Any, action_space: Any) -> tuple[str, str, dict[str, Any]]:
    """The observation field lines, the action field line and the description of both spaces
    (see the module doc)."""
    fields = _Fields()
    observation = fields.tree(observation_space, [], "observation_space")
    desc, type_, low, high = _leaf(action_space, "action_space", action=True)
    line = f'  {{ name = "action", type = "{type_}", role = "action"'
    if low is not None and high is not None:
        line += f", low = {_toml(low)}, high = {_toml(high)}"
    action_line = line + " },"
    description = {"version": 1, "observation": observation, "action": {**desc, "field": "action"}}
    return "\n".join(fields.lines), action_line, description


def act_n_of(action_space: Any) -> int:
    """The env's ``act_n``: a Discrete's n, else the action field's element count."""
    if isinstance(action_space, spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, spaces.MultiBinary):
        return int(np.prod(np.asarray(action_space.n)))
    return int(np.prod(np.asarray(getattr(action_space, "shape", (1,)) or (1,))))


SHM_LAYOUTS = ("slots", "columns")
"""The shm region layouts a derived schema may ask for: per-env slots (the derived layout, the
default) or struct-of-arrays columns (``[env] shm = "columns"``, docs/shm.md)."""


def _text(name: str, result: str, action: str, enum: str, shm_layout: str = "slots") -> str:
    if shm_layout not in SHM_LAYOUTS:
        raise SchemaError(f"shm_layout must be one of {', '.join(SHM_LAYOUTS)}, not {shm_layout!r}")
    shm = 'shm = "columns"\n' if shm_layout == "columns" else ""
    return (
        f"# Derived from gymnasium spaces by transport-schema from-gym: same spaces, same text.\n"
        f'[schema]\nname = "{name}"\nversion = 1\n\n'
        f"[structs.StepResult]\nfields = [\n{result}\n"
        '  { name = "reward", type = "f64", role = "reward" },\n'
        '  { name = "terminated", type = "bool", role = "terminated" },\n'
        '  { name = "truncated", type = "bool", role = "truncated" },\n]\n\n'
        f"[structs.StepRequest]\nfields = [\n{action}\n]\n\n[env]\n{shm}{enum}"
    )


_MAX_PARTS = 2**15
"""The ``GymSpaces`` enum's most values (two bytes of the description each): each value
packs its index in its upper 16 bits, so every value stays below 2**31."""
_KINDS = {"box": "Box", "multi_discrete": "MultiDiscrete", "multi_binary": "MultiBinary"}


def _json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def _leaf_sizes(desc: dict[str, Any], where: str) -> list[tuple[int, str, dict[str, Any]]]:
    """(bytes its element-wise lists take, where it sits, its description) of every leaf."""
    kind = desc["type"]
    if kind == "dict":
        return [leaf for k, d in desc["items"] for leaf in _leaf_sizes(d, f"{where}[{k!r}]")]
    if kind == "tuple":
        return [
            leaf for i, d in enumerate(desc["items"]) for leaf in _leaf_sizes(d, f"{where}[{i}]")
        ]
    lists = [desc[k] for k in ("low", "high", "nvec", "start") if isinstance(desc.get(k), list)]
    return [(sum(_json_size(v) for v in lists), where, desc)]


def _too_long(description: dict[str, Any], size: int) -> str:
    """Why the description is too long: the leaf whose element-wise lists take the most of it,
    and what would make it short."""
    leaves = _leaf_sizes(description["observation"], "observation_space")
    leaves += _leaf_sizes(description["action"], "action_space")
    taken, where, leaf = max(leaves, key=lambda entry: entry[0])
    text = f"the spaces' description is too long ({size} bytes, at most {2 * _MAX_PARTS - 2})"
    if not taken:
        return f"{text}: the spaces have too many leaves; serve fewer"
    kind, shape = _KINDS.get(leaf["type"], leaf["type"]), tuple(leaf.get("shape", ()))
    text += f": {where}, a {kind} of shape {shape}"
    if leaf["type"] != "box":
        return (
            f"{text}, takes {taken} bytes of it (written element by element); serve fewer elements"
        )
    uneven = " and ".join(k for k in ("low", "high") if isinstance(leaf[k], list))
    text = (
        f"{text} and dtype {leaf['dtype']}, takes {taken} bytes of it: its {uneven} "
        f"{'differ' if ' and ' in uneven else 'differs'} between elements, so the description "
        "(which says what the plain schema cannot: a Tuple, a Discrete leaf, a bound infinite "
        "on some elements only, ...) lists them element by element. Give that Box the same low "
        "and the same high on every element"
    )
    if where.startswith("action"):
        return f"{text} (an action wrapper that declares them and maps the actions)"
    return (
        f"{text} (e.g. an observation wrapper declaring Box(-inf, inf, shape)), or, with "
        "finite bounds, serve an observation that is one Box or a Dict of Boxes (the plain "
        "schema carries their bounds, with no description)"
    )


def _enum(description: dict[str, Any]) -> str:
    """The ``GymSpaces`` enum: the description's canonical JSON, two bytes per u32 value
    (``index << 16 | byte0 << 8 | byte1``; an odd length is padded with a space)."""
    data = json.dumps(description, sort_keys=True, separators=(",", ":")).encode("ascii")
    if len(data) % 2:
        data += b" "
    if len(data) // 2 >= _MAX_PARTS:
        raise SchemaError(_too_long(description, len(data)))
    lines = [
        "\n# The exact gymnasium spaces (transport.spaces rebuilds them), packed:",
        f"# {data.decode()}",
        f'[enums.{GYM_SPACES_ENUM}]\ntype = "u32"\n\n[enums.{GYM_SPACES_ENUM}.values]',
    ]
    for i in range(len(data) // 2):
        lines.append(f"s{i} = {(i << 16) | (data[2 * i] << 8) | data[2 * i + 1]}")
    return "\n".join(lines) + "\n"


def schema_toml(
    observation_space: Any, action_space: Any, name: str = "gym_env", shm_layout: str = "slots"
) -> str:
    """The TOML of the env schema of these spaces (see the module doc); a ``SchemaError``
    naming the space and where it sits when one cannot be carried. ``shm_layout="columns"``
    asks for the shm column layout (the wire records are the same)."""
    result, action, description = describe_spaces(observation_space, action_space)
    plain = _text(name, result, action, "", shm_layout)
    if _exact(Schema(compile_schema(plain, f"<{name}>")), observation_space, action_space):
        return plain
    return _text(name, result, action, _enum(description), shm_layout)


def _exact(schema: Schema, observation_space: Any, action_space: Any) -> bool:
    """Whether the plain schema rebuilds exactly these spaces (leaves Box only, one field
    named ``observation`` or a flat Dict whose keys are its field names)."""
    try:
        observation = observation_space_of(schema)
        action = action_space_of(schema, act_n_of(action_space))
    except Exception:
        return False
    if isinstance(observation_space, spaces.Dict) and not all(
        isinstance(s, spaces.Box) for s in observation_space.spaces.values()
    ):
        return False
    return bool(observation == observation_space and action == action_space) and _same_type(
        observation, observation_space
    )


def _same_type(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, spaces.Box):
        return bool(a.dtype == b.dtype and a.shape == b.shape)
    if isinstance(a, spaces.Dict):
        return list(a.spaces) == list(b.spaces) and all(_same_type(a[k], b[k]) for k in a.spaces)
    return True


def schema_of_spaces(
    observation_space: Any, action_space: Any, name: str = "gym_env", shm_layout: str = "slots"
) -> Schema:
    """The compiled schema of ``schema_toml`` (its codecs)."""
    text = schema_toml(observation_space, action_space, name, shm_layout)
    schema = Schema(compile_schema(text, f"<{name}>"))
    # the description must rebuild the spaces it came from (a self-check of this module)
    rebuilt = spaces_from_description(schema)
    if rebuilt is not None and (rebuilt[0] != observation_space or rebuilt[1] != action_space):
        raise SchemaError(
            f"the schema of {observation_space!r} / {action_space!r} does not "
            "rebuild them (a bug of transport.gym_schema)"
        )
    return schema
