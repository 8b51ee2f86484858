"""Reference envs served by ``transport-serve``: ``echo`` (pure transport cost) and ``pac``."""

from __future__ import annotations

from collections.abc import Callable

from transport.server import Env

ENVS: dict[str, str] = {
    "echo": "transport.envs.echo:EchoEnv",
    "pac": "transport.envs.pac:PacEnv",
}


def env_factory(name: str) -> Callable[[], Env]:
    """The factory of a reference env by name."""
    import importlib

    if name not in ENVS:
        raise ValueError(f"unknown env {name!r} (known: {', '.join(sorted(ENVS))})")
    module, _, attr = ENVS[name].partition(":")
    factory: Callable[[], Env] = getattr(importlib.import_module(module), attr)
    return factory
