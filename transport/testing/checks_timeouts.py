"""Contract checks of what follows a timeout (issue 15 item 4): the connection resynchronises.

A request that times out is ``TransportTimeoutError``; the client keeps its connection and drops
the late reply when it comes (by msg_id on unix and zmq, in order on http, by the slot's late
completion on shm), so the next call works. The timed-out request may still take effect on the
server (it was sent): the checks expect that it does when the server continues.
"""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Callable

from transport.errors import TransportTimeoutError
from transport.testing.checks import (
    WATCHDOG,
    CheckContext,
    _check,
    _expect_results,
    _pick,
    _step,
    _watchdog,
)
from transport.testing.model import ExpectedSession
from transport.testing.servers import stop_process

TIMEOUT_AFTER = 0.5
"""The client timeout of these checks: the server is stopped for longer than this."""


def _expect_timeout(work: Callable[[], object], what: str) -> None:
    try:
        _watchdog(WATCHDOG, work, what)
    except TransportTimeoutError:
        return
    raise AssertionError(f"{what}: answered by a stopped server")


@_check(per_schema=False)
def check_timeout_then_resynchronise(ctx: CheckContext) -> None:
    """A step to a stopped (SIGSTOP) server times out, and so does an OBSERVE (no env effect)
    while its reply is still due; after SIGCONT the same client's next step works, its bytes
    those of the local env after both steps (the timed-out step took effect; its late reply was
    dropped)."""
    server = ctx.server(1, dedicated=True)
    rng = random.Random(15)
    stopped = False
    try:
        with ctx.connect(server, timeout=TIMEOUT_AFTER) as client:
            model = ExpectedSession(ctx.schema, 1, server_seed=None)
            _expect_results(client.reset(21), model.reset(21), "reset")
            first = _pick(model, rng)
            stopped = True
            stop_process(server.pid)
            try:
                _expect_timeout(lambda: _step(client, first), "a step to a stopped server")
                _expect_timeout(client.observe, "an OBSERVE while a late reply is due")
            finally:
                os.kill(server.pid, signal.SIGCONT)
                stopped = False
            model.step(first)
            second = _pick(model, rng)
            if model.refusal(second) is None:
                results, _, _ = model.step(second)
                view = _watchdog(WATCHDOG, lambda: _step(client, second), "the next step")
                _expect_results(view, results, "the step after the timeouts")
            else:  # the timed-out step ended the episode: the next call is a reset
                view = _watchdog(WATCHDOG, lambda: client.reset(22), "the next reset")
                _expect_results(view, model.reset(22), "the reset after the timeouts")
            assert client.health(), "health after the timeouts"
    finally:
        if stopped:
            os.kill(server.pid, signal.SIGCONT)
        status = server.stop()
    assert status == 0, f"the server exited {status} after SIGTERM"
