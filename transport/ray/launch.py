"""``launch()``: place env servers on a Ray cluster; ``EnvServers``: the handle that reaches them.

One actor per server, spread over the nodes by default (Ray's SPREAD strategy), or as the Ray
resources, placement group or scheduling strategy given say. Each serves ``num_envs`` envs over
``zmq+tcp`` with CURVE on; the handle knows every server's URL and public key (returned by the
actors through Ray) and the trainer's key pair (made here, the secret never leaves this process),
and opens clients over them: the plain ``transport.connect_many``, the fault-tolerant
``ClusterClient``, and the Gymnasium and SB3 adapters built on it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
import ray.exceptions

import transport
from transport.codec import Schema
from transport.multi import MultiClient
from transport.ray.actor import Endpoint, EnvServerActor, ServerSpec
from transport.ray.keys import KeyPair, client_url
from transport.ray.servers import DEFAULT_READY_TIMEOUT, DEFAULT_TIMEOUT, RayLaunchError

if TYPE_CHECKING:
    from transport.client import Client
    from transport.ray.client import ClusterClient, LostEnvPolicy
    from transport.ray.gym import RayVectorEnv
    from transport.ray.sb3 import RayVecEnv

log = logging.getLogger("transport.ray")

_RETRY_PAUSE = 0.1


class EnvServers:
    """The env servers of one ``launch()``: URLs, public keys, clients, shutdown.

    Server k holds global envs ``k * num_envs_per_server`` .. ``(k + 1) * num_envs_per_server -
    1``. ``endpoints`` is what the actors last said; ``refresh()`` asks them again (after a
    restart a server has a new port and key). Use as a context manager, or call ``shutdown()``.
    """

    def __init__(
        self,
        actors: Sequence[Any],
        spec: ServerSpec,
        client_keys: KeyPair,
        schema: Schema,
    ) -> None:
        self.actors = list(actors)
        self.spec = spec
        self.schema = schema
        self._client_keys = client_keys
        self._endpoints: list[Endpoint | None] = [None] * len(self.actors)
        self._closed = False

    # -- what the servers are ------------------------------------------------------------------

    @property
    def num_servers(self) -> int:
        return len(self.actors)

    @property
    def num_envs_per_server(self) -> int:
        return self.spec.num_envs

    @property
    def num_envs(self) -> int:
        return self.num_servers * self.spec.num_envs

    def env_ids(self, index: int) -> range:
        """The global env ids server ``index`` holds."""
        n = self.spec.num_envs
        return range(index * n, (index + 1) * n)

    @property
    def endpoints(self) -> list[Endpoint]:
        return [self.endpoint(k) for k in range(self.num_servers)]

    def endpoint(self, index: int) -> Endpoint:
        """Server ``index``'s endpoint as last reported (``refresh`` to ask again)."""
        endpoint = self._endpoints[index]
        if endpoint is None:
            endpoint = self.refresh([index])[0]
        return endpoint

    def last_endpoint(self, index: int) -> Endpoint | None:
        """Server ``index``'s endpoint as last reported, without asking Ray (None: never)."""
        return self._endpoints[index]

    @property
    def urls(self) -> list[str]:
        """``zmq+tcp://host:port`` of every server (connecting also needs the keys)."""
        return [endpoint.url for endpoint in self.endpoints]

    @property
    def public_keys(self) -> list[str]:
        """Every server's CURVE public key (Z85), in server order."""
        return [endpoint.server_public_key for endpoint in self.endpoints]

    @property
    def client_public_key(self) -> str:
        """The trainer's CURVE public key: the one key every server admits."""
        return self._client_keys.public

    def describe(self) -> str:
        return f"ray:{self.num_servers}x{self.spec.num_envs} {self.spec.lang} {self.spec.name}"

    def refresh(
        self, indices: Sequence[int] | None = None, *, timeout: float = DEFAULT_READY_TIMEOUT
    ) -> list[Endpoint]:
        """Ask the actors for their endpoints now, waiting up to ``timeout`` for restarts."""
        chosen = list(range(self.num_servers)) if indices is None else list(indices)
        deadline = time.monotonic() + timeout
        pending = {k: self.actors[k].endpoint.remote() for k in chosen}
        found: dict[int, Endpoint] = {}
        last_error: dict[int, BaseException] = {}
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready, _ = ray.wait(list(pending.values()), num_returns=1, timeout=remaining)
            for ref in ready:
                k = next(k for k, r in pending.items() if r == ref)
                del pending[k]
                try:
                    found[k] = ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    if exc.actor_init_failed:
                        raise RayLaunchError(f"env server {k} failed to start: {exc}") from exc
                    last_error[k] = exc  # dead or restarting: ask again
                    time.sleep(_RETRY_PAUSE)
                    pending[k] = self.actors[k].endpoint.remote()
                except ray.exceptions.RayTaskError as exc:
                    raise RayLaunchError(f"env server {k} failed: {exc}") from exc
        if pending:
            for ref in pending.values():
                ray.cancel(ref)
            missing = sorted(pending)
            why = "; ".join(f"server {k}: {last_error[k]}" for k in missing if k in last_error)
            raise RayLaunchError(
                f"env server(s) {missing} did not report an endpoint within {timeout:g} s"
                + (f" ({why})" if why else " (still starting, or no node has the resources)")
            )
        for k, endpoint in found.items():
            self._endpoints[k] = endpoint
        return [found[k] for k in chosen]

    # -- clients -------------------------------------------------------------------------------

    def open_client(
        self,
        index: int,
        *,
        autoreset: str = "disabled",
        timeout: float | None = DEFAULT_TIMEOUT,
        endpoint: Endpoint | None = None,
    ) -> Client:
        """A ``transport.Client`` of server ``index`` (its keys are read while connecting)."""
        endpoint = endpoint or self.endpoint(index)
        with client_url(endpoint.url, endpoint.server_public_key, self._client_keys) as url:
            return transport.connect(url, self.schema, timeout=timeout, autoreset=autoreset)

    def connect_many(self, *, timeout: float | None = DEFAULT_TIMEOUT) -> MultiClient:
        """``transport.connect_many`` over every server: one batch of all envs, no fault policy.

        Its ``urls`` name memory files that were closed once connected (keys are read once).
        """
        with ExitStack() as stack:
            urls = [
                stack.enter_context(
                    client_url(endpoint.url, endpoint.server_public_key, self._client_keys)
                )
                for endpoint in self.endpoints
            ]
            return transport.connect_many(urls, self.schema, timeout=timeout)

    def connect(
        self,
        *,
        autoreset: str = "disabled",
        timeout: float | None = DEFAULT_TIMEOUT,
        policy: LostEnvPolicy | None = None,
    ) -> ClusterClient:
        """Every server as one batch, with the lost-server policy (``transport.ray.client``)."""
        from transport.ray.client import ClusterClient

        return ClusterClient(self, autoreset=autoreset, timeout=timeout, policy=policy)

    def vector_env(self, **kwargs: Any) -> RayVectorEnv:
        """A ``gymnasium.vector.VectorEnv`` over every env (``RayVectorEnv``; needs gymnasium)."""
        from transport.ray.gym import RayVectorEnv

        return RayVectorEnv(self, **kwargs)

    def sb3_vec_env(self, **kwargs: Any) -> RayVecEnv:
        """An SB3 ``VecEnv`` over every env (``RayVecEnv``; needs stable-baselines3)."""
        from transport.ray.sb3 import RayVecEnv

        return RayVecEnv(self, **kwargs)

    # -- lifetime ------------------------------------------------------------------------------

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop every server, kill every actor (no restart) and wait until Ray reports them dead."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout
        stops = [actor.stop.remote() for actor in self.actors]
        try:
            ray.wait(stops, num_returns=len(stops), timeout=max(0.0, deadline - time.monotonic()))
        except ray.exceptions.RayError:
            pass
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        for k, actor in enumerate(self.actors):
            if not _wait_dead(actor, deadline):
                log.warning("env server actor %d was not reported dead within %g s", k, timeout)

    def __enter__(self) -> EnvServers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"EnvServers({self.describe()}, urls={[e and e.url for e in self._endpoints]})"


