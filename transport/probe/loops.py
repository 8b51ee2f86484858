"""The two measurement loops: closed-loop ping-pong and open-loop at a fixed rate.

Closed loop: send, wait for the response, record ``t_done - t_send``, repeat. It measures the
service time of one request at a time, but it cannot see queueing: while one request stalls,
the loop sends nothing, so a 100 ms stall is one slow sample among thousands (coordinated
omission).

Open loop (``rate`` requests/s): request i is due at ``t_i = t_0 + i / rate``. The loop waits
until ``t_i`` (sleeping, then spinning the last ``SPIN_NS``), or sends at once when it is late,
and records ``t_done - t_i``: the latency a client that sends at that rate would see. A stall
of S seconds therefore also delays the ~S * rate requests that were due during it, and each of
them records the time it spent waiting: the correction for coordinated omission is built into
the schedule (no after-the-fact synthetic samples). The service time ``t_done - t_send`` is
recorded in a second histogram for comparison.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

from transport.probe.histogram import LogHistogram

SPIN_NS = 300_000  # the last 0.3 ms before a due time are spent spinning, not sleeping
TICK_EVERY = 500  # round trips between two progress ticks (one integer compare per round trip)
Clock = Callable[[], int]
WaitUntil = Callable[[int], None]
Tick = Callable[[int], None]
"""Called with the number of round trips done so far, every ``TICK_EVERY`` (progress bars)."""


@dataclass
class LoopStats:
    round_trips: int
    elapsed_ns: int  # from the first send (or due time) to the last response


def sleep_until(due: int, clock: Clock = time.perf_counter_ns) -> None:
    """Sleep until ``SPIN_NS`` before ``due``, then spin: sleeping alone overshoots by the timer
    slack (50 us or more), which the open loop would record as latency."""
    now = clock()
    if due - now > 2 * SPIN_NS:
        time.sleep((due - now - SPIN_NS) / 1e9)
    while clock() < due:
        pass


def warm_up(
    call: Callable[[], object], count: int, max_ns: int, clock: Clock, tick: Tick | None = None
) -> int:
    """Up to ``count`` round trips, at most ``max_ns`` long; nothing is recorded."""
    deadline = clock() + max_ns
    done = 0
    next_tick = TICK_EVERY if tick is not None else -1
    for _ in range(count):
        call()
        done += 1
        if done == next_tick and tick is not None:
            tick(done)
            next_tick += TICK_EVERY
        if clock() > deadline:
            break
    return done


def closed_loop(
    call: Callable[[], object],
    count: int,
    hist: LogHistogram,
    *,
    max_ns: int,
    clock: Clock = time.perf_counter_ns,
    tick: Tick | None = None,
) -> LoopStats:
    """``count`` round trips back to back (fewer if ``max_ns`` runs out): each one recorded."""
    record = hist.record
    start = clock()
    deadline = start + max_ns
    t1 = start
    done = 0
    next_tick = TICK_EVERY if tick is not None else -1
    for _ in range(count):
        t0 = clock()
        call()
        t1 = clock()
        record(t1 - t0)
        done += 1
        if done == next_tick and tick is not None:
            tick(done)
            next_tick += TICK_EVERY
        if t1 > deadline:
            break
    return LoopStats(done, t1 - start)


def open_loop(
    call: Callable[[], object],
    count: int,
    rate: float,
    hist: LogHistogram,
    service: LogHistogram,
    *,
    max_ns: int,
    clock: Clock = time.perf_counter_ns,
    wait_until: WaitUntil | None = None,
    tick: Tick | None = None,
) -> LoopStats:
    """``count`` requests due at ``rate`` per second: latency measured from each due time.

    Stops early when the next request would be due after ``max_ns``. ``clock`` and
    ``wait_until(t)`` (return at clock time ``t``: default ``sleep_until``) can be replaced by a
    simulated clock in the tests.
    """
    if wait_until is None:
        wait_until = functools.partial(sleep_until, clock=clock)
    if rate <= 0:
        raise ValueError("rate must be positive")
    interval = 1e9 / rate
    record = hist.record
    record_service = service.record
    start = clock() + SPIN_NS  # the first due time
    t1 = start
    done = 0
    next_tick = TICK_EVERY if tick is not None else -1
    for i in range(count):
        due = start + int(i * interval)
        if due - start > max_ns:
            break
        now = clock()
        if now < due:
            wait_until(due)
            now = clock()
        call()
        t1 = clock()
        record(t1 - due)
        record_service(t1 - now)
        done += 1
        if done == next_tick and tick is not None:
            tick(done)
            next_tick += TICK_EVERY
    return LoopStats(done, t1 - start)
