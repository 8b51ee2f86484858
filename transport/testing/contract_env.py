"""ContractEnv: a deterministic env for any env schema, the server side of the contract suite.

Its results are a pure function of (seed, episode counter, step count, last action), written
byte by byte from the schema's layout, so a test can predict every byte a server sends. The
Node twin (node_bridge/src/envs/contract.ts) follows the same rules and produces identical
bytes (tests/test_contract.py checks it over every built-in schema). The rules:

- ``mix32`` is the "lowbias32" integer hash; all arithmetic is modulo 2**32.
- State: ``seed`` (u64, 0 before any seeded reset), ``episode`` (-1 before the first reset),
  ``step`` and ``last_action``. ``reset(seed)`` sets the seed and episode 0; ``reset(None)``
  increments the episode; both set step 0 and last action 0xFFFFFFFF. ``step(a)`` increments
  step and records ``a``.
- ``episode_key = mix32(lo ^ mix32(hi ^ mix32(episode + GOLDEN)))`` with lo/hi the seed's
  32-bit halves; the episode's length is ``2 + episode_key % 6``; one longer than
  ``TRUNCATE_AT`` (5) ends by truncation at step 5, else by termination at its length.
- ``step_key = mix32(episode_key ^ mix32(step ^ mix32(last_action)))``; element j of the result
  (every scalar element, depth first in declaration order, nested structs and arrays included)
  gets ``h = mix32(step_key + (j + 1) * GOLDEN)``.
- Values from h: floats ``(h % 2048 - 1024) / 8`` (exact in f32); bools ``h & 1``; integers the
  low bytes of h (u64/i64: h zero-extended); enums the ``h % n``-th declared value in ascending
  order. Roles override: ``action_mask[a]`` is 1 for a = 0 and a = POISON_ACTION, 0 for
  a = act_n - 1, else ``h % 4 != 0``; ``done`` is 1 on the last step of an episode,
  ``terminated`` / ``truncated`` 1 on the last step when it ended that way; else 0.
- ``step(POISON_ACTION)`` raises ``PoisonActionError`` and changes nothing (ENV_ERROR tests).
- An array action (Box, MultiDiscrete) stands for its first element as an integer
  (``action_number``): the checks send arrays filled with the integer they picked.
- ``spaces()``: (elements of the observation role field, elements of the action_mask role
  field, or DEFAULT_ACT_N without a mask).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from transport.codec import Schema, StructCodec
from transport.errors import SchemaError
from transport.runtime.env import Spaces
from transport.schema.ir import SCALARS, SchemaIR, StructIR

GOLDEN = 0x9E3779B9
"""The 32-bit golden-ratio constant that spreads consecutive inputs before hashing."""
POISON_ACTION = 1
"""A step with this action raises (always allowed by the mask): the env-error checks use it."""
TRUNCATE_AT = 5
"""Episodes longer than this many steps end by truncation at this step."""
DEFAULT_ACT_N = 16
"""The action count of a schema whose result has no action_mask role field."""
RESET_ACTION = 0xFFFFFFFF
"""The ``last_action`` a reset result is computed with."""

_M32 = 0xFFFFFFFF
_ROLE_OVERRIDES = ("action_mask", "done", "terminated", "truncated")


class PoisonActionError(RuntimeError):
    """Raised by ``ContractEnv.step(POISON_ACTION)``."""


def mix32(x: int) -> int:
    """lowbias32: a 32-bit integer hash (the TypeScript twin uses Math.imul)."""
    x &= _M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    x ^= x >> 16
    return x


def _mix32_array(x: np.ndarray) -> np.ndarray:
    """``mix32`` over a uint32 array (wrap-around multiplication)."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    out: np.ndarray = x ^ (x >> np.uint32(16))
    return out


