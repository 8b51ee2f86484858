"""The shm server's wait between requests when a worker pool runs the envs (issue 24 item 5).

A lock-step step on a worker pool takes the workers' time (milliseconds on a real env); a server
that spins on the doorbell meanwhile takes a core from them (2 cores: one of two). So a server
whose envs run in worker processes sleeps at once (spin 0), unless its URL names a wait policy.
Real POSIX shm regions and real worker processes; no timing is asserted.
"""

from __future__ import annotations

import threading
import uuid

import numpy as np
import pytest

import transport.api as api
from transport.backends.shm.channel import ShmChannel
from transport.backends.shm.region import PRESETS
from transport.backends.shm.server import Listener
from transport.envs import env_factory, env_schema
from transport.envs.vector_echo import SCHEMA, VectorEchoEnv
from transport.runtime.host import EnvHost

from .servers import ServerProcess


def _listener(query: str, workers: int) -> Listener:
    url = f"shm://test-poolwait-{uuid.uuid4().hex[:12]}?num_envs=2{query}"
    host = EnvHost(
        env_schema("echo"), env_factory("echo"), num_envs=2, env_name="echo", workers=workers
    )
    listener = Listener(url, host)
    listener.start()
    return listener


@pytest.mark.parametrize(
    ("query", "workers", "spin"),
    [
        ("", 1, 0),  # a pool serves: sleep at once
        ("", 0, PRESETS["balanced"].spin),  # envs in the server: the URL's (default) policy
        ("&wait=spin", 1, PRESETS["spin"].spin),  # named in the URL: kept, pool or not
        ("&spin=500", 1, 500),
        ("&wait=futex", 0, 0),
    ],
)
def test_server_spin_between_requests(query: str, workers: int, spin: int) -> None:
    listener = _listener(query, workers)
    try:
        assert listener._ctx.spin == spin  # the native wait context of the doorbell wait
    finally:
        listener.close()


class _ThreadedVectorEcho(VectorEchoEnv):
    """A vector env that says it steps on threads of its own (as EnvPool does)."""

    steps_on_own_threads = True


@pytest.mark.parametrize(
    ("env", "query", "spin", "policy"),
    [
        (_ThreadedVectorEcho, "", 0, "futex"),  # on its own threads: both sleep, as for a pool
        (VectorEchoEnv, "", PRESETS["balanced"].spin, "balanced"),  # in the server: the default
        (_ThreadedVectorEcho, "&wait=spin", PRESETS["spin"].spin, "spin"),  # named: kept
    ],
)
def test_vector_env_on_its_own_threads_sleeps_like_a_pool(
    env: type[VectorEchoEnv], query: str, spin: int, policy: str
) -> None:
    # EnvPool's threads share the cores with the server and the client: a server spinning for
    # the next request took a core from them (HalfCheetah N = 8: 0.93x the step time asleep)
    url = f"shm://test-poolwait-{uuid.uuid4().hex[:12]}?num_envs=4{query}"
    listener = Listener(url, EnvHost(SCHEMA, lambda: env(4), num_envs=4, env_name="vector"))
    listener.start()
    thread = threading.Thread(target=listener.serve_forever, daemon=True)
    thread.start()
    try:
        assert listener._ctx.spin == spin  # the native wait context of the doorbell wait
        with api.connect(url, timeout=10) as client:
            channel = client.channel
            assert isinstance(channel, ShmChannel)
            assert channel.policy == PRESETS[policy]
            assert "client_wait" not in client.server_info
            client.reset(seed=1)
            assert client.step(np.full(4, 2)).observation.shape[0] == 4
    finally:
        listener.close()
        thread.join(10)


@pytest.mark.parametrize("lang", ["python", "node"])
@pytest.mark.parametrize(
    ("workers", "client_query", "policy"),
    [
        (2, "", "futex"),  # a pool serves: the server advises futex, the client follows
        (0, "", "balanced"),  # envs in the server: no advice, the default
        (2, "&wait=spin", "spin"),  # the client's URL names its policy: kept
    ],
)
def test_client_wait_follows_a_pool_server(
    lang: str, workers: int, client_query: str, policy: str
) -> None:
    """Lock-step through a server whose envs run in worker processes: the client waits as the
    server advises unless its URL says otherwise, every step is answered, and the advice is
    not a server_info key (the same keys as over unix)."""
    url = f"shm://test-poolwait-{uuid.uuid4().hex[:12]}?num_envs=4"
    extra = ["--workers", str(workers)] if workers else []
    with ServerProcess(url, env="echo", lang=lang, num_envs=4, extra=extra) as server:
        with api.connect(server.url + client_query, timeout=20) as client:
            channel = client.channel
            assert isinstance(channel, ShmChannel)
            assert channel.policy == PRESETS[policy]
            assert channel._ctx.spin == PRESETS[policy].spin  # the native wait's budget
            assert "client_wait" not in client.server_info
            client.reset(seed=3)
            for k in range(50):
                result = client.step(np.full(4, k % 5))
                assert result.observation.shape[0] == 4
