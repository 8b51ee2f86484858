"""A worker whose env never returns from a step is an error in bounded time: after the pool's
step timeout it is killed and replaced, its envs fail with ENV_ERROR naming the timeout, and the
client's next request works (Node: pool_stuck_and_info.test.ts; exploration 21 found the Node
server frozen, and the Python connection's thread waited forever)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import transport
import transport.runtime.pool as pool
from transport.envs.echo import EchoEnv
from transport.errors import EnvError

from .servers import unique_url


class StuckOnce(EchoEnv):
    """Env 0's third step never returns in the first worker process that runs it."""

    steps = 0

    def step_into(self, action: int, out: np.ndarray) -> None:
        StuckOnce.steps += 1
        if StuckOnce.steps == 3 and self.stuck_here():
            while True:
                time.sleep(0.05)
        super().step_into(action, out)

    @staticmethod
    def stuck_here() -> bool:
        flag = f"/tmp/transport-stuck-once-{os.getppid()}"
        if os.path.exists(flag):
            return False
        open(flag, "w").close()
        return True


def test_a_stuck_worker_is_killed_and_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool, "DEFAULT_STEP_TIMEOUT", 1.5)
    flag = f"/tmp/transport-stuck-once-{os.getpid()}"
    url = unique_url("unix")
    try:
        with transport.Server(StuckOnce, url, num_envs=2, workers=2).start() as server:
            with transport.connect(server.bound_url, timeout=30) as client:
                client.reset(1)
                actions = np.zeros(2, dtype=np.int64)
                client.step(actions)
                client.step(actions)
                started = time.monotonic()
                with pytest.raises(EnvError, match="did not answer within the step timeout"):
                    client.step(actions)
                assert time.monotonic() - started < 20  # the timeout, not the client's 30 s
                client.reset(2)  # the replaced worker serves
                client.step(actions)
    finally:
        if os.path.exists(flag):
            os.unlink(flag)
