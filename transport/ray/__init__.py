"""Scale out on Ray: env servers placed on a Ray cluster as actors (``pip install transport[ray]``).

    import transport.ray

    servers = transport.ray.launch("pac", num_servers=4, num_envs=8)   # 4 actors, 32 envs
    envs = servers.vector_env()            # gymnasium VectorEnv over all 32 (or sb3_vec_env())
    ...
    servers.shutdown()

Each actor serves its envs over ``zmq+tcp`` with CURVE on (Python envs in the actor's process,
Node envs in a child process it owns); keys travel as Ray values, never through files. A dead
actor is restarted by Ray; clients name the lost envs (``EnvsLostError``) and reconnect them at
their next reset (``LostEnvPolicy``). See docs/ray.md.

The core (``import transport``) never imports Ray; this package does.
"""

from __future__ import annotations

try:
    import ray as _ray  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "transport.ray needs Ray: install the extra with pip install 'transport[ray]'"
    ) from exc

from transport.ray.actor import Endpoint, EnvServerActor, ServerSpec
from transport.ray.client import ClusterClient, EnvsLostError, LostEnvPolicy
from transport.ray.keys import KeyPair
from transport.ray.launch import EnvServers, launch
from transport.ray.servers import RayLaunchError

__all__ = [
    "ClusterClient",
    "Endpoint",
    "EnvServerActor",
    "EnvServers",
    "EnvsLostError",
    "KeyPair",
    "LostEnvPolicy",
    "RayLaunchError",
    "ServerSpec",
    "launch",
]
