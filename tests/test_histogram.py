"""The probe's log-bucket histogram and its coordinated-omission-corrected open loop."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from transport.probe.histogram import LogHistogram
from transport.probe.loops import closed_loop, open_loop

REL = 1 / 128  # 2 significant digits: a bucket is at most 1/128 of its values wide


def test_bucket_geometry_round_trips() -> None:
    h = LogHistogram()
    assert h.sub == 256 and h.half == 128
    for index in range(h.size):
        low, high = h.lowest_equivalent(index), h.highest_equivalent(index)
        assert h.index_of(low) == index and h.index_of(high) == index
        assert high - low <= max(0, low * REL)
        if index + 1 < h.size:
            assert h.lowest_equivalent(index + 1) == high + 1
    low_arr, high_arr = h.bucket_edges()
    assert low_arr[1000] == h.lowest_equivalent(1000)
    assert high_arr[4000] == h.highest_equivalent(4000)


def test_small_values_are_exact() -> None:
    h = LogHistogram()
    for v in range(256):
        h.record(v)
    assert h.percentile(50.0) == 127
    assert h.percentile(100.0) == 255
    assert h.min == 0 and h.max == 255


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_percentiles_match_numpy_within_bucket_precision(seed: int) -> None:
    rng = np.random.default_rng(seed)
    data = np.concatenate(
        [rng.lognormal(10.5, 0.6, 50_000), rng.uniform(2e5, 5e7, 500)]  # a body and a tail
    ).astype(np.int64)
    h = LogHistogram()
    for value in data.tolist():
        h.record(value)
    assert h.total == data.size
    assert h.max == int(data.max()) and h.min == int(data.min())
    for p in (1.0, 50.0, 90.0, 99.0, 99.9, 99.99):
        exact = float(np.percentile(data, p, method="inverted_cdf"))
        got = h.percentile(p)
        assert exact <= got <= exact * (1 + REL) + 1, (p, exact, got)
    assert h.mean() == pytest.approx(float(data.mean()), rel=REL)


def test_record_many_equals_record() -> None:
    rng = np.random.default_rng(7)
    data = rng.integers(0, 10**10, 20_000)
    one, many = LogHistogram(), LogHistogram()
    for value in data.tolist():
        one.record(value)
    many.record_many(data)
    assert np.array_equal(one.counts, many.counts)
    assert (one.total, one.min, one.max) == (many.total, many.min, many.max)


def test_values_above_range_are_clamped_not_lost() -> None:
    h = LogHistogram(highest=10**6)
    h.record(10**9)
    h.record(5)
    assert h.total == 2 and h.clamped == 1 and h.max == 10**9
    assert h.percentile(100.0) == 10**9


def test_json_round_trip() -> None:
    h = LogHistogram()
    for v in (1, 10, 1000, 123_456, 9_999_999):
        h.record(v)
    back = LogHistogram.from_json(h.to_json())
    assert np.array_equal(back.counts, h.counts)
    assert back.percentile(99.0) == h.percentile(99.0)


def test_record_allocates_nothing_per_sample() -> None:
    h = LogHistogram()
    values = list(range(1, 200_001, 7)) + [10**9 + k for k in range(1000)]
    h.record(123)  # first-use effects out of the way
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for value in values:
            h.record(value)
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # nothing retained, and no transient growth with the sample count (~29,600 records)
    assert after - before < 1024
    assert peak - before < 4096
    assert h.total == len(values) + 1


# -- the loops, with a simulated clock -----------------------------------------------------------


class FakeClock:
    """A nanosecond clock that only moves when the simulated server works or the client sleeps."""

    def __init__(self) -> None:
        self.now = 1_000_000_000

    def __call__(self) -> int:
        return self.now

    def wait_until(self, due: int) -> None:
        assert due >= self.now
        self.now = due


def make_server(clock: FakeClock, service_ns: int, stall_at: int, stall_ns: int) -> object:
    calls = {"n": 0}

    def call() -> None:
        clock.now += stall_ns if calls["n"] == stall_at else service_ns
        calls["n"] += 1

    return call


RATE = 1000.0  # one request due every 1 ms
SERVICE = 100_000  # 0.1 ms per request
STALL = 100_000_000  # one 100 ms stall
N = 10_000
STALL_AT = 5_000


def expected_open_loop_latencies() -> np.ndarray:
    """Request i is due at i ms; it is sent when due or when the previous one returns."""
    latencies = np.empty(N, dtype=np.int64)
    free_at = 0
    for i in range(N):
        due = i * 1_000_000
        sent = max(due, free_at)
        free_at = sent + (STALL if i == STALL_AT else SERVICE)
        latencies[i] = free_at - due
    return latencies


def test_open_loop_shows_a_stall_in_the_tail() -> None:
    clock = FakeClock()
    call = make_server(clock, SERVICE, STALL_AT, STALL)
    hist, service = LogHistogram(), LogHistogram()
    stats = open_loop(
        call,  # type: ignore[arg-type]
        N,
        RATE,
        hist,
        service,
        max_ns=10**12,
        clock=clock,
        wait_until=clock.wait_until,
    )
    assert stats.round_trips == N
    expected = expected_open_loop_latencies()
    late = int(np.count_nonzero(expected > SERVICE))
    assert 100 < late < 120  # the stall delays ~110 of the requests due during it
    for p in (50.0, 90.0, 99.0, 99.5, 99.9):
        exact = float(np.percentile(expected, p, method="inverted_cdf"))
        assert exact <= hist.percentile(p) <= exact * (1 + REL) + 1, p
    assert hist.percentile(99.0) > 10_000_000  # p99 is tens of ms: the stall is visible
    assert hist.max == STALL
    # the uncorrected (service time) view hides it: one slow sample in 10,000
    assert service.percentile(99.9) == pytest.approx(SERVICE, rel=REL)
    assert service.max == STALL


def test_closed_loop_hides_the_same_stall() -> None:
    clock = FakeClock()
    call = make_server(clock, SERVICE, STALL_AT, STALL)
    hist = LogHistogram()
    stats = closed_loop(call, N, hist, max_ns=10**12, clock=clock)  # type: ignore[arg-type]
    assert stats.round_trips == N
    assert hist.percentile(99.9) == pytest.approx(SERVICE, rel=REL)
    assert hist.max == STALL
    assert stats.elapsed_ns == (N - 1) * SERVICE + STALL


def test_open_loop_sleeps_until_due() -> None:
    clock = FakeClock()
    sent: list[int] = []

    def call() -> None:
        sent.append(clock.now)
        clock.now += SERVICE

    hist, service = LogHistogram(), LogHistogram()
    open_loop(
        call, 50, RATE, hist, service, max_ns=10**12, clock=clock, wait_until=clock.wait_until
    )
    gaps = np.diff(sent)
    assert np.all(gaps == 1_000_000)  # on schedule, not back to back
    assert hist.max == SERVICE


def test_duration_limits_the_loops() -> None:
    clock = FakeClock()
    call = make_server(clock, SERVICE, -1, 0)
    stats = closed_loop(call, 10**6, LogHistogram(), max_ns=10_000_000, clock=clock)  # type: ignore[arg-type]
    assert stats.round_trips == 101
