"""Reference envs served by ``transport-serve``: ``echo`` (pure transport cost), ``pac``,
``mahjong`` (a four-seat turn-based game for the PettingZoo adapter), ``reach`` (a Dict
observation and a Box action) and ``lock`` (a MultiDiscrete action)."""

from __future__ import annotations

from collections.abc import Callable

from transport.codec import Schema
from transport.runtime.env import Env

ENVS: dict[str, str] = {
    "echo": "transport.envs.echo:EchoEnv",
    "heavy_tail": "transport.envs.heavy_tail:HeavyTailEnv",  # heavy-tailed step times
    "pac": "transport.envs.pac:PacEnv",
    "mahjong": "transport.envs.mahjong:MahjongEnv",
    "reach": "transport.envs.rich_spaces:ReachEnv",  # Dict observation, Box action
    "lock": "transport.envs.rich_spaces:LockEnv",  # MultiDiscrete action
    "frames": "transport.envs.frames:FramesEnv",  # decision-boundary runs (schema frames)
    "contract": "transport.testing.contract_env:ContractEnv",  # takes the schema: serve_cli
}

SCHEMAS: dict[str, str] = {
    "echo": "pac_env",
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


def env_factory(name: str) -> Callable[[], Env]:
    """The factory of a reference env by name."""
    import importlib

    if name not in ENVS:
        raise ValueError(f"unknown env {name!r} (known: {', '.join(sorted(ENVS))})")
    module, _, attr = ENVS[name].partition(":")
    factory: Callable[[], Env] = getattr(importlib.import_module(module), attr)
    return factory


def env_schema(name: str) -> Schema:
    """The compiled schema a reference env speaks (``pac_env`` unless listed in SCHEMAS)."""
    import importlib

    module = importlib.import_module(f"transport.generated.{SCHEMAS.get(name, 'pac_env')}")
    schema: Schema = module.SCHEMA
    return schema
