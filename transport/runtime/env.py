"""The env interface a server hosts (the same on the Node side), and what it returns."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from transport.codec import Schema
from transport.errors import AdapterError

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
    of the result codec's dtype (copied, not validated). Optional methods:

    - ``reset_into(seed, out)`` and ``step_into(action, out)``: write the result straight into
      ``out``, a record view of the response buffer or shm slot (zero copy; not cleared between
      calls, NaNs not canonicalised), and return None.
    - ``step_batch(actions)``: one action per seat of a multi-player game (seed 000's self-play
      ``stepBatch``), one result per seat. A 1-env server whose env has it answers STEP_MULTI
      by calling it once; the runtime checks the range of every action and that the game was
      reset and is not over, the env checks the rest (each seat's mask).
    - ``observe()``: the env's current result without stepping (OBSERVE); without it the last
      result is answered unchanged.
    - ``info()``: a free-form msgpack-able map (the OBSERVE tail); ``{}`` without it.
    - ``close()``: called when the env is dropped.
    """

    def spaces(self) -> Spaces: ...

    def reset(self, seed: int | None = None) -> StepOutput: ...

    def step(self, action: int) -> StepOutput: ...


EnvFactory = Callable[[], Env]
"""A zero-argument callable making a fresh env (one per env of a client; picklable for workers)."""


Columns = Mapping[str, Any]
"""What a vector env may return from ``reset_envs``/``step_envs``: whole columns by field name,
one row per env of the call (``len(ids)`` rows, or N when ``ids`` is None)."""


@runtime_checkable
class VectorEnv(Protocol):
    """N envs stepped in one call: a NumPy-vectorised env, a ``gymnasium.vector.VectorEnv`` or
    an EnvPool instance behind an adapter (``transport.envs.vector_gym``). The runtime keeps the
    per-env rules (auto-reset, finals, masks, seeds, errors) in NumPy over the result rows and
    calls the env once per request, never once per env.

    - ``num_envs``: N; a server serves it with ``num_envs=N``.
    - ``reset_envs(ids, seeds, out)``: reset envs ``ids`` (a sorted int64 array, each once;
      ``seeds[k]`` is env ``ids[k]``'s seed or None) and write env i's result into ``out[i]``
      (``out``: the (N,) result rows, a record array with the schema's field names, maybe
      strided), or return ``Columns`` (``len(ids)`` rows) for the runtime to write.
    - ``step_envs(actions, ids, out)``: step envs ``ids`` (None: every env) once, env i with
      ``actions[i]`` (an (N, *action shape) array of the action field's dtype, valid during the
      call only), results as for ``reset_envs``. The runtime never steps an env whose episode
      ended unless the env declares ``autoreset_next_step``.

    Optional attributes: ``steps_subsets`` (default True; False: ``step_envs`` is only ever
    called with ``ids=None``, which needs ``autoreset_next_step``), ``autoreset_next_step``
    (default False; True: stepping an env whose episode ended resets it instead, its action
    ignored, and writes its reset result, as gymnasium's NEXT_STEP mode and EnvPool do; the
    runtime then leaves NEXT_STEP resets to the env), ``steps_on_own_threads`` (default False;
    True: a step runs on threads or processes of the env's own, as EnvPool's and an
    ``AsyncVectorEnv``'s do, so an shm server and its client sleep while it steps instead of
    spinning, as for worker processes), ``infos()`` (N info maps for OBSERVE), ``close()``. An
    exception from a call fails every env of that call (each is then reset).
    """

    num_envs: int

    def spaces(self) -> Spaces: ...

    def reset_envs(
        self, ids: np.ndarray, seeds: Sequence[int | None], out: np.ndarray
    ) -> Columns | None: ...

    def step_envs(
        self, actions: np.ndarray, ids: np.ndarray | None, out: np.ndarray
    ) -> Columns | None: ...


def is_vector_env(obj: object) -> bool:
    """True for a vector env instance (``VectorEnv``), not a class or factory of one."""
    return (
        not isinstance(obj, type)
        and callable(getattr(obj, "step_envs", None))
        and callable(getattr(obj, "reset_envs", None))
        and isinstance(getattr(obj, "num_envs", None), int)
    )


def writes_columns(envs: Sequence[object]) -> bool:
    """True when ``envs`` is one vector env that may be handed an shm column region's columns
    as its ``out`` (it declares ``writes_columns = True``: it writes ``out[field][rows]`` and
    whole records ``out[rows] = records``, nothing else of a record array), so a column-layout
    server publishes what it wrote without a copy."""
    return _one_vector_env_declares(envs, "writes_columns")


