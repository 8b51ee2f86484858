"""The worker pool's fast path (issue 24 item 2): workers write the server's result rows in place
when those rows lie in a shared file (an shm region's slots), the server waits once per fan-out,
and the pool spins only where every party has a core of its own."""

from __future__ import annotations

import mmap
import os
import random
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from transport.envs import env_factory, env_schema
from transport.protocol import AutoReset
from transport.runtime.pool import WorkerPool, default_spin, find_shared

N = 6
WORKERS = 2


@pytest.fixture(scope="module")
def shm_file() -> Iterator[tuple[int, str]]:
    """A file in /dev/shm (as an shm region's segment is), removed afterwards."""
    path = f"/dev/shm/test-poolfast-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        yield fd, path
    finally:
        os.close(fd)
        os.unlink(path)


def slot_dtype(codec: Any) -> np.dtype[Any]:
    """The codec's fields at other offsets in wider records (as an shm slot profile has them)."""
    fields = codec.dtype.fields
    names = list(codec.dtype.names or ())
    return np.dtype(
        {
            "names": names,
            "formats": [fields[n][0] for n in names],
            "offsets": [fields[n][1] + 24 for n in names],
            "itemsize": codec.size + 40,
        }
    )


def shared_rows(fd: int, dtype: np.dtype[Any], at: int) -> tuple[mmap.mmap, np.ndarray]:
    """(mapping, N rows of ``dtype``) at byte ``at`` of the file (two areas: results, finals)."""
    size = at + 2 * N * dtype.itemsize
    os.ftruncate(fd, max(os.fstat(fd).st_size, size))
    buf = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    return buf, np.ndarray((2 * N,), dtype=dtype, buffer=buf, offset=at)


def test_find_shared_locates_rows_in_a_shared_file(shm_file: tuple[int, str]) -> None:
    fd, _ = shm_file
    codec = env_schema("pac")["StepResult"]
    buf, rows = shared_rows(fd, slot_dtype(codec), 4096 + 100)
    rows["reward"] = np.arange(2 * N)
    found = find_shared(rows[:N])
    assert found is not None
    opened, offset = found
    try:
        assert offset == 4096 + 100
        got = os.pread(opened, rows.dtype.itemsize, offset + rows.dtype.itemsize)
        assert got == rows[1:2].tobytes()
    finally:
        os.close(opened)
    private = codec.view(bytearray(codec.size * N), 0, count=N)
    assert find_shared(private) is None
    del rows
    buf.close()


def test_find_shared_locates_rows_in_a_memfd_this_process_holds() -> None:
    """A memfd has no path a worker could open: the fd this process holds on it (the mmap
    object keeps one) is duplicated; the same bytes are reached through it."""
    codec = env_schema("pac")["StepResult"]
    fd = os.memfd_create("test-poolfast-rows", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, 8192 + codec.size * N)
        buf = mmap.mmap(fd, 8192 + codec.size * N, mmap.MAP_SHARED)
    finally:
        os.close(fd)
    rows = codec.view(buf, 8192 + 16, count=N - 1)
    rows["reward"] = np.arange(N - 1) + 0.5
    found = find_shared(rows)
    assert found is not None
    held, offset = found
    try:
        assert offset == 8192 + 16
        assert os.pread(held, codec.size, offset + codec.size) == rows[1:2].tobytes()
    finally:
        os.close(held)
    del rows
    buf.close()


def same(a: np.ndarray, b: np.ndarray, names: list[str]) -> bool:
    return all(np.array_equal(a[name], b[name]) for name in names)


def _valid_actions(rows: np.ndarray, rng: random.Random) -> np.ndarray:
    masks = rows["action_mask"]
    return np.array(
        [rng.choice(np.flatnonzero(masks[i]).tolist() or [0]) for i in range(N)], dtype=np.uint8
    )


