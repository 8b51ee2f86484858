"""Results written straight into a result record by env adapters (``GymEnv``, the PettingZoo
AEC server env): the bytes the codec's mapping path would write, without its per-value checks,
for values that need none (arrays of the field's own dtype and shape, plain ints in i64 fields);
anything else goes back to the mapping path, validated as before."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from transport import native

_SCREEN_FLOATS = native.lib.tp_screen_floats
_INF = math.inf
_EXACT_INTS = (int, np.int64)  # a Discrete leaf's value stored as is in its i64 field
_I64 = np.dtype(np.int64)


class RecordPlan:
    """Where each observation leaf of one result record goes: a view of its field in the
    space's shape, stored into only from an array of exactly that dtype and shape (a Discrete
    leaf: an int or np.int64), so the bytes are those the codec would write, minus its checks."""

    __slots__ = ("leaves", "reward", "terminated", "truncated")

    def __init__(
        self, leaves: list[tuple[tuple[Any, ...], np.ndarray, Any, bool]], out: np.ndarray
    ):
        self.leaves = leaves
        self.reward = out["reward"]
        self.terminated = out["terminated"]
        self.truncated = out["truncated"]

    @classmethod
    def of(cls, out: Any, observation: dict[str, Any]) -> RecordPlan | None:
        """The plan of record ``out`` (a writable 0-d record of the derived schema), or None
        where a field is not laid out for it (then every result goes as a mapping)."""
        if not isinstance(out, np.ndarray) or out.ndim != 0 or not out.flags.writeable:
            return None
        names = out.dtype.names or ()
        if not {"reward", "terminated", "truncated"} <= set(names):
            return None
        leaves: list[tuple[tuple[Any, ...], np.ndarray, Any, bool]] = []
        for path, desc in leaf_paths(observation, ()):
            if desc["field"] not in names:
                return None
            field = out[desc["field"]]
            shape = () if desc["type"] == "discrete" else tuple(desc["shape"])
            view = field.reshape(shape)
            if not np.shares_memory(view, field) or not view.flags.c_contiguous:
                return None
            screen = None
            if view.dtype.kind == "f" and view.dtype.itemsize in (4, 8) and view.size:
                address = view.__array_interface__["data"][0]
                screen = (native.ffi.cast("char *", address), view.size, view.dtype.itemsize)
            leaves.append((path, view, screen, view.ndim == 0 and view.dtype == _I64))
        return cls(leaves, out)

    def store_result(self, obs: Any, reward: Any, terminated: Any, truncated: Any) -> bool:
        """Store a whole result (reward as a float, its NaN canonical; flags as bools); False
        where ``store`` refuses the observation (then the result goes as a mapping)."""
        if not self.store(obs):
            return False
        reward = float(reward)
        self.reward[...] = reward if reward == reward else math.nan  # the canonical NaN
        self.terminated[...] = bool(terminated)
        self.truncated[...] = bool(truncated)
        return True

    def store(self, obs: Any) -> bool:
        """Store every leaf of ``obs``; False (some leaves maybe stored) where one is not an
        array of its field's dtype and shape, a Discrete leaf is not an int in range, or
        ``obs`` lacks a leaf's key or index."""
        for path, view, screen, int_scalar in self.leaves:
            value = obs
            try:
                for key in path:
                    value = value[key]
            except (LookupError, TypeError, ValueError):  # not the space's structure: the
                return False  # mapping path says so (a missing Dict key, a short Tuple)
            if type(value) is np.ndarray:  # exactly: a subclass may behave otherwise
                if value.dtype != view.dtype or value.shape != view.shape:
                    return False
                view[...] = value
                if screen is not None and not _SCREEN_FLOATS(
                    screen[0], 0, 1, screen[1], screen[2], -_INF, _INF, 0, 0
                ):  # a NaN: written as the canonical quiet NaN, as the codec does
                    np.copyto(view, np.nan, where=np.isnan(view))
            elif int_scalar and type(value) in _EXACT_INTS:
                try:
                    view[...] = value
                except OverflowError:
                    return False
            else:
                return False
        return True


def leaf_paths(desc: dict[str, Any], path: tuple[Any, ...]) -> list[tuple[tuple[Any, ...], Any]]:
    """(keys from the observation to the leaf, the leaf's description) of every leaf."""
    if desc["type"] == "dict":
        return [leaf for key, sub in desc["items"] for leaf in leaf_paths(sub, (*path, key))]
    if desc["type"] == "tuple":
        return [leaf for i, sub in enumerate(desc["items"]) for leaf in leaf_paths(sub, (*path, i))]
    return [(path, desc)]
