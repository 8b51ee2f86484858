"""A server env wrapping one gymnasium env (``transport.serve_gym``, ``transport-serve --gym``).

The runtime auto-resets (next_step, same_step or disabled, as each client asks), so this
wraps ONE gymnasium env without its vector machinery: ``reset(seed)`` is the env's
``reset(seed=seed)`` with reward 0 and both flags false, ``step(action)`` its ``step``. The
observation is flattened into the fields of the schema ``transport.gym_schema`` derives from
the env's spaces, and the action converted back to the space's own type (a Discrete start, a
MultiBinary's int8, a Box's dtype and shape). gymnasium's ``info`` dicts are not carried.
``info()`` returns the env's rgb_array frame when it renders (``render_mode="rgb_array"``).

The server calls ``step_into``/``reset_into``: each observation leaf that is an array of the
field's own dtype and the space's shape (what a well-behaved env returns) is stored straight
into the result record, NaNs made canonical; anything else (a list, another dtype, a wrong
shape) goes back as the validated mapping ``step`` returns, so the errors stay the codec's.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium
import numpy as np

from transport.envs.in_place import RecordPlan
from transport.errors import AdapterError
from transport.gym_schema import act_n_of, describe_spaces
from transport.runtime.env import Spaces, repeated_env_error

GymSource = str | Callable[[], Any]
"""A gymnasium env id (``gymnasium.make(id, **kwargs)``) or a zero-argument factory."""


PLUGIN_NAMESPACES = {"ALE": "ale_py"}
"""Env id namespaces whose envs gymnasium knows only once their package registers them
(``gymnasium.register_envs(ale_py)``): a user types ``ALE/Pong-v5`` as in gymnasium's docs."""


def register_plugin_envs(env_id: str) -> None:
    """Register the envs of the package behind ``env_id``'s namespace (``ALE/...``: ale_py)
    when gymnasium does not know the id yet; nothing when the package is not installed (then
    gymnasium's own error says what is missing)."""
    namespace, slash, _ = env_id.rpartition(":")[2].partition("/")
    module_name = PLUGIN_NAMESPACES.get(namespace) if slash else None
    if module_name is None or env_id in gymnasium.registry:
        return
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return
    gymnasium.register_envs(module)


def make_gym_env(source: GymSource, gym_kwargs: Mapping[str, Any] | None = None) -> Any:
    """The gymnasium env of an id (made with ``gym_kwargs``) or of a factory. An id gymnasium
    cannot make, or a source that is neither an id nor callable (an env instance: the server
    makes each of its envs, in worker processes too), is an ``AdapterError`` saying why."""
    if isinstance(source, str):
        kwargs = dict(gym_kwargs or {})
        register_plugin_envs(source)
        try:
            return gymnasium.make(source, **kwargs)
        except Exception as exc:  # an unknown id, a module that does not import, bad kwargs
            shown = f", **{kwargs!r}" if kwargs else ""
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise AdapterError(
                f"gymnasium.make({source!r}{shown}) failed: {type(exc).__name__}: {text}"
            ) from exc
    if not callable(source):
        raise AdapterError(
            f"a gymnasium env is served from an env id or a zero-argument factory, not "
            f"{type(source).__name__} {source!r}: the server makes each of its envs (in worker "
            f'processes too), e.g. serve_gym("CartPole-v1", url) or serve_gym(lambda: '
            f"MyWrapper(gymnasium.make(...)), url) (a module-level function for workers)"
        )
    if gym_kwargs:
        return source(**dict(gym_kwargs))
    return source()


