"""The gated echo env of tests/test_shm_close_in_flight.py (served by ``transport-serve ...
--env tests.shm_close_in_flight_env:GatedEcho --schema schema/pac_env.toml --workers 2``).

Echo, except that action ``SLOW`` first creates a marker file ``$TRANSPORT_TEST_GATE.in-*`` (the
test sees the server handed the step to its pool), then waits (up to 20 s) until the file named
by ``$TRANSPORT_TEST_GATE`` exists: the env stays in flight in its worker for as long as a test
wants, without a timing guess. (Node: node_bridge/src/test/shm_close_in_flight_env.ts.)
"""

from __future__ import annotations

import os
import time

import numpy as np

from transport.envs.echo import EchoEnv

SLOW = 50
GATE_ENV = "TRANSPORT_TEST_GATE"


class GatedEcho(EchoEnv):
    """EchoEnv whose SLOW step waits for the gate file."""

    def step_into(self, action: int, out: np.ndarray) -> None:
        if int(action) == SLOW:
            gate = os.environ.get(GATE_ENV, "")
            with open(f"{gate}.in-{os.getpid()}-{time.monotonic_ns()}", "w"):
                pass
            deadline = time.monotonic() + 20.0
            while not os.path.exists(gate):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the gate {gate} never opened")
                time.sleep(0.005)
        return super().step_into(action, out)