@dataclass(frozen=True)
class _Leaf:
    """Scalar elements at one place of the result: ``count`` elements from ``offset``."""

    offset: int  # absolute byte offset in the result
    count: int
    size: int  # bytes per element
    kind: str  # "int" | "float" | "bool" | "enum"
    elem: str  # scalar type (enums: their underlying type)
    first: int  # index j of the first element
    role: str | None  # a top-level role that overrides the hashed values
    enum_values: tuple[int, ...] = ()


def _leaves(ir: SchemaIR, struct: StructIR) -> list[_Leaf]:
    """Every scalar run of ``struct``, depth first in declaration order, with element numbers."""
    leaves: list[_Leaf] = []
    counter = 0

    def walk(s: StructIR, base: int, top: bool) -> None:
        nonlocal counter
        for f in s.fields:
            if f.kind == "struct":
                inner = ir.structs[f.elem]
                for k in range(f.count):
                    walk(inner, base + f.offset + k * f.elem_size, False)
                continue
            enum_values: tuple[int, ...] = ()
            elem = f.elem
            if f.kind == "enum":
                enum = ir.enums[f.elem]
                enum_values = tuple(sorted(enum.values.values()))
                elem = enum.type
            role = f.role if top and f.role in _ROLE_OVERRIDES else None
            leaves.append(
                _Leaf(
                    base + f.offset,
                    f.count,
                    SCALARS[elem],
                    f.kind,
                    elem,
                    counter,
                    role,
                    enum_values,
                )
            )
            counter += f.count

    walk(struct, 0, True)
    return leaves


def result_codec(schema: Schema) -> StructCodec:
    """The codec of the schema's STEP_RESP body (the result struct)."""
    body = schema.ir.messages["STEP_RESP"].body
    if body is None:
        raise ValueError(f"schema {schema.name}: STEP_RESP has no body struct")
    return schema[body]


def action_number(action: Any) -> int:
    """The integer an action stands for: a Discrete action's value; an array action's (Box,
    MultiDiscrete) first element (the checks send arrays filled with one integer)."""
    if isinstance(action, int | np.integer):
        return int(action)
    return int(np.asarray(action).reshape(-1)[0])


def contract_spaces(schema: Schema) -> Spaces:
    """What ``ContractEnv(schema).spaces()`` answers."""
    result = result_codec(schema).ir
    obs = result.role("observation")
    mask = result.role("action_mask")
    return Spaces(obs.count if obs else 0, mask.count if mask else DEFAULT_ACT_N)


