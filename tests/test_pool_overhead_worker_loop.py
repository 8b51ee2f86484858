"""A worker pool's own work per op (issue 24 item 2): a worker does no per-env native call
beyond its envs' steps (it scanned every env's async word after every op: ~0.3 us per env, on a
core the other parties needed), ``ping`` measures the pool's synchronisation alone, and rows
in ``shared_buffer`` are written in place by the workers (no copy)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from transport.envs import env_factory, env_schema
from transport.protocol import AutoReset
from transport.runtime.pool import WorkerPool, shared_buffer

N = 16
WORKERS = 2


class _Counting:
    """``transport.native`` with ``load_acquire`` counted (every other name passes through)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.loads = 0

    def load_acquire(self, ptr: Any) -> int:
        self.loads += 1
        return int(self.real.load_acquire(ptr))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class CountingEchoEnv:
    """The echo env; the first one made in a worker process counts the pool's native loads in
    that process, and each step writes the count so far into its reward (read by the test)."""

    def __init__(self) -> None:
        import transport.runtime.pool as pool

        module: Any = pool
        if not isinstance(module.native, _Counting):
            module.native = _Counting(module.native)
        self.counter: _Counting = module.native
        self.env: Any = env_factory("echo")()

    def spaces(self) -> Any:
        return self.env.spaces()

    def reset_into(self, seed: int | None, out: np.ndarray) -> None:
        self.env.reset_into(seed, out)

    def step_into(self, action: int, out: np.ndarray) -> None:
        self.env.step_into(action, out)
        out["reward"] = self.counter.loads


@pytest.fixture(scope="module")
def counting_pool() -> Iterator[tuple[WorkerPool, np.ndarray]]:
    schema = env_schema("echo")
    codec = schema["StepResult"]
    rows = codec.view(bytearray(codec.size * N), 0, count=N)
    factory: Any = CountingEchoEnv
    pool = WorkerPool(factory, schema, "StepResult", N, WORKERS, rows)
    try:
        assert pool.reset([None] * N) == []
        yield pool, rows
    finally:
        pool.close()


def test_a_worker_makes_no_native_call_per_env_between_steps(
    counting_pool: tuple[WorkerPool, np.ndarray],
) -> None:
    """Between two steps of env 0 its worker made a few native loads (its FINISHED bump, its
    look at the submit counter), not one per env of its share (the PENDING scan after every op
    made N / K more)."""
    pool, rows = counting_pool
    seen = []
    for _ in range(4):
        ended, failures = pool.step(np.ones(N, dtype=np.uint8), AutoReset.DISABLED)
        assert (ended, failures) == ([], [])
        seen.append(rows["reward"].copy())
    per_step = np.diff(np.array(seen), axis=0)
    share = N // WORKERS
    assert per_step.max() < share, f"native loads per step of each env: {per_step.tolist()}"


def test_asynchronous_envs_still_step_after_lock_step_ops(
    counting_pool: tuple[WorkerPool, np.ndarray],
) -> None:
    """The vectorised PENDING look finds envs submitted between lock-step ops."""
    pool, rows = counting_pool
    pool.step(np.full(N, 2, dtype=np.uint8), AutoReset.DISABLED)
    ids = [1, N - 1]
    pool.submit(ids, [5, 6], AutoReset.DISABLED)
    done = pool.poll(len(ids))
    assert sorted((i, ok, err) for i, ok, err in done) == [(1, False, None), (N - 1, False, None)]
    assert rows["observation"][1, 0] == 5 and rows["observation"][N - 1, 0] == 6
    ended, failures = pool.step(np.full(N, 3, dtype=np.uint8), AutoReset.DISABLED)
    assert (ended, failures) == ([], [])
    assert rows["observation"][:, 0].tolist() == [3] * N


