"""Ctrl-C in a ``connect_many`` step over servers whose channels are not pipelined (unix).

The step waited for each server's exchange on a thread pool; a KeyboardInterrupt while it
waited left the slow server's exchange running, and the next step started another exchange on
that channel mid-exchange. Now the interrupted step raises only once every started exchange is
over: the next step works and every env did the interrupted step (its results are lost), so
the envs stay in step. Real unix servers (the heavy-tailed echo env), a real SIGINT."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import numpy as np
import pytest

import transport
from transport.envs import env_schema
from transport.envs.heavy_tail import SLOW_FACTOR, SLOW_ONE_IN, HeavyTailEnv
from transport.multi import connect_many

from .interrupts import interrupted_step
from .servers import unique_unix_url

FAST_S = 0.05
SLOW_S = FAST_S * SLOW_FACTOR
UNEVEN_SEED = 103
"""``reset(seed=103)``: env 0 draws a fast first step, env 1 (seed 104) a slow one."""


def heavy_tail() -> HeavyTailEnv:
    return HeavyTailEnv(FAST_S)


@pytest.fixture
def urls() -> Iterator[list[str]]:
    servers = [
        transport.Server(heavy_tail, unique_unix_url(), schema=env_schema("heavy_tail")).start()
        for _ in range(2)
    ]
    try:
        yield [server.bound_url for server in servers]
    finally:
        for server in servers:
            server.close()


def test_ctrl_c_in_a_step_leaves_the_batch_working_and_in_step(urls: list[str]) -> None:
    assert [random.Random(UNEVEN_SEED + i).randrange(SLOW_ONE_IN) == 0 for i in range(2)] == [
        False,
        True,
    ]
    with connect_many(urls, timeout=10) as batch:
        batch.reset(seed=UNEVEN_SEED)
        actions = np.array([3, 5])
        started = time.monotonic()
        assert interrupted_step(batch, actions, after=SLOW_S / 2), "the step was not cut"
        # raised once the slow server answered (its env busy-waits SLOW_S), not at the SIGINT
        # with that exchange still running on the pool (a lower bound: load only adds to it)
        assert time.monotonic() - started >= 0.9 * SLOW_S
        result = batch.step(actions)  # the echo env: [0] the action, [1] the env's step count
        assert result["observation"][:, 0].tolist() == [3.0, 5.0]
        assert result["observation"][:, 1].tolist() == [2.0, 2.0]  # the interrupted one, this
        result = batch.reset(seed=0)
        assert result["observation"][:, 1].tolist() == [0.0, 0.0]