class GymFactory:
    """The server's factory of ``GymEnv`` (``gym_factory``): each call makes one gymnasium env
    from ``source`` and refuses, as the server refuses a factory that returns an env it
    returned before (``transport.runtime.host``), one whose base env (``env.unwrapped``) this
    factory made before: ``lambda: env`` over one env made beforehand, or new wrappers around
    it, would have every env of a connection step the same env. The server never sees that
    repeat itself, since each call's ``GymEnv`` is new. Picklable when ``source`` is an env id
    or a module-level factory (worker processes, Ray): each copy remembers its own envs."""

    def __init__(self, source: GymSource, gym_kwargs: Mapping[str, Any] | None = None) -> None:
        self.source = source
        self.gym_kwargs = dict(gym_kwargs) if gym_kwargs else None
        self._made: weakref.WeakSet[Any] = weakref.WeakSet()  # envs made and their bases, alive

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source, "gym_kwargs": self.gym_kwargs}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["source"], state["gym_kwargs"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"GymFactory({self.source!r}, {self.gym_kwargs!r})"

    def make(self) -> Any:
        """One new gymnasium env (the ``ValueError`` above when it is not new)."""
        env = make_gym_env(self.source, self.gym_kwargs)
        base = getattr(env, "unwrapped", env)
        try:
            again, same = base in self._made, env in self._made
            self._made.update((base, env))
        except TypeError:  # not weakly referenceable or not hashable: not tracked
            return env
        if again:
            source = self.source
            name = (
                f"gymnasium.make({source!r})"
                if isinstance(source, str)
                else getattr(source, "__qualname__", None) or type(source).__qualname__
            )
            inside = "" if same else ", inside new wrappers"
            raise repeated_env_error(
                name,
                f"{type(base).__qualname__}{inside}",
                "make the gymnasium env inside the factory (lambda: gymnasium.make(...), or an "
                "env id), not once before it",
            )
        return env

    def __call__(self) -> GymEnv:
        return GymEnv.wrapping(self.make())


class GymEnv:
    """One gymnasium env behind the server's Env interface (see the module doc)."""

    _out: Any = None  # the record ``_plan`` stores into (kept: its id cannot be reused)
    _plan: RecordPlan | None = None

    def __init__(self, source: GymSource, gym_kwargs: Mapping[str, Any] | None = None) -> None:
        self._wrap(make_gym_env(source, gym_kwargs))

    @classmethod
    def wrapping(cls, env: Any) -> GymEnv:
        """A ``GymEnv`` of a gymnasium env already made (``GymFactory`` makes it first, to
        check that it is a new one)."""
        self = cls.__new__(cls)
        self._wrap(env)
        return self

    def _wrap(self, env: Any) -> None:
        self.env = env
        _, _, description = describe_spaces(self.env.observation_space, self.env.action_space)
        self._observation = description["observation"]
        self._action = description["action"]
        self._spaces = Spaces(self._obs_n(), act_n_of(self.env.action_space))

    def _obs_n(self) -> int:
        return sum(int(np.prod(s.shape or (1,))) for s in _leaf_spaces(self.env.observation_space))

    def spaces(self) -> Spaces:
        return self._spaces

    def _fields(self, desc: dict[str, Any], value: Any, out: dict[str, Any]) -> None:
        kind = desc["type"]
        if kind == "dict":
            for key, sub in desc["items"]:
                self._fields(sub, value[key], out)
        elif kind == "tuple":
            for sub, item in zip(desc["items"], value, strict=True):
                self._fields(sub, item, out)
        else:
            array = np.asarray(value)
            out[desc["field"]] = array.item() if array.ndim == 0 else array  # a scalar field

    def _result(self, obs: Any, reward: Any, terminated: Any, truncated: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        try:
            self._fields(self._observation, obs, out)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ValueError(
                f"the gymnasium env returned an observation that does not fit its "
                f"observation_space {self.env.observation_space!r}: {exc!r}"
            ) from None
        out["reward"] = float(reward)
        out["terminated"] = bool(terminated)
        out["truncated"] = bool(truncated)
        return out

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        obs, _info = self.env.reset(seed=seed)
        return self._result(obs, 0.0, False, False)

    def step(self, action: Any) -> dict[str, Any]:
        obs, reward, terminated, truncated, _info = self.env.step(self._convert(action))
        return self._result(obs, reward, terminated, truncated)

    def reset_into(self, seed: int | None, out: np.ndarray) -> dict[str, Any] | None:
        """``reset`` written into the record ``out`` (see the module doc)."""
        obs, _info = self.env.reset(seed=seed)
        return self._write(out, obs, 0.0, False, False)

    def step_into(self, action: Any, out: np.ndarray) -> dict[str, Any] | None:
        """``step`` written into the record ``out`` (see the module doc)."""
        obs, reward, terminated, truncated, _info = self.env.step(self._convert(action))
        return self._write(out, obs, reward, terminated, truncated)

    def _write(
        self, out: np.ndarray, obs: Any, reward: Any, terminated: Any, truncated: Any
    ) -> dict[str, Any] | None:
        """Store a result in ``out``; the mapping instead where a leaf is not stored as is."""
        if out is not self._out:
            self._out, self._plan = out, RecordPlan.of(out, self._observation)
        plan = self._plan
        if plan is None or not plan.store_result(obs, reward, terminated, truncated):
            return self._result(obs, reward, terminated, truncated)
        return None

    def _convert(self, action: Any) -> Any:
        """The wire action as the action space's own value."""
        desc = self._action
        kind = desc["type"]
        if kind == "discrete":
            if type(action) is int:  # the runtime's values: plain ints
                return action
            return int(np.asarray(action).reshape(-1)[0])
        if kind == "multi_binary":
            return np.asarray(action, dtype=np.int8).reshape(desc["shape"])
        return np.asarray(action, dtype=np.dtype(desc["dtype"])).reshape(desc["shape"])

    def info(self) -> dict[str, Any]:
        """The env's rgb_array frame (``{"frame": bytes, "frame_shape": [h, w, 3]}``) when it
        renders; ``{}`` otherwise."""
        if getattr(self.env, "render_mode", None) != "rgb_array":
            return {}
        frame = np.ascontiguousarray(self.env.render(), dtype=np.uint8)
        return {"frame": frame.tobytes(), "frame_shape": list(frame.shape)}

    def close(self) -> None:
        self.env.close()


def _leaf_spaces(space: Any) -> list[Any]:
    if isinstance(space, gymnasium.spaces.Dict):
        return [leaf for sub in space.spaces.values() for leaf in _leaf_spaces(sub)]
    if isinstance(space, gymnasium.spaces.Tuple):
        return [leaf for sub in space.spaces for leaf in _leaf_spaces(sub)]
    return [space]
