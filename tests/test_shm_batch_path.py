"""The batched shm path at scale (issue 24): lock-step results are views of the slots (no copy, no
per-step objects), and asynchronous RECV (the answered slots gathered into the body in byte runs,
no loop per slot) hands out the same bytes as lock-step, finals and env errors included."""

from __future__ import annotations

import functools
import random
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

import transport.api as api
from transport.backends.shm import ShmChannel
from transport.errors import EnvError

from .servers import ServerProcess
from .test_env_errors import POISON, FlakyEnv

NUM_ENVS = 24


def row_bytes(results: object, k: int | tuple[()]) -> bytes:
    return b"".join(
        np.ascontiguousarray(results[name][k]).tobytes()  # type: ignore[index]
        for name in results  # type: ignore[attr-defined]
    )


@pytest.fixture(scope="module")
def pac_url() -> Iterator[str]:
    url = f"shm://test-sbp-{uuid.uuid4().hex[:12]}?num_envs={NUM_ENVS}"
    with ServerProcess(url, env="pac", num_envs=NUM_ENVS) as server:
        yield server.url


def test_lockstep_results_are_views_of_the_slots(pac_url: str) -> None:
    with api.connect(pac_url, timeout=20) as client:
        channel = client.channel
        assert isinstance(channel, ShmChannel)
        client.reset(seed=1)
        first = client.step(np.zeros(NUM_ENVS, dtype=np.int64))
        second = client.step(np.zeros(NUM_ENVS, dtype=np.int64))
        assert second is first  # the same view object each step: nothing built per step
        obs = second.observation
        assert not obs.flags.owndata and obs.strides[0] == channel.layout.slot_size
        assert np.shares_memory(obs, channel.result_records(memoryview(b""), None, NUM_ENVS, False))  # type: ignore[arg-type]


def lockstep_trace(url: str, mode: str, rounds: int) -> list[bytes]:
    """Every env's results round by round (env i's action from its mask), finals after."""
    out: list[bytes] = []
    with api.connect(url, timeout=20, autoreset=mode) as client:
        result = client.reset(seed=5)
        out += [row_bytes(result, i) for i in range(NUM_ENVS)]
        rngs = [random.Random(i) for i in range(NUM_ENVS)]
        for _ in range(rounds):
            masks = result.action_mask
            actions = [rngs[i].choice(np.flatnonzero(masks[i]).tolist()) for i in range(NUM_ENVS)]
            result = client.step(actions)
            out += [row_bytes(result, i) for i in range(NUM_ENVS)]
            out += sorted(bytes([i]) + row_bytes(f, ()) for i, f in client.finals)
    return out


def async_trace(url: str, mode: str, rounds: int, batch: int) -> tuple[list[bytes], int]:
    """The same schedule with send / recv(batch) (rows put back in env order each round), and
    how many finals RECV handed out."""
    out: list[bytes] = []
    ended = 0
    with api.connect(url, timeout=20, autoreset=mode) as client:
        rngs = [random.Random(i) for i in range(NUM_ENVS)]
        client.async_reset(seed=5)
        for rnd in range(rounds + 1):
            rows: dict[int, bytes] = {}
            masks: dict[int, np.ndarray] = {}
            finals: list[bytes] = []
            while len(rows) < NUM_ENVS:
                got = client.recv(batch, copy=True)
                for k, i in enumerate(got.env_ids.tolist()):
                    assert i not in rows, f"env {i} came back twice"
                    rows[i] = row_bytes(got.results, k)
                    masks[i] = np.array(got.results.action_mask[k])
                finals += [bytes([i]) + row_bytes(f, ()) for i, f in got.finals]
            ended += len(finals)
            out += [rows[i] for i in range(NUM_ENVS)] + sorted(finals)
            if rnd == rounds:
                break
            ids = list(range(NUM_ENVS))
            random.Random(rnd).shuffle(ids)  # any order: each env's action goes to its slot
            client.send([rngs[i].choice(np.flatnonzero(masks[i]).tolist()) for i in ids], ids)
    return out, ended


@pytest.mark.parametrize("mode", ["same_step", "next_step"])
def test_async_recv_hands_out_the_lockstep_bytes(pac_url: str, mode: str) -> None:
    rounds = 250
    expected = lockstep_trace(pac_url, mode, rounds)
    got, ended = async_trace(pac_url, mode, rounds, batch=7)
    assert got == expected
    if mode == "same_step":
        assert ended > 0  # the finals' byte runs were exercised


def test_async_recv_names_the_failed_env_and_keeps_the_others() -> None:
    url = f"shm://test-sbp-flaky-{uuid.uuid4().hex[:12]}?num_envs=8"
    FlakyEnv.broken_resets = 0
    with api.Server(FlakyEnv, url, num_envs=8).start() as server:
        with api.connect(server.url, timeout=20) as client:
            client.async_reset(seed=1)
            client.recv(8)
            actions = [1] * 8
            actions[5] = POISON
            client.send(actions, list(range(8)))
            with pytest.raises(EnvError) as info:
                client.recv(8)
            assert info.value.env_id == 5
            got = client.recv(8, copy=True)  # the envs that stepped stay answered
            ids = got.env_ids.tolist()
            assert 5 not in ids and sorted(ids) == [0, 1, 2, 3, 4, 6, 7]
            assert (got.results.observation[:, 0] == 1).all()


def test_a_vectorised_env_whose_episodes_end_together_hands_out_every_final() -> None:
    """SAME_STEP over shm with every env ending in the same step (the server stamps the final
    areas of all of them at once)."""
    from transport.envs.vector_echo import VectorEchoEnv
    from transport.generated import pac_env

    n, length = 16, 3
    url = f"shm://test-sbp-vec-{uuid.uuid4().hex[:12]}?num_envs={n}"
    factory = functools.partial(VectorEchoEnv, n, episode_len=length)
    with api.Server(factory, url, schema=pac_env.SCHEMA, num_envs=n).start() as server:
        with api.connect(server.url, timeout=20, autoreset="same_step") as client:
            client.reset()
            for step in range(1, 2 * length + 1):
                result = client.step(np.full(n, 2, dtype=np.int64))
                finals = client.finals
                if step % length:
                    assert finals == [] and (result.observation[:, 1] == step % length).all()
                    continue
                assert sorted(i for i, _ in finals) == list(range(n))
                for _, final in finals:
                    assert final.done == 1 and final.observation[1] == length
                assert not result.done.any()  # already reset: fresh episodes