class ContractEnv:
    """The deterministic contract env for ``schema`` (see the module docstring for the rules)."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.codec = result_codec(schema)
        self._leaves = _leaves(schema.ir, self.codec.ir)
        self._elements = sum(leaf.count for leaf in self._leaves)
        self._steps = np.arange(1, self._elements + 1, dtype=np.uint32) * np.uint32(GOLDEN)
        self._spaces = contract_spaces(schema)
        self.seed = 0
        self.episode = -1
        self.step_count = 0
        self.last_action = RESET_ACTION
        self.episode_key = 0

    def spaces(self) -> Spaces:
        return self._spaces

    def reset(self, seed: int | None = None) -> np.ndarray:
        if seed is None:
            self.episode += 1
        else:
            self.seed = int(seed) & 0xFFFFFFFFFFFFFFFF
            self.episode = 0
        lo, hi = self.seed & _M32, self.seed >> 32
        self.episode_key = mix32(lo ^ mix32(hi ^ mix32(self.episode + GOLDEN)))
        self.step_count = 0
        self.last_action = RESET_ACTION
        return self._result()

    def step(self, action: Any) -> np.ndarray:
        value = action_number(action)
        if value == POISON_ACTION:
            raise PoisonActionError(f"poison action {POISON_ACTION} (the contract env raises)")
        self.step_count += 1
        self.last_action = value & _M32
        return self._result()

    def episode_end(self) -> tuple[bool, bool]:
        """(terminated, truncated) of the current step."""
        length = 2 + self.episode_key % 6
        if length > TRUNCATE_AT:
            return False, self.step_count >= TRUNCATE_AT
        return self.step_count >= length, False

    def _result(self) -> np.ndarray:
        """A fresh record of the result struct holding this state's bytes."""
        step_key = mix32(self.episode_key ^ mix32(self.step_count ^ mix32(self.last_action)))
        hashes = _mix32_array(self._steps + np.uint32(step_key))
        terminated, truncated = self.episode_end()
        ends = {"done": terminated or truncated, "terminated": terminated, "truncated": truncated}
        buffer = bytearray(self.codec.size)
        act_n = self._spaces.act_n
        for leaf in self._leaves:
            h = hashes[leaf.first : leaf.first + leaf.count]
            if leaf.role == "action_mask":
                values: Any = (h % np.uint32(4) != 0).astype(np.uint8)
                values[0] = 1
                if POISON_ACTION < leaf.count:
                    values[POISON_ACTION] = 1
                if act_n - 1 < leaf.count:
                    values[act_n - 1] = 0
                self._write(buffer, leaf, values)
            elif leaf.role is not None:
                self._write(buffer, leaf, np.full(leaf.count, int(ends[leaf.role])))
            elif leaf.kind == "float":
                self._write(buffer, leaf, ((h % np.uint32(2048)).astype(np.int64) - 1024) / 8)
            elif leaf.kind == "bool":
                self._write(buffer, leaf, h & np.uint32(1))
            elif leaf.kind == "enum":
                choices = np.array(leaf.enum_values, dtype=np.int64)
                self._write(buffer, leaf, choices[h % np.uint32(len(choices))])
            else:  # integers: the low bytes of h, zero-extended to 64 bits
                self._write_bytes(buffer, leaf, h)
        record: np.ndarray = self.codec.view(buffer)
        return record

    @staticmethod
    def _write(buffer: bytearray, leaf: _Leaf, values: np.ndarray) -> None:
        """Write values as the leaf's element type (floats as floats, others as integers)."""
        if leaf.kind == "float":
            dtype = np.dtype(f"<f{leaf.size}")
        else:
            signed = leaf.elem.startswith("i")
            dtype = np.dtype(f"<{'i' if signed else 'u'}{leaf.size}")
        target = np.ndarray((leaf.count,), dtype=dtype, buffer=buffer, offset=leaf.offset)
        target[:] = values

    @staticmethod
    def _write_bytes(buffer: bytearray, leaf: _Leaf, h: np.ndarray) -> None:
        """Integers: the low ``size`` bytes of each hash (8-byte integers: zero-extended)."""
        dtype = np.dtype(f"<u{leaf.size}")
        target = np.ndarray((leaf.count,), dtype=dtype, buffer=buffer, offset=leaf.offset)
        target[:] = (h & np.uint32((1 << (8 * min(leaf.size, 4))) - 1)).astype(dtype)


def schema_named(name_or_file: str | os.PathLike[str]) -> Schema:
    """A schema by generated module name (``pac_env``, ``tetris``, ``mahjong_env``) or file."""
    import importlib

    text = os.fspath(name_or_file)
    if os.path.isfile(text):
        from transport import load_schema

        return load_schema(text)
    stem, suffix = os.path.splitext(os.path.basename(text))
    if suffix in (".toml", ".js"):  # schema/NAME.toml stands for NAME (the Node CLI's rule)
        text = stem
    if not text.isidentifier():
        raise SchemaError(f"schema {text!r}: no such file, and not a built-in schema name")
    try:
        module = importlib.import_module(f"transport.generated.{text}")
    except ImportError:
        raise SchemaError(
            f"schema {text!r}: no such file, and not a built-in schema name"
        ) from None
    schema: Schema = module.SCHEMA
    return schema


def contract_factory(schema: Schema) -> Callable[[], ContractEnv]:
    """A zero-argument factory of ContractEnv for ``schema`` (what a server is handed)."""
    return functools.partial(ContractEnv, schema)
