"""Serve a gymnasium env without writing a schema: ``transport.serve_gym(env_id, url)``.

The schema is derived from the env's ``observation_space`` and ``action_space``
(``transport.gym_schema``: deterministic, the same spaces give the same fingerprint) and
clients discover it in the handshake, so a trainer needs no schema file:
``transport.gym.RemoteVectorEnv(url)`` has the env's exact spaces. Each env of a connection
is one gymnasium env (``transport.envs.gym_env.GymEnv``); the runtime auto-resets as the
client asks (next_step, same_step, disabled), so trajectories (observations, rewards, flags)
equal gymnasium's ``SyncVectorEnv`` on the same seeds; the env's ``info`` dicts are not
carried (docs/gym.md, "What is not carried").
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

from transport.api import Server, ServerLimits, serve
from transport.codec import Schema
from transport.envs.gym_env import GymFactory, GymSource, make_gym_env
from transport.errors import AdapterError
from transport.gym_schema import schema_of_spaces, schema_toml
from transport.protocol import DEFAULT_MAX_BODY
from transport.schema.rules import check_schema_name


def gym_schema_name(source: GymSource) -> str:
    """The schema's name (not part of the fingerprint): the env id as an identifier
    (``CartPole-v1`` -> ``CartPole_v1``), else ``gym_env``."""
    raw = source if isinstance(source, str) else getattr(source, "__name__", "")
    name = re.sub(r"[^A-Za-z0-9_]", "_", raw.rpartition(":")[2] or raw)[:64]
    ok = bool(re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name))
    return name if ok and check_schema_name(name, envelope=False) is None else "gym_env"


def _source_name(source: GymSource) -> str:
    """How an error names the source: ``gymnasium.make('Id')``, else the factory's name."""
    if isinstance(source, str):
        return f"gymnasium.make({source!r})"
    return getattr(source, "__qualname__", None) or type(source).__qualname__


def check_factory_kwargs(source: GymSource, gym_kwargs: Mapping[str, Any] | None) -> None:
    """A factory gets ``gym_kwargs`` as keyword arguments (an env id: ``gymnasium.make``'s):
    one whose signature does not take them is an ``AdapterError`` naming it and them, as an
    id with a bad kwarg is, not a bare TypeError (a factory without a signature: not checked)."""
    if not gym_kwargs or isinstance(source, str) or not callable(source):
        return
    try:
        signature = inspect.signature(source)
    except (TypeError, ValueError):  # a builtin or C callable: its call says
        return
    try:
        signature.bind(**gym_kwargs)
    except TypeError as exc:
        raise AdapterError(
            f"{_source_name(source)}(**{dict(gym_kwargs)!r}) cannot be called: {exc}: a "
            "factory gets gym_kwargs as keyword arguments; give it parameters of those names, "
            "or drop gym_kwargs"
        ) from None


class SameSpacesFactory(GymFactory):
    """``GymFactory`` whose envs must all have the spaces of its first (the schema is derived
    from them, and every env of a server speaks it): a later env with another
    ``observation_space`` or ``action_space`` is an ``AdapterError`` naming both, as
    gymnasium's ``SyncVectorEnv`` refuses sub-envs whose spaces differ. The first env's spaces
    travel with a pickled copy (worker processes, Ray), so its envs are checked against them."""

    def __init__(
        self,
        source: GymSource,
        gym_kwargs: Mapping[str, Any] | None = None,
        spaces: tuple[Any, Any] | None = None,
    ) -> None:
        check_factory_kwargs(source, gym_kwargs)
        super().__init__(source, gym_kwargs)
        self.spaces = spaces  # (observation_space, action_space) of the first env made

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "spaces": self.spaces}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["source"], state["gym_kwargs"], state.get("spaces"))  # type: ignore[misc]

    def make(self) -> Any:
        """One new gymnasium env with the first env's spaces (``AdapterError`` otherwise)."""
        env = super().make()
        found = (env.observation_space, env.action_space)
        if self.spaces is None:
            self.spaces = found
            return env
        differ = [
            f"{name} {new!r} (the first env's: {first!r})"
            for name, new, first in zip(
                ("observation_space", "action_space"), found, self.spaces, strict=True
            )
            if new != first
        ]
        if differ:
            env.close()
            raise AdapterError(
                f"the env factory {_source_name(self.source)} made an env whose spaces differ "
                f"from those of its first env, from which the served schema was derived: "
                f"{'; '.join(differ)}. Every env of a server must have the same spaces "
                "(gymnasium's vector envs refuse such sub-envs too): make the factory's envs "
                "alike"
            )
        return env


