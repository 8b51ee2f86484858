"""Reference envs served by ``transport-serve``: ``echo`` (pure transport cost),
``vector-echo`` (the same bytes from one vector env object that steps all N envs: the transport
without per-env Python), ``pac``, ``mahjong`` (a four-seat turn-based game for the PettingZoo
adapter), ``reach`` (a Dict observation and a Box action) and ``lock`` (a MultiDiscrete
action)."""

from __future__ import annotations

from collections.abc import Callable

from transport.codec import Schema
from transport.runtime.env import Env

ENVS: dict[str, str] = {
    "echo": "transport.envs.echo:EchoEnv",
    "vector-echo": "transport.envs.vector_echo:VectorEchoEnv",  # one object, N envs
    "heavy_tail": "transport.envs.heavy_tail:HeavyTailEnv",  # heavy-tailed step times
    "pac": "transport.envs.pac:PacEnv",
    "mahjong": "transport.envs.mahjong:MahjongEnv",
    "reach": "transport.envs.rich_spaces:ReachEnv",  # Dict observation, Box action
    "lock": "transport.envs.rich_spaces:LockEnv",  # MultiDiscrete action
    "frames": "transport.envs.frames:FramesEnv",  # decision-boundary runs (schema frames)
    "contract": "transport.testing.contract_env:ContractEnv",  # takes the schema: serve_cli
}

VECTOR_ENVS = frozenset({"vector-echo"})
"""Reference envs that are vector envs (``transport.runtime.env.VectorEnv``): their class takes
``num_envs`` and one object steps every env of a connection (``env_factory(name, num_envs)``)."""

SCHEMAS: dict[str, str] = {
    "echo": "pac_env",
    "vector-echo": "pac_env",
    "heavy_tail": "pac_env",
    "pac": "pac_env",
    "mahjong": "mahjong_env",
    "reach": "dictbox",
    "lock": "multidiscrete",
    "frames": "frames",
}
"""The schema (a module of ``transport.generated``) each reference env speaks."""

OBS_BOUNDS: dict[str, tuple[float, float]] = {"mahjong": (0.0, 1.0)}
"""Known observation bounds of reference envs (the adapters' Box low/high; else +-inf)."""


def env_factory(name: str, num_envs: int = 1) -> Callable[[], Env]:
    """The zero-argument factory of a reference env by name; a vector env's (``VECTOR_ENVS``)
    makes one object of ``num_envs`` envs, so serve it with the same ``num_envs``."""
    import functools
    import importlib

    if name not in ENVS:
        raise ValueError(f"unknown env {name!r} (known: {', '.join(sorted(ENVS))})")
    module, _, attr = ENVS[name].partition(":")
    found: Callable[..., Env] = getattr(importlib.import_module(module), attr)
    if name in VECTOR_ENVS:
        return functools.partial(found, num_envs)
    return found


def env_schema(name: str) -> Schema:
    """The compiled schema a reference env speaks (``pac_env`` unless listed in SCHEMAS)."""
    import importlib

    module = importlib.import_module(f"transport.generated.{SCHEMAS.get(name, 'pac_env')}")
    schema: Schema = module.SCHEMA
    return schema