def test_ping_is_a_fan_out_that_steps_nothing_and_finds_a_dead_worker() -> None:
    schema = env_schema("echo")
    codec = schema["StepResult"]
    rows = codec.view(bytearray(codec.size * 4), 0, count=4)
    pool = WorkerPool(env_factory("echo"), schema, "StepResult", 4, 2, rows)
    try:
        assert pool.reset([None] * 4) == []
        pool.step(np.full(4, 7, dtype=np.uint8), AutoReset.DISABLED)
        before = rows.copy()
        assert pool.ping() == []
        assert rows.tobytes() == before.tobytes()  # nothing stepped
        os.kill(pool.pids()[1], signal.SIGKILL)
        assert pool.ping() == [1]
        # the next op replaces it: its envs fail by name, then a reset serves them again
        _, failures = pool.step(np.full(4, 7, dtype=np.uint8), AutoReset.DISABLED)
        assert [i for i, _ in failures] == [2, 3]
        assert "worker process 1" in str(failures[0][1])
        assert pool.reset([None] * 4) == []
        assert pool.ping() == []
    finally:
        pool.close()


def test_rows_in_a_shared_buffer_are_written_in_place() -> None:
    """A server that allocates its result rows with ``shared_buffer`` gets them written by the
    workers themselves (no copy): the stream sessions' change this helper is for."""
    schema = env_schema("echo")
    codec = schema["StepResult"]
    buf = shared_buffer(codec.size * 2 * 4)
    rows = codec.view(buf, 0, count=4)
    finals = codec.view(buf, codec.size * 4, count=4)
    pool = WorkerPool(env_factory("echo"), schema, "StepResult", 4, 2, rows, finals)
    try:
        assert pool.writes_in_place
        assert pool.reset([None] * 4) == []
        pool.step(np.arange(4, dtype=np.uint8), AutoReset.DISABLED)
        assert rows["observation"][:, 0].tolist() == [0, 1, 2, 3]
    finally:
        pool.close()
        del rows, finals


class LateAfterResetEnv:
    """An echo env whose episode ends at every step. Its worker's first counted finish of an op
    (the reset's) sleeps 0.3 s after the bump: the server has its answer and the test submits
    asynchronous steps while the worker has not looked for PENDING envs yet."""

    def __init__(self) -> None:
        import transport.runtime.pool as pool

        module: Any = pool
        if not getattr(module, "_late_after_reset", False):
            real = module._finish

            def late_once(word: Any, finish_at: Any) -> None:
                module._finish = real
                real(word, finish_at)
                time.sleep(0.3)

            module._finish = late_once
            module._late_after_reset = True
        env: Any = env_factory("echo")()
        env.episode_len = 1
        self.env = env

    def spaces(self) -> Any:
        return self.env.spaces()

    def reset_into(self, seed: int | None, out: np.ndarray) -> None:
        self.env.reset_into(seed, out)

    def step_into(self, action: int, out: np.ndarray) -> None:
        self.env.step_into(action, out)


def test_an_asynchronous_step_uses_its_own_submit_s_mode() -> None:
    """Envs submitted while their worker finished a lock-step op are stepped under the mode of
    their submit (SAME_STEP: the final result kept, the env reset), not the mode the worker
    last saw (none yet: DISABLED, the episode's end was answered as a plain step; the contract
    check async_worker_pool failed now and then on a loaded machine)."""
    schema = env_schema("echo")
    codec = schema["StepResult"]
    rows = codec.view(bytearray(codec.size * 2), 0, count=2)
    finals = codec.view(bytearray(codec.size * 2), 0, count=2)
    factory: Any = LateAfterResetEnv
    pool = WorkerPool(factory, schema, "StepResult", 2, 1, rows, finals)
    try:
        assert pool.reset([None, None]) == []
        pool.submit([0, 1], [4, 5], AutoReset.SAME_STEP)
        done = sorted(pool.poll(2))
        assert done == [(0, True, None), (1, True, None)], done
        assert finals["observation"][:, 0].tolist() == [4, 5]  # the final results kept
    finally:
        pool.close()
