"""Worker processes (`transport-serve --workers K`): byte-identical traces, dead workers."""

from __future__ import annotations

import os
import random
import signal
import time
import uuid

import numpy as np
import pytest

import transport.api as api
from transport.envs import env_factory, env_schema
from transport.envs.echo import EchoEnv
from transport.errors import EnvError
from transport.generated import pac_env
from transport.protocol import AutoReset
from transport.runtime.pool import WorkerPool, _split

from .servers import ServerProcess, unique_unix_url

NUM_ENVS = 4


def shm_url(num_envs: int = NUM_ENVS) -> str:
    return f"shm://test-wk-{uuid.uuid4().hex[:12]}?num_envs={num_envs}"


def fields(view: object) -> bytes:
    return b"".join(np.ascontiguousarray(view[name]).tobytes() for name in view)  # type: ignore[index, attr-defined]


def trace(url: str, mode: str, steps: int = 250) -> list[bytes]:
    """A seeded random walk: every result and final result, field bytes."""
    out: list[bytes] = []
    with api.connect(url, timeout=20, autoreset=mode) as client:
        result, rng = client.reset(), random.Random(5)  # unseeded: the server's --seed
        out.append(fields(result))
        for _ in range(steps):
            masks = result.action_mask
            actions = [rng.choice(np.flatnonzero(masks[i]).tolist()) for i in range(NUM_ENVS)]
            result = client.step(actions)
            out.append(fields(result))
            out += [bytes([i]) + fields(final) for i, final in client.finals]
        client.reset(seed=77)
        out.append(fields(client.reset(seed=77)))
    return out


def children(pid: int) -> list[int]:
    """The worker processes of a server (its children running multiprocessing.spawn)."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as fh:
            found += [int(p) for p in fh.read().split()]
    workers = []
    for child in sorted(found):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except FileNotFoundError:
            continue
        if b"spawn_main" in cmdline:
            workers.append(child)
    return workers


def test_split_is_even() -> None:
    assert _split(8, 3) == [(0, 3), (3, 6), (6, 8)]
    assert _split(4, 2) == [(0, 2), (2, 4)]


@pytest.mark.parametrize("mode", ["same_step", "next_step"])
def test_worker_pool_gives_byte_identical_pac_traces(mode: str) -> None:
    with ServerProcess(unique_unix_url(), env="pac", num_envs=NUM_ENVS, seed=3) as local:
        expected = trace(local.url, mode)
    with ServerProcess(
        unique_unix_url(), env="pac", num_envs=NUM_ENVS, seed=3, extra=["--workers", "2"]
    ) as pooled:
        assert trace(pooled.url, mode) == expected
    with ServerProcess(
        shm_url(), env="pac", num_envs=NUM_ENVS, seed=3, extra=["--workers", "3"]
    ) as shm_pooled:
        assert trace(shm_pooled.url, mode) == expected


@pytest.mark.parametrize("scheme", ["unix", "shm"])
def test_a_killed_worker_is_a_typed_error_naming_its_envs(scheme: str) -> None:
    url = unique_unix_url() if scheme == "unix" else shm_url()
    with (
        ServerProcess(url, env="pac", num_envs=NUM_ENVS, seed=1, extra=["--workers", "2"]) as s,
        api.connect(s.url, timeout=20, autoreset="next_step") as client,
    ):
        result = client.reset()
        deadline = time.monotonic() + 20
        while len(workers := children(s.proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(workers) == 2, workers
        os.kill(workers[1], signal.SIGKILL)  # the second worker: envs 2..3
        with pytest.raises(EnvError) as info:
            for _ in range(3):
                masks = result.action_mask
                result = client.step([int(np.flatnonzero(m)[0]) for m in masks])
        error = info.value
        assert error.env_id == 2
        assert "env 2: worker process 1" in error.text and "env 3: worker process 1" in error.text
        assert "envs 2..3" in error.text and "died" in error.text
        assert "recreated in a new worker process" in error.text
        for _ in range(20):  # the server keeps serving: the envs were recreated and reset
            result = client.step([int(np.flatnonzero(m)[0]) for m in result.action_mask])
        assert len(children(s.proc.pid)) == 2


def test_pool_in_process_api() -> None:
    codec = pac_env.SCHEMA["StepResult"]
    dest = codec.view(bytearray(codec.size * 2), 0, count=2)
    pool = WorkerPool(env_factory("pac"), env_schema("pac"), "StepResult", 2, 2, dest)
    try:
        assert pool.reset([1, 2]) == []
        assert dest["observation"].any()
        actions = [int(np.flatnonzero(m)[0]) for m in dest["action_mask"]]
        ended, failures = pool.step(actions, AutoReset.NEXT_STEP)
        assert failures == [] and ended == []
        assert len(pool.pids()) == 2
    finally:
        pool.close()


class CountedEcho(EchoEnv):
    """An echo env counting, per process, the envs made and closed."""

    made = 0
    closed = 0

    def __init__(self) -> None:
        super().__init__()
        type(self).made += 1

    def close(self) -> None:
        type(self).closed += 1


def test_the_serving_process_makes_no_env_per_client() -> None:
    """With worker processes the envs live in the workers: the serving process makes one env
    at start (its spaces, checked and closed), not one more per client that it never closed."""
    CountedEcho.made = CountedEcho.closed = 0
    url = unique_unix_url()
    server = api.Server(CountedEcho, url, num_envs=NUM_ENVS, workers=2).start()
    try:
        assert (CountedEcho.made, CountedEcho.closed) == (1, 1)
        for _ in range(3):
            with api.connect(url, timeout=30) as client:
                client.reset(seed=1)
                client.step([1] * NUM_ENVS)
        assert (CountedEcho.made, CountedEcho.closed) == (1, 1)
    finally:
        server.close()
    assert (CountedEcho.made, CountedEcho.closed) == (1, 1)
