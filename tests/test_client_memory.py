"""The client's steady state allocates nothing: views into one reused receive buffer."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Iterator

import numpy as np
import pytest

import transport.api as api
from transport.client import Client

from .servers import ServerProcess, unique_unix_url, unique_url


@pytest.fixture(params=["unix", "http", "zmq+ipc"])
def client(request: pytest.FixtureRequest) -> Iterator[Client]:
    if request.param == "zmq+ipc":
        url = unique_unix_url().replace("unix://", "zmq+ipc://")
    else:
        url = unique_url(request.param)
    with ServerProcess(url, env="echo", num_envs=1) as server:
        with api.connect(server.url, timeout=10) as connected:
            yield connected


def test_step_returns_views_into_the_receive_buffer(client: Client) -> None:
    client.reset()
    result = client.step(3)
    buffer = np.frombuffer(client.channel.buffer, dtype=np.uint8)
    assert np.shares_memory(result.observation, buffer)
    assert result.observation.flags.aligned
    assert client.step(4) is result  # the same view object, refreshed in place
    assert result.observation[0] == 4.0
    owned = client.step(5, copy=True)
    assert not np.shares_memory(owned.observation, buffer)


def test_no_growth_over_thousands_of_steps(client: Client) -> None:
    client.reset()
    for i in range(500):  # warm up caches and lazily built views
        client.step(i % 92)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for i in range(5000):
        client.step(i % 92)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    growth = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert growth < 8192, f"the client grew by {growth} bytes over 5,000 steps"
