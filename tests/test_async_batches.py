"""Asynchronous batches (send / recv) on worker pools: the same bytes as lock-step, each env
reported once, a killed worker a typed error in bounded time. The backend contract checks are
in transport/testing/checks_async.py."""

from __future__ import annotations

import os
import random
import signal
import time

import numpy as np
import pytest

import transport.api as api
from transport.errors import EnvError, RemoteError, TransportTimeoutError
from transport.protocol import ErrorCode

from .servers import ServerProcess, unique_unix_url, unique_url
from .test_workers import children

NUM_ENVS = 4


def row_bytes(results: object, k: int) -> bytes:
    return b"".join(
        np.ascontiguousarray(results[name][k]).tobytes()  # type: ignore[index]
        for name in results  # type: ignore[attr-defined]
    )


def lockstep_trace(url: str, mode: str, rounds: int) -> list[bytes]:
    """Every env's results round by round, stepped in lock-step (env i's action from its mask)."""
    out: list[bytes] = []
    with api.connect(url, timeout=20, autoreset=mode) as client:
        result = client.reset(seed=3)
        out += [row_bytes(result, i) for i in range(NUM_ENVS)]
        rngs = [random.Random(i) for i in range(NUM_ENVS)]
        for _ in range(rounds):
            masks = result.action_mask
            actions = [rngs[i].choice(np.flatnonzero(masks[i]).tolist()) for i in range(NUM_ENVS)]
            result = client.step(actions)
            out += [row_bytes(result, i) for i in range(NUM_ENVS)]
            out += [bytes([i]) + row_bytes(f, ()) for i, f in client.finals]  # type: ignore[arg-type]
    return out


def async_trace(url: str, mode: str, rounds: int, batch: int) -> list[bytes]:
    """The same schedule with send / recv(batch): rows put back in env order each round."""
    out: list[bytes] = []
    with api.connect(url, timeout=20, autoreset=mode) as client:
        rngs = [random.Random(i) for i in range(NUM_ENVS)]
        client.async_reset(seed=3)
        for rnd in range(rounds + 1):
            rows: dict[int, bytes] = {}
            masks: dict[int, np.ndarray] = {}
            finals: list[bytes] = []
            while len(rows) < NUM_ENVS:
                got = client.recv(batch, copy=True)
                ids = got.env_ids.tolist()
                assert 1 <= len(ids) <= batch
                for k, i in enumerate(ids):
                    assert i not in rows, f"env {i} came back twice"
                    rows[i] = row_bytes(got.results, k)
                    masks[i] = np.array(got.results.action_mask[k])
                finals += [bytes([i]) + row_bytes(f, ()) for i, f in got.finals]  # type: ignore[arg-type]
            out += [rows[i] for i in range(NUM_ENVS)] + sorted(finals)
            if rnd == rounds:
                break
            ids = list(range(NUM_ENVS))
            actions = [rngs[i].choice(np.flatnonzero(masks[i]).tolist()) for i in ids]
            client.send(actions, ids)
    return out


