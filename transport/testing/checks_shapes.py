"""Contract checks of call shapes (issue 22 item 3): one call, one answer, on every backend.

What ``client.step(x)`` means is decided by the client before any bytes move
(``transport.actions.ActionShapes``): an argument of one env's action shape S is one action (a
1-env server answers without an env axis), one of shape (N, *S) is one action per env (a leading
env axis of N, N = 1 included), anything else is ``ActionError`` naming the action space, what
was given and what to pass. ``shape_matrix`` runs every case of ``SHAPE_CASES`` against a
connected client and compares each answer with the pinned table; ``check_call_shapes`` runs it
on the contract env (Discrete actions) of every scheme and server language, and
tests/test_call_shapes.py runs it on the reference Box and MultiDiscrete envs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from transport.actions import describe_action_space, describe_given
from transport.client import Client
from transport.errors import ActionError, RemoteError
from transport.protocol import body_codec
from transport.testing.checks import SEATS_ENVS, CheckContext, _check
from transport.testing.contract_env import contract_spaces

ONE = "one"
"""Answered as one env's action: the result's fields have no env axis."""
BATCH = "batch"
"""Answered as one action per env: the result's fields have a leading env axis of N."""
SHAPE = "shape"
"""ActionError: neither one action's shape nor one per env's (the message says what to pass)."""
DTYPE = "dtype"
"""ActionError: float values for an integer action field (they would be truncated)."""
RANGE = "range"
"""ActionError: an integer that the action field's type cannot hold."""
NOT_NUMBERS = "not numbers"
"""ActionError: values that are not numbers."""

REASONS = {
    SHAPE: "pass ",
    DTYPE: "would be truncated",
    RANGE: "does not fit the",
    NOT_NUMBERS: "not numbers",
}
"""A text each refusal's message holds after the prefix (what is wrong, or what to pass)."""

TOO_BIG = 2**40
"""An integer no 8-32 bit action field holds (the contract schemas' actions are i32 and u16)."""


@dataclass(frozen=True)
class Space:
    """What a case needs of the action space: one action's shape S, its element dtype, the
    server's envs N."""

    one: tuple[int, ...]
    dtype: np.dtype[Any]
    num_envs: int

    @property
    def integer(self) -> bool:
        return self.dtype.kind in "iu"

    @property
    def batch(self) -> tuple[int, ...]:
        return (self.num_envs, *self.one)

    def key(self) -> str:
        """``D1``/``DN``: one integer per env (Discrete), 1 or N > 1 envs; ``A1``/``AN``: an
        array per env (Box, MultiDiscrete)."""
        return ("D" if self.one == () else "A") + ("1" if self.num_envs == 1 else "N")


@dataclass(frozen=True)
class ShapeCase:
    """One argument of the matrix and the answer pinned for each kind of space."""

    name: str
    make: Callable[[Space], Any]
    expect: Callable[[Space], str]


def _by_key(**answers: str) -> Callable[[Space], str]:
    return lambda space: answers[space.key()]


