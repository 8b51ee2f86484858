"""A worker-pool session gives back what it holds when its client leaves, not at the next
cyclic garbage collection: its rows' memfd mappings and fds, its workers' pipes (exploration 22:
an idle server held 139 fds, 93 pipes and 44 memfd:transport-rows, after 126 clients)."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator

import pytest

import transport
from transport.envs.echo import EchoEnv

from .servers import unique_url


def held() -> dict[str, int]:
    """This process's fds on pipes and on the rows' memfds."""
    counts = {"pipe": 0, "memfd": 0}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("pipe:"):
            counts["pipe"] += 1
        elif "memfd:transport-rows" in target:
            counts["memfd"] += 1
    return counts


@pytest.fixture()
def no_cyclic_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_clients_of_a_pool_server_leave_nothing_behind(no_cyclic_gc: None) -> None:
    url = unique_url("unix")
    with transport.Server(EchoEnv, url, num_envs=4, workers=2).start() as server:
        with transport.connect(server.bound_url) as client:  # the first: made at start
            client.reset(1)
        time.sleep(0.5)
        before = held()
        for _ in range(4):
            with transport.connect(server.bound_url) as client:
                client.reset(1)
                client.step([0, 1, 2, 3])
        deadline = time.monotonic() + 10
        while held() != before and time.monotonic() < deadline:
            time.sleep(0.1)  # the sessions' threads close their pools
        assert held() == before