def test_workers_write_shared_rows_in_place_as_the_copy_path(shm_file: tuple[int, str]) -> None:
    """A pool whose rows lie in a shared file is written by its workers (nothing lands in the
    pool's own result area; the server copies nothing) and gives, step by step, in both
    auto-reset modes, the rows, finals and ended envs of a pool with private rows (copied)."""
    fd, _ = shm_file
    schema = env_schema("pac")
    codec = schema["StepResult"]
    buf, area = shared_rows(fd, slot_dtype(codec), 8192 + 8)
    rows, finals = area[:N], area[N:]
    private = codec.view(bytearray(codec.size * N), 0, count=N)
    private_finals = codec.view(bytearray(codec.size * N), 0, count=N)
    factory = env_factory("pac")
    in_place = WorkerPool(factory, schema, "StepResult", N, WORKERS, rows, finals, spin=0)
    copied = WorkerPool(factory, schema, "StepResult", N, WORKERS, private, private_finals)
    try:
        assert in_place.writes_in_place and not copied.writes_in_place
        seeds: list[int | None] = [11 + i for i in range(N)]
        assert in_place.reset(seeds) == copied.reset(seeds) == []
        names = list(codec.dtype.names or ())
        assert same(rows, private, names)
        rng = random.Random(3)
        ends = 0
        for mode in (AutoReset.SAME_STEP, AutoReset.NEXT_STEP):
            for _ in range(60):
                actions = _valid_actions(private, rng)
                got = in_place.step(actions, mode)
                want = copied.step(actions, mode)
                assert got == want
                assert same(rows, private, names)
                ids = want[0]
                assert same(finals[ids], private_finals[ids], names)
                ends += len(want[0])
        assert ends > 0  # SAME_STEP kept final results
        assert not in_place.lay.results.view(np.uint8).any()  # the pool's own area: unused
    finally:
        in_place.close()
        copied.close()
        del rows, finals, area
        buf.close()


def test_a_dead_worker_of_an_in_place_pool_fails_its_envs_and_is_replaced(
    shm_file: tuple[int, str],
) -> None:
    fd, _ = shm_file
    schema = env_schema("pac")
    codec = schema["StepResult"]
    buf, area = shared_rows(fd, codec.dtype, 0)
    rows = area[:N]
    pool = WorkerPool(env_factory("pac"), schema, "StepResult", N, WORKERS, rows, area[N:])
    try:
        assert pool.writes_in_place
        assert pool.reset([1] * N) == []
        victim = pool.pids()[1]
        os.kill(victim, signal.SIGKILL)
        actions = _valid_actions(rows, random.Random(1))
        _, failures = pool.step(actions, AutoReset.NEXT_STEP)
        assert [i for i, _ in failures] == list(pool.env_ids(1))
        assert all(f"(pid {victim}" in str(exc) and "died" in str(exc) for _, exc in failures)
        assert pool.pids()[1] != victim
        for i in pool.env_ids(1):
            fate, ok = pool.restore(i, None)
            assert ok, fate
        _, failures = pool.step(_valid_actions(rows, random.Random(2)), AutoReset.NEXT_STEP)
        assert failures == []
    finally:
        pool.close()
        del rows, area
        buf.close()


def test_the_pool_spins_only_when_every_party_has_a_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(2)))
    assert default_spin(2) == 0  # 2 workers and the server on 2 cores: sleep at once
    assert default_spin(1) == 0
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(8)))
    assert default_spin(2) == 2_000
    assert default_spin(7) == 0


# -- asynchronous SENDs of Box actions: one vectorised screen instead of a check per env ---------


def _reach_runtime(num_envs: int, mode: AutoReset) -> Any:
    from transport.runtime.host import EnvHost

    schema = env_schema("reach")
    host = EnvHost(schema, env_factory("reach"), num_envs=num_envs)
    host.check()
    envs = host.create_envs()
    codec = host.result
    results = codec.view(bytearray(codec.size * num_envs), 0, count=num_envs)
    finals = codec.view(bytearray(codec.size * num_envs), 0, count=num_envs)
    runtime = host.runtime(envs, results, finals)
    runtime.set_autoreset(int(mode))
    runtime.reset_seed(4)
    return runtime


def test_a_clean_box_send_skips_the_per_env_checks_and_a_bad_one_is_refused() -> None:
    from transport.protocol import RequestError
    from transport.runtime.async_batches import AsyncBatches

    runtime = _reach_runtime(4, AutoReset.NEXT_STEP)
    batches = AsyncBatches(runtime)
    checked: list[int] = []
    real_check = runtime.check_action

    def counting(index: int, action: Any) -> bool:
        checked.append(index)
        return bool(real_check(index, action))

    runtime.check_action = counting
    clean = np.full((2, 2), 0.5, np.float32)
    batches.send(np.array([1, 3]), clean)
    assert checked == []  # screened at once: no per-env check
    assert batches.recv(2) == ([1, 3], [])
    bad = clean.copy()
    bad[1, 0] = 1.5  # outside -1..1
    try:
        batches.send(np.array([0, 2]), bad)
    except RequestError as exc:
        assert exc.text.startswith("env 2: action [1.5, 0.5] is not inside"), exc.text
    else:
        raise AssertionError("an out-of-bounds Box action was accepted")
    assert checked == [0, 2]  # the per-env checks found and named it
    assert batches.count == 0  # a refused SEND starts nothing
    runtime.close()