def _zeros(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return np.zeros(shape, dtype=dtype)


SHAPE_CASES: tuple[ShapeCase, ...] = (
    # a Python int: one Discrete action; never broadcast to a Box (issue 22: step(1) sent [1, 1])
    ShapeCase("int", lambda s: 0, _by_key(D1=ONE, DN=SHAPE, A1=SHAPE, AN=SHAPE)),
    # a Python float: truncated if taken for a Discrete action; no Box action either
    ShapeCase("float", lambda s: 0.5, _by_key(D1=DTYPE, DN=SHAPE, A1=SHAPE, AN=SHAPE)),
    ShapeCase("numpy scalar", lambda s: np.int64(0), _by_key(D1=ONE, DN=SHAPE, A1=SHAPE, AN=SHAPE)),
    ShapeCase("0-d array", lambda s: np.array(0), _by_key(D1=ONE, DN=SHAPE, A1=SHAPE, AN=SHAPE)),
    # issue 22: a batch of one over unix, ProtocolError over shm; now a batch of one everywhere
    ShapeCase(
        "shape (1,)",
        lambda s: _zeros((1,), s.dtype),
        _by_key(D1=BATCH, DN=SHAPE, A1=SHAPE, AN=SHAPE),
    ),
    ShapeCase(
        "one action, shape S",
        lambda s: _zeros(s.one, s.dtype),
        _by_key(D1=ONE, DN=SHAPE, A1=ONE, AN=SHAPE),
    ),
    ShapeCase("one per env, shape (N, *S)", lambda s: _zeros(s.batch, s.dtype), lambda s: BATCH),
    ShapeCase(
        "list, one per env",
        lambda s: _zeros(s.batch, s.dtype).tolist(),
        lambda s: BATCH,
    ),
    ShapeCase(
        "wrong N, shape (N + 1, *S)",
        lambda s: _zeros((s.num_envs + 1, *s.one), s.dtype),
        lambda s: SHAPE,
    ),
    # issue 22: "cannot reshape array of size 3 into shape (2,)"
    ShapeCase(
        "wrong action size, shape (N, *S + 1)",
        lambda s: (
            _zeros((s.num_envs, *(d + 1 for d in s.one)), s.dtype)
            if s.one
            else _zeros((s.num_envs, 2), s.dtype)
        ),
        lambda s: SHAPE,
    ),
    ShapeCase(
        "extra axis, shape (N, *S, 1)",
        lambda s: _zeros((*s.batch, 1), s.dtype),
        lambda s: SHAPE,
    ),
    # floats for integers are refused (lossy), integers for floats taken (safe)
    ShapeCase(
        "other kind: floats for integers, integers for floats",
        lambda s: _zeros(s.batch, np.float64 if s.integer else np.int64),
        lambda s: DTYPE if s.integer else BATCH,
    ),
    ShapeCase("narrow integers (int8)", lambda s: _zeros(s.batch, np.int8), lambda s: BATCH),
    ShapeCase(
        "float64 for float32 (rounds, as gymnasium's Box)",
        lambda s: _zeros(s.batch, np.float64),
        lambda s: DTYPE if s.integer else BATCH,
    ),
    ShapeCase(
        "an integer the field cannot hold",
        lambda s: np.full(s.batch, TOO_BIG if s.integer else 0, dtype=np.int64),
        lambda s: RANGE if s.integer else BATCH,
    ),
    ShapeCase(
        "strings",
        lambda s: np.full(s.batch, "a"),
        lambda s: NOT_NUMBERS,
    ),
)
"""The call-shape matrix: scalar, 0-d array, shape (1,), shape (N,), wrong N, wrong dtype."""


def space_of(client: Client) -> Space:
    """The action shape, dtype and envs of ``client``'s server."""
    codec = body_codec(client.schema, "STEP_REQ")
    field = codec.ir.role("action")
    assert field is not None, "the STEP_REQ body has no action field"
    one = field.dims if field.is_array else ()
    return Space(one, np.dtype(codec.dtype[field.name].base), client.num_envs)


def shape_matrix(client: Client, space_text: str, *, seed: int = 7) -> list[str]:
    """Run every case of ``SHAPE_CASES`` on ``client`` (a reset before each accepted step);
    the answers that differ from the pinned ones, one line each (empty: all as pinned).
    ``space_text``: how the action space must be named (``describe_action_space``)."""
    space = space_of(client)
    envs = f"{space.num_envs} env" + ("" if space.num_envs == 1 else "s")
    problems: list[str] = []
    for case in SHAPE_CASES:
        value = case.make(space)
        want = case.expect(space)
        where = f"{case.name} ({describe_given(value)}) on {space_text} x {space.num_envs}"
        if want in (ONE, BATCH):
            client.reset(seed)
        try:
            view = client.step(value)
        except ActionError as exc:
            text = str(exc)
            prefix = f"step(): {describe_given(value)} is not an action for {space_text} ({envs}): "
            if want in (ONE, BATCH):
                problems.append(f"{where}: refused ({text}), expected {want}")
            elif not text.startswith(prefix):
                problems.append(f"{where}: message {text!r} does not start with {prefix!r}")
            elif REASONS[want] not in text[len(prefix) :]:
                problems.append(f"{where}: message {text!r} does not say {REASONS[want]!r}")
            continue
        except RemoteError as exc:
            problems.append(f"{where}: the server refused it ({exc}), expected {want}")
            continue
        except Exception as exc:  # a raw NumPy / TypeError / ProtocolError is the bug itself
            problems.append(f"{where}: {type(exc).__name__}: {exc}, expected {want}")
            continue
        shape = view.record.shape
        got = ONE if shape == () else BATCH if shape == (space.num_envs,) else f"shape {shape}"
        if got != want:
            problems.append(f"{where}: answered {got} (results of shape {shape}), expected {want}")
    return problems


@_check(per_schema=True)
def check_call_shapes(ctx: CheckContext) -> None:
    """Every call shape (scalar, 0-d array, shape (1,), (N,), wrong N, wrong dtype) gets the
    pinned answer on a 1-env and an N-env server: one action, one per env, or ActionError
    naming the action space (client-side, so every backend and server language agrees)."""
    space_text = describe_action_space(ctx.schema, contract_spaces(ctx.schema).act_n)
    problems: list[str] = []
    for num_envs in (1, SEATS_ENVS):  # the servers the other checks share
        with ctx.connect(ctx.server(num_envs)) as client:
            problems += shape_matrix(client, space_text)
    assert not problems, f"{len(problems)} call shapes answered otherwise: " + "; ".join(
        problems[:6]
    )