def _spaces_of(
    source: GymSource, gym_kwargs: Mapping[str, Any] | None, factory: GymFactory | None = None
) -> tuple[Any, Any]:
    """The env's spaces, from one env made (by ``factory`` when given: it then knows the env,
    and refuses it if the source hands it out again) and closed."""
    if factory is None:
        check_factory_kwargs(source, gym_kwargs)
    env = make_gym_env(source, gym_kwargs) if factory is None else factory.make()
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def gym_schema_toml(
    source: GymSource, gym_kwargs: Mapping[str, Any] | None = None, shm_layout: str = "slots"
) -> str:
    """The TOML of a gymnasium env's derived schema (``transport-schema from-gym``)."""
    observation, action = _spaces_of(source, gym_kwargs)
    return schema_toml(observation, action, gym_schema_name(source), shm_layout)


def gym_schema(
    source: GymSource, gym_kwargs: Mapping[str, Any] | None = None, shm_layout: str = "slots"
) -> Schema:
    """The compiled derived schema of a gymnasium env (a ``SchemaError`` naming a space the
    transport cannot carry); ``shm_layout="columns"``: the shm column layout."""
    observation, action = _spaces_of(source, gym_kwargs)
    return schema_of_spaces(observation, action, gym_schema_name(source), shm_layout)


def gym_factory(source: GymSource, gym_kwargs: Mapping[str, Any] | None = None) -> GymFactory:
    """A zero-argument factory of ``GymEnv`` (picklable for worker processes when ``source``
    is an env id or a module-level factory). A ``source`` that returns an env it returned
    before (``lambda: env``) is refused when it does, as ``transport.Server`` refuses such a
    factory: every env of a connection would step the same env; so is an env whose spaces
    differ from the first env's (``SameSpacesFactory``), and gym_kwargs a factory does not
    take (``check_factory_kwargs``)."""
    return SameSpacesFactory(source, gym_kwargs)


def gym_factory_and_schema(
    source: GymSource, gym_kwargs: Mapping[str, Any] | None = None, shm_layout: str = "slots"
) -> tuple[GymFactory, Schema]:
    """``gym_factory`` and ``gym_schema`` together, the schema's env made by the factory: a
    factory that returns one env made beforehand is then refused when the server starts (its
    first env is that env again), not by the first client."""
    factory = gym_factory(source, gym_kwargs)
    observation, action = _spaces_of(source, gym_kwargs, factory)
    return factory, schema_of_spaces(observation, action, gym_schema_name(source), shm_layout)


def gym_server(
    source: GymSource,
    url: str,
    *,
    num_envs: int = 1,
    workers: int = 0,
    gym_kwargs: Mapping[str, Any] | None = None,
    seed: int | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    limits: ServerLimits | None = None,
    shm_layout: str = "slots",
) -> Server:
    """A ``Server`` (not started) of a gymnasium env, for scripts that manage its lifetime."""
    factory, schema = gym_factory_and_schema(source, gym_kwargs, shm_layout)
    return Server(
        factory,
        url,
        schema=schema,
        num_envs=num_envs,
        env_name=source if isinstance(source, str) else gym_schema_name(source),
        seed=seed,
        max_body=max_body,
        workers=workers,
        limits=limits,
    )


def serve_gym(
    env_id_or_factory: GymSource,
    url: str,
    *,
    num_envs: int = 1,
    workers: int = 0,
    gym_kwargs: Mapping[str, Any] | None = None,
    seed: int | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    ready: Callable[[str], None] | None = None,
    limits: ServerLimits | None = None,
    shm_layout: str = "slots",
) -> None:
    """Serve a gymnasium env (an id for ``gymnasium.make(id, **gym_kwargs)``, or a factory)
    until SIGINT or SIGTERM, with the schema derived from its spaces (see the module doc;
    ``shm_layout="columns"``: the shm column layout). The other arguments are
    ``transport.serve``'s."""
    factory, schema = gym_factory_and_schema(env_id_or_factory, gym_kwargs, shm_layout)
    serve(
        factory,
        url,
        schema=schema,
        num_envs=num_envs,
        env_name=(
            env_id_or_factory
            if isinstance(env_id_or_factory, str)
            else gym_schema_name(env_id_or_factory)
        ),
        seed=seed,
        max_body=max_body,
        ready=ready,
        workers=workers,
        limits=limits,
    )
