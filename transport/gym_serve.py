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

import re
from collections.abc import Callable, Mapping
from typing import Any

from transport.api import Server, ServerLimits, serve
from transport.codec import Schema
from transport.envs.gym_env import GymFactory, GymSource, make_gym_env
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


def _spaces_of(
    source: GymSource, gym_kwargs: Mapping[str, Any] | None, factory: GymFactory | None = None
) -> tuple[Any, Any]:
    """The env's spaces, from one env made (by ``factory`` when given: it then knows the env,
    and refuses it if the source hands it out again) and closed."""
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
    factory: every env of a connection would step the same env."""
    return GymFactory(source, gym_kwargs)


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