@pytest.mark.parametrize("scheme", ["unix", "shm"])
@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_async_on_a_worker_pool_equals_lockstep(mode: str, scheme: str) -> None:
    rounds = 40
    with ServerProcess(unique_url(scheme), env="pac", num_envs=NUM_ENVS, seed=3) as local:
        expected = lockstep_trace(local.url, mode, rounds)
        assert async_trace(local.url, mode, rounds, batch=NUM_ENVS) == expected
    with ServerProcess(
        unique_url(scheme), env="pac", num_envs=NUM_ENVS, seed=3, extra=["--workers", "2"]
    ) as pooled:
        got = async_trace(pooled.url, mode, rounds, batch=NUM_ENVS // 2)
    assert len(got) == len(expected)
    assert got == expected


@pytest.mark.parametrize("scheme", ["unix", "shm"])
def test_heavy_tail_pool_returns_each_env_once(scheme: str) -> None:
    with (
        ServerProcess(
            unique_url(scheme), env="heavy_tail", num_envs=8, extra=["--workers", "4"]
        ) as s,
        api.connect(s.url, timeout=20) as client,
    ):
        client.async_reset(seed=1)
        seen: list[int] = []
        while len(seen) < 8:
            seen += client.recv(3).env_ids.tolist()
        assert sorted(seen) == list(range(8))
        for _ in range(30):
            client.send([1] * 8, list(range(8)))
            back: list[int] = []
            while len(back) < 8:
                ids = client.recv(4).env_ids.tolist()
                assert len(ids) <= 4
                back += ids
            assert sorted(back) == list(range(8))
        with pytest.raises(RemoteError) as info:
            client.recv()
        assert info.value.code == ErrorCode.ASYNC_STATE


@pytest.mark.parametrize("scheme", ["unix", "shm"])
def test_a_killed_worker_fails_recv_in_bounded_time(scheme: str) -> None:
    with (
        ServerProcess(
            unique_url(scheme), env="pac", num_envs=NUM_ENVS, seed=1, extra=["--workers", "2"]
        ) as s,
        api.connect(s.url, timeout=20, autoreset="next_step") as client,
    ):
        client.async_reset(seed=1)
        got = client.recv(NUM_ENVS)
        deadline = time.monotonic() + 20
        while len(workers := children(s.proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(workers) == 2, workers
        os.kill(workers[1], signal.SIGKILL)  # envs 2..3
        masks = got.results.action_mask
        order = got.env_ids.tolist()
        actions = [int(np.flatnonzero(masks[k])[0]) for k in range(NUM_ENVS)]
        client.send(actions, order)
        failed = False
        back: list[int] = []
        while len(back) < NUM_ENVS - 2 or not failed:
            try:
                back += client.recv(NUM_ENVS).env_ids.tolist()
            except EnvError as exc:
                assert "worker process 1" in exc.text and "died" in exc.text
                failed = True
        assert sorted(back) == [0, 1]
        client.send([0, 0], [2, 3])  # the recreated envs step again
        assert sorted(client.recv(NUM_ENVS).env_ids.tolist()) == [2, 3]


@pytest.mark.parametrize("scheme", ["unix", "shm"])
def test_gymnasium_async_vector_env_over_a_worker_pool(scheme: str) -> None:
    from transport.gym import RemoteAsyncVectorEnv

    with ServerProcess(
        unique_url(scheme), env="echo", num_envs=NUM_ENVS, extra=["--workers", "2"]
    ) as s:
        envs = RemoteAsyncVectorEnv(s.url, NUM_ENVS, batch_size=2)
        try:
            envs.async_reset(seed=0)
            steps = np.zeros(NUM_ENVS, dtype=int)
            for _ in range(20):
                seen: list[int] = []
                while len(seen) < NUM_ENVS:
                    obs, rewards, terminated, truncated, infos = envs.recv()
                    ids = infos["env_id"]
                    assert len(ids) <= 2 and obs.shape == (len(ids), 612)
                    assert (obs[:, 0] == np.where(steps[ids] > 0, ids + 1, 0)).all()
                    assert (obs[:, 1] == steps[ids]).all()
                    assert (rewards == obs[:, 0] / 4).all() and not (terminated | truncated).any()
                    seen += ids.tolist()
                assert sorted(seen) == list(range(NUM_ENVS))
                envs.send(np.arange(NUM_ENVS) + 1, np.arange(NUM_ENVS))
                steps += 1
            seen = []
            while len(seen) < NUM_ENVS:
                seen += envs.recv()[4]["env_id"].tolist()
            obs, *_ = envs.step(np.zeros(NUM_ENVS, dtype=int))  # lock-step again
            assert (obs[:, 1] == steps + 1).all()
        finally:
            envs.close()


def test_a_killed_workers_idle_envs_are_reset_for_the_next_send() -> None:
    """Env 3 is not in flight when its worker dies: its fresh env is reset at once, so the
    next send to it steps a reset env (it used to step a never-reset env and fail)."""
    with (
        ServerProcess(
            unique_unix_url(), env="pac", num_envs=NUM_ENVS, seed=1, extra=["--workers", "2"]
        ) as s,
        api.connect(s.url, timeout=20, autoreset="next_step") as client,
    ):
        client.async_reset(seed=1)
        got = client.recv(NUM_ENVS, copy=True)
        masks = {i: got.results.action_mask[k] for k, i in enumerate(got.env_ids.tolist())}
        deadline = time.monotonic() + 20
        while len(workers := children(s.proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(workers[1], signal.SIGKILL)  # envs 2..3
        client.send([int(np.flatnonzero(masks[i])[0]) for i in (0, 1, 2)], [0, 1, 2])
        back: list[int] = []
        with pytest.raises(EnvError):
            while True:
                back += client.recv(NUM_ENVS).env_ids.tolist()
        back += client.recv(NUM_ENVS).env_ids.tolist()
        assert sorted(back) == [0, 1]
        client.send([int(np.flatnonzero(masks[3])[0])], [3])
        assert client.recv().env_ids.tolist() == [3]


@pytest.mark.parametrize("scheme", ["unix", "shm"])
def test_a_recv_timeout_leaves_the_envs_in_flight(scheme: str) -> None:
    """A server that stops answering (SIGSTOP): recv times out, the envs stay in flight, and
    once it answers again the next recv returns them (nothing lost or answered twice)."""
    with (
        ServerProcess(unique_url(scheme), env="pac", num_envs=NUM_ENVS, seed=1) as s,
        api.connect(s.url, timeout=0.5, autoreset="next_step") as client,
    ):
        client.async_reset(seed=1)
        got = client.recv(NUM_ENVS)
        masks = got.results.action_mask
        actions = [int(np.flatnonzero(masks[k])[0]) for k in range(NUM_ENVS)]
        ids = got.env_ids.tolist()
        os.kill(s.proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10  # the signal takes effect when the kernel next runs it
        while _state(s.proc.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            with pytest.raises(TransportTimeoutError):  # unix: at send (SEND_RESP); shm: at recv
                client.send(actions[:2], ids[:2])
                client.recv(NUM_ENVS)
        finally:
            os.kill(s.proc.pid, signal.SIGCONT)
        back = client.recv(NUM_ENVS).env_ids.tolist()
        assert sorted(back) == sorted(ids[:2])
        with pytest.raises(RemoteError) as info:
            client.recv()
        assert info.value.code == ErrorCode.ASYNC_STATE
        client.step([0] * NUM_ENVS)  # lock-step works again


def _state(pid: int) -> str:
    """The process state letter of /proc/<pid>/stat (T: stopped)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]