def steps_on_own_threads(envs: Sequence[object]) -> bool:
    """True when ``envs`` is one vector env that steps on threads or processes of its own
    (``steps_on_own_threads = True``: EnvPool, an ``AsyncVectorEnv``): a waiter that spins while
    it steps takes a core from them (docs/shm.md "Waiting while a pool steps")."""
    return _one_vector_env_declares(envs, "steps_on_own_threads")


def close_env(env: object) -> None:
    """Call ``env.close()`` if it has one, best effort: an env being let go of (a client left,
    or a broken env was replaced) must not fail the request that lets it go."""
    close = getattr(env, "close", None)
    if close is not None:
        try:
            close()
        except Exception:
            pass


def spaces_of(env: Any) -> Spaces:
    """``env.spaces()``, refused with a ``TypeError`` that says what to return when it is not a
    ``Spaces`` (a dict or a tuple reached the runtime as an ``AttributeError`` at each client)."""
    spaces = env.spaces()
    if not isinstance(spaces, Spaces):
        awaited = awaited_text(spaces)
        raise TypeError(
            f"{type(env).__name__}.spaces() {awaited}"
            if awaited
            else f"{type(env).__name__}.spaces() returned {type(spaces).__name__} "
            f"{_short(spaces)}, not a transport.Spaces: return "
            f"transport.Spaces(obs_n=..., act_n=...) (the observation length, and the number "
            f"of discrete actions or the action's element count)"
        )
    return spaces


def check_declared_action(spaces: Spaces, schema: Schema) -> None:
    """An env's ``act_n`` against the Discrete action a schema derived from gymnasium spaces
    declares (``GymSpaces``): the runtime checks actions against ``0..act_n - 1`` while clients
    describe the schema's space, so an env saying 9 for a Discrete(2) schema took action 5.
    node_bridge/src/runtime/env.ts ``checkDeclaredAction``: the same rule and words."""
    from transport.spaces import gym_description_of  # the schema's enum read; no gymnasium

    try:
        described = gym_description_of(schema)
    except AdapterError:
        return  # not readable: the clients cannot describe it either
    action = described.get("action") if described is not None else None
    if not isinstance(action, dict) or action.get("type") != "discrete":
        return
    n = int(action.get("n", -1))
    if n != spaces.act_n:
        raise ValueError(
            f"the env's spaces() say act_n={spaces.act_n}, but schema {schema.name} declares the "
            f"action Discrete({n}): return act_n={n} (actions are checked against 0..act_n - 1)"
        )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def awaited_text(value: object) -> str | None:
    """Why a coroutine (what an ``async def`` env method returns) is refused as a result, the
    text of Node's ``asyncMethodText``; None for any other value. The coroutine is closed (it
    never runs, and Python does not warn that it was never awaited)."""
    if not inspect.isawaitable(value):
        return None
    close = getattr(value, "close", None)
    if close is not None:
        try:
            close()
        except Exception:
            pass
    return (
        "returned a coroutine (is the method async def?), not a result: the server calls env "
        "methods synchronously and never awaits them; make it a plain method that returns the "
        "result, and do asynchronous work elsewhere (before serving: in the factory or at module "
        "load; or on a thread of its own)"
    )


SERVE_THE_OBJECT = (
    "to serve one env object made beforehand, pass the object itself, not a function returning it"
)
"""The server's remedy in ``repeated_env_error`` (gymnasium factories give their own)."""


def repeated_env_error(factory_name: str, what: str, remedy: str) -> ValueError:
    """The refusal of a factory that returned an env object it returned before (``what``: the
    env's type, and how it came back); one text for the server's check and gymnasium's."""
    return ValueError(
        f"the env factory {factory_name} returned an env object it had returned before "
        f"({what}): a factory must make a new env on every call (the server closes the envs it "
        f"made when their client leaves); {remedy}"
    )


def _one_vector_env_declares(envs: Sequence[object], flag: str) -> bool:
    """``envs`` is one vector env whose optional attribute ``flag`` is True (not just truthy)."""
    return len(envs) == 1 and is_vector_env(envs[0]) and getattr(envs[0], flag, False) is True


VectorEnvFactory = Callable[[], VectorEnv]
"""A zero-argument callable making a fresh ``VectorEnv`` (one per client)."""

Served = Env | EnvFactory | VectorEnv | VectorEnvFactory
"""What a server serves: an env, an env factory, a vector env or a vector env factory."""