class SlowEchoEnv:
    """The echo env with a 0.3 s step, whose worker process bumps FINISHED 0.12 s late after
    its first op (a worker descheduled between its done word and the bump, as on a loaded
    machine): later than the server's 50 ms wait slice, sooner than the next op's step."""

    def __init__(self) -> None:
        import transport.runtime.pool as pool

        if not getattr(pool, "_late_once", False):
            real = pool._finish

            def late_once(word: Any, finish_at: Any) -> None:
                pool._finish = real
                time.sleep(0.12)
                real(word, finish_at)

            pool._finish = late_once
            pool._late_once = True  # type: ignore[attr-defined]
        self.env = env_factory("echo")()

    def spaces(self) -> Any:
        return self.env.spaces()

    def reset_into(self, seed: int | None, out: np.ndarray) -> None:
        self.env.reset_into(seed, out)

    def step_into(self, action: int, out: np.ndarray) -> None:
        time.sleep(0.3)
        self.env.step_into(action, out)


def test_a_late_finished_bump_never_ends_the_next_op_early() -> None:
    """The server returns from a fan-out only once every worker counted itself finished: a
    bump that came after a wait slice saw every done word must not count for the next op (it
    did: the step returned before the workers stepped, with the reset's rows)."""
    schema = env_schema("echo")
    codec = schema["StepResult"]
    rows = codec.view(bytearray(codec.size * 2), 0, count=2)
    finals = codec.view(bytearray(codec.size * 2), 0, count=2)
    pool = WorkerPool(SlowEchoEnv, schema, "StepResult", 2, 2, rows, finals)
    try:
        assert pool.reset([None, None]) == []
        pool.step(np.full(2, 3, dtype=np.uint8), AutoReset.DISABLED)
        assert rows["observation"][:, :2].tolist() == [[3, 1], [3, 1]]
    finally:
        pool.close()


class DieOrSleepEchoEnv:
    """The echo env whose step of action 9 ends its worker process at once, and whose other
    steps take 0.4 s: one worker dies while the other is still stepping."""

    def __init__(self) -> None:
        self.env = env_factory("echo")()

    def spaces(self) -> Any:
        return self.env.spaces()

    def reset_into(self, seed: int | None, out: np.ndarray) -> None:
        self.env.reset_into(seed, out)

    def step_into(self, action: int, out: np.ndarray) -> None:
        if action == 9:
            os._exit(3)
        time.sleep(0.4)
        self.env.step_into(action, out)


def test_a_death_never_takes_a_live_worker_still_stepping_for_dead() -> None:
    """When one worker dies mid-op, the fan-out still waits for the live ones: they finish
    their envs and are not "replaced" while their process runs on (they were: every worker not
    done at the death was reported dead, its envs failed, an orphan left stepping), and their
    FINISHED bumps do not leak into the next op."""
    schema = env_schema("echo")
    codec = schema["StepResult"]
    rows = codec.view(bytearray(codec.size * 2), 0, count=2)
    finals = codec.view(bytearray(codec.size * 2), 0, count=2)
    pool = WorkerPool(DieOrSleepEchoEnv, schema, "StepResult", 2, 2, rows, finals)
    try:
        assert pool.reset([None, None]) == []
        live = pool.pids()[1]
        _, failures = pool.step(np.array([9, 3], dtype=np.uint8), AutoReset.DISABLED)
        assert [i for i, _ in failures] == [0]
        assert pool.pids()[1] == live, "the live worker was replaced"
        assert rows["observation"][1, 0] == 3  # its env stepped
        fate, ok = pool.restore(0, None)
        assert ok, fate
        _, failures = pool.step(np.array([5, 6], dtype=np.uint8), AutoReset.DISABLED)
        assert failures == []
        assert rows["observation"][:, 0].tolist() == [5, 6]
    finally:
        pool.close()
