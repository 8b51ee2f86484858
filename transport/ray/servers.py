"""What the cluster's clients need of ``launch()``'s handle, one layer below both: the
``ServerSet`` protocol (``EnvServers`` meets it), ``RayLaunchError``, ``DEFAULT_TIMEOUT`` and
``connect_all``. ``launch`` builds the handle and the clients (``ClusterClient``,
``RayVectorEnv``, ``RayVecEnv``) take it, so neither imports the other back."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol

from transport.errors import ConnectError, TransportError
from transport.ray.actor import Endpoint

if TYPE_CHECKING:
    from transport.client import Client

DEFAULT_TIMEOUT = 10.0
"""Seconds a client waits for any one reply (``transport.connect``'s default)."""

DEFAULT_READY_TIMEOUT = 120.0
"""Seconds ``launch()`` waits for every server (Ray may have to start worker processes)."""


class RayLaunchError(ConnectError):
    """Env server actors could not be started or reached through Ray (the reason is attached)."""


class ServerSet(Protocol):
    """Env servers placed by ``launch()``: server k holds global envs ``env_ids(k)``."""

    @property
    def num_servers(self) -> int: ...

    @property
    def num_envs_per_server(self) -> int: ...

    @property
    def num_envs(self) -> int: ...

    @property
    def urls(self) -> list[str]: ...

    def env_ids(self, index: int) -> range: ...

    def last_endpoint(self, index: int) -> Endpoint | None: ...

    def describe(self) -> str: ...

    def refresh(
        self, indices: Sequence[int] | None = None, *, timeout: float = DEFAULT_READY_TIMEOUT
    ) -> list[Endpoint]: ...

    def open_client(
        self,
        index: int,
        *,
        autoreset: str = "disabled",
        timeout: float | None = DEFAULT_TIMEOUT,
        endpoint: Endpoint | None = None,
    ) -> Client: ...


def connect_all(servers: ServerSet, *, autoreset: str, timeout: float | None) -> list[Client]:
    """A client of every server, connected in parallel; all closed again if one fails."""
    with ThreadPoolExecutor(max_workers=servers.num_servers) as pool:
        futures = [
            pool.submit(servers.open_client, k, autoreset=autoreset, timeout=timeout)
            for k in range(servers.num_servers)
        ]
        outcomes = [(future.exception(), future) for future in futures]
    clients = [future.result() for error, future in outcomes if error is None]
    errors = [error for error, _ in outcomes if error is not None]
    if errors:
        for client in clients:
            client.close()
        error = errors[0]
        if isinstance(error, TransportError):
            raise error
        raise TransportError(str(error)) from error
    return clients