def _wait_dead(actor: Any, deadline: float) -> bool:
    """True once a call to ``actor`` fails because it is dead (Ray has released it)."""
    while time.monotonic() < deadline:
        try:
            ray.get(actor.endpoint.remote(), timeout=max(0.01, deadline - time.monotonic()))
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            return False
        time.sleep(_RETRY_PAUSE)
    return False


def launch(
    env: str | Callable[[], Any] = "echo",
    *,
    num_servers: int,
    num_envs: int = 1,
    lang: str = "python",
    schema: Schema | str | Path | None = None,
    seed: int | None = None,
    num_cpus: float = 1.0,
    resources: Mapping[str, float] | None = None,
    placement_group: Any = None,
    scheduling_strategy: Any = "SPREAD",
    max_restarts: int = -1,
    host: str | None = None,
    workers: int = 0,
    node_command: Sequence[str] = (),
    ready_timeout: float = DEFAULT_READY_TIMEOUT,
    actor_options: Mapping[str, Any] | None = None,
) -> EnvServers:
    """Start ``num_servers`` env servers as Ray actors, each serving ``num_envs`` envs.

    ``env``: a reference env name or (Python) a picklable zero-argument factory; its
    ``schema`` when given, else the one it declares (``transport.Server``'s rule: a ``SCHEMA``
    attribute or a reference env's; else pac_env if one reset fits it, else ``TypeError``).
    ``lang``: "python" (envs in the actor's process) or "node" (a child process the actor owns).
    Placement: ``num_cpus`` and ``resources`` per actor; ``placement_group`` (actor k goes to
    bundle k mod the number of bundles) or ``scheduling_strategy`` (default "SPREAD":
    over the nodes); ``actor_options`` go to ``ActorClass.options`` as they are. Ray restarts a
    dead actor up to ``max_restarts`` times (-1: always). Starts a local Ray if none is running.
    Returns once every server reports its endpoint (``ready_timeout``), else raises
    ``RayLaunchError`` after killing what it started.
    """
    if num_servers < 1 or num_envs < 1:
        raise ValueError("num_servers and num_envs must be at least 1")
    if lang not in ("python", "node"):
        raise ValueError(f"lang must be 'python' or 'node', not {lang!r}")
    if not isinstance(env, str) and lang == "node" and not node_command:
        raise ValueError("a Node server takes a reference env name (or node_command=...)")
    if isinstance(env, str):
        from transport.envs import ENVS, env_schema

        if env not in ENVS and not node_command:
            raise ValueError(f"unknown env {env!r} (known: {', '.join(sorted(ENVS))})")
        codecs = env_schema(env) if schema is None else schema_of(schema)
    elif schema is None and lang == "python":
        codecs = factory_schema(env)
    else:
        codecs = schema_of(schema)
    if not ray.is_initialized():
        ray.init()
    spec = ServerSpec(
        env=env,
        num_envs=num_envs,
        lang=lang,
        schema_ir=codecs.ir,
        seed=seed,
        host=host,
        workers=workers,
        node_command=tuple(node_command),
        ready_timeout=ready_timeout,
    )
    client_keys = KeyPair.generate()
    remote_class: Any = ray.remote(EnvServerActor)
    actors = []
    for k in range(num_servers):
        options: dict[str, Any] = {
            "num_cpus": num_cpus,
            "max_restarts": max_restarts,
            "scheduling_strategy": _strategy(k, placement_group, scheduling_strategy),
        }
        if resources:
            options["resources"] = dict(resources)
        options.update(actor_options or {})
        actors.append(remote_class.options(**options).remote(spec, k, client_keys.public))
    servers = EnvServers(actors, spec, client_keys, codecs)
    try:
        servers.refresh(timeout=ready_timeout)
    except BaseException:
        servers.shutdown()
        raise
    return servers


def schema_of(schema: Schema | str | Path | None) -> Schema:
    """The compiled schema: as given, compiled from a file, or the reference ``pac_env``."""
    if isinstance(schema, Schema):
        return schema
    if schema is None:
        from transport.envs import env_schema

        return env_schema("pac")
    return transport.load_schema(schema)


def factory_schema(factory: Callable[[], Any]) -> Schema:
    """The schema of a Python env factory given without ``schema=``, as ``transport.Server``
    finds it: the one it declares (a ``SCHEMA`` attribute, or a reference env's), else the
    default pac_env if one reset fits it, else ``TypeError`` (before any actor starts)."""
    from transport.api import check_default_schema_fits, declared_schema

    declared = declared_schema(factory)
    if declared is not None:
        return declared
    default = schema_of(None)
    check_default_schema_fits(default, factory, "transport.ray.launch")
    return default


def _strategy(index: int, placement_group: Any, scheduling_strategy: Any) -> Any:
    if placement_group is None:
        return scheduling_strategy
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundles = len(placement_group.bundle_specs)
    return PlacementGroupSchedulingStrategy(
        placement_group=placement_group, placement_group_bundle_index=index % bundles
    )
