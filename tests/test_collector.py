"""The episode collector (seed 001) over real servers: B complete padded episodes, a job queue,
double buffering, and the same bytes for the same seed whatever the timing."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import transport
from transport.collector import EpisodeBatch, EpisodeCollector, request_episodes
from transport.errors import ActionError, AdapterError

from .servers import ServerProcess, unique_url

SCHEMES = ("unix", "http", "zmq+ipc", "zmq+tcp", "shm")


def pac_policy(obs: np.ndarray, env_ids: np.ndarray) -> np.ndarray:
    """A deterministic legal policy for pac: legal action number (steps so far) mod #legal."""
    masks = obs[:, 512:604] > 0
    steps = np.rint(obs[:, 605] * 256).astype(np.int64)
    return np.array([np.flatnonzero(m)[s % m.sum()] for m, s in zip(masks, steps, strict=True)])


def check_batch(batch: EpisodeBatch, size: int, max_len: int) -> None:
    """Shapes, padding and end flags of a batch of ``size`` episodes."""
    k = int(batch.lengths.max())
    assert batch.observations.shape == (size, k, 612)
    assert batch.actions.shape == batch.rewards.shape == batch.mask.shape == (size, k)
    assert 1 <= batch.lengths.min() and k <= max_len
    for row, length in enumerate(batch.lengths.tolist()):
        assert not batch.observations[row, length:].any()  # zero padding
        assert not batch.rewards[row, length:].any()
        ends = batch.terminated[row] | batch.truncated[row]
        assert ends.nonzero()[0].tolist() == [length - 1]  # only the last step ends it
        if batch.truncated[row, length - 1] and not batch.terminated[row, length - 1]:
            assert length == max_len  # the collector cut it
        # the first observation of an episode: stage 1, no steps yet
        assert batch.observations[row, 0, 605] == 0


def test_batch_of_complete_episodes_over_a_job_queue() -> None:
    with (
        ServerProcess(unique_url("unix"), env="pac", num_envs=3) as server,
        transport.connect(server.url, autoreset="next_step") as client,
        EpisodeCollector(client, pac_policy, max_len=80, batch_size=7, seed=11) as collector,
    ):
        batch = collector.request_episodes(timeout=60)
        check_batch(batch, 7, 80)
        assert batch.job_ids.tolist() == list(range(7))
        assert batch.seeds[:3].tolist() == [11, 12, 13]  # the first N jobs: seed + job index
        assert batch.terminated.any(axis=1).all()  # pac ends within 80 steps
        following = collector.request_episodes(timeout=60)
        assert following.job_ids.tolist() == list(range(7, 14))


def test_max_len_cuts_episodes_and_the_env_keeps_serving_jobs() -> None:
    with (
        ServerProcess(unique_url("unix"), env="pac", num_envs=2) as server,
        transport.connect(server.url, autoreset="next_step") as client,
    ):
        batch = request_episodes(client, 5, pac_policy, max_len=12, seed=3)
    check_batch(batch, 5, 12)
    assert batch.lengths.tolist() == [12] * 5
    assert batch.truncated[:, -1].all() and not batch.terminated.any()


def collect_twice(server_url: str, seed: int, slow_trainer: bool) -> list[bytes]:
    with (
        transport.connect(server_url, autoreset="next_step") as client,
        EpisodeCollector(client, pac_policy, max_len=40, batch_size=5, seed=seed) as collector,
    ):
        out = []
        for _ in range(2):
            out.append(collector.request_episodes(timeout=60).tobytes())
            if slow_trainer:
                time.sleep(0.3)  # the producer pauses meanwhile: must not change the result
        return out


def test_same_seed_same_bytes_whatever_the_timing() -> None:
    """A Python server over unix with a slow trainer and a Node server over shm with a fast one
    (different env and transport timings) give the same bytes; another seed differs."""
    with ServerProcess(unique_url("unix"), env="pac", num_envs=3) as python_server:
        first = collect_twice(python_server.url, 21, slow_trainer=True)
        other_seed = collect_twice(python_server.url, 22, slow_trainer=False)
    with ServerProcess(unique_url("shm"), env="pac", num_envs=3, lang="node") as node_server:
        second = collect_twice(node_server.url, 21, slow_trainer=False)
    assert first == second
    assert first != other_seed


def test_the_next_batch_fills_while_the_trainer_holds_one() -> None:
    """Double buffering: after the first batch is returned, the second completes without the
    trainer asking (polled with a generous bound; no timing asserted)."""
    with (
        ServerProcess(unique_url("unix"), env="pac", num_envs=2) as server,
        transport.connect(server.url, autoreset="next_step") as client,
        EpisodeCollector(client, pac_policy, max_len=30, batch_size=3, seed=1) as collector,
    ):
        held = collector.request_episodes(timeout=60)
        deadline = time.monotonic() + 60
        while collector.batches_ready() < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert collector.batches_ready() == 1  # ready while the trainer still holds ``held``
        time.sleep(0.2)
        assert collector.batches_ready() == 1  # backpressure: no third batch before asked
        assert held.lengths.shape == (3,)
        ready_before = threading.active_count()
        collector.request_episodes(timeout=60)
    assert threading.active_count() < ready_before  # close() joined the producer thread


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_backend(scheme: str) -> None:
    with (
        ServerProcess(unique_url(scheme), env="pac", num_envs=2) as server,
        transport.connect(server.url, autoreset="next_step") as client,
    ):
        batch = request_episodes(client, 3, pac_policy, max_len=16, seed=7)
    check_batch(batch, 3, 16)


def test_multi_client_over_two_servers() -> None:
    with (
        ServerProcess(unique_url("unix"), env="pac", num_envs=2) as one,
        ServerProcess(unique_url("zmq+ipc"), env="pac", num_envs=1, lang="node") as two,
        transport.connect_many([one.url, two.url], autoreset="next_step") as multi,
    ):
        batch = request_episodes(multi, 4, pac_policy, max_len=30, seed=5)
        with transport.connect(one.url, autoreset="disabled") as plain:
            with pytest.raises(AdapterError, match="next_step"):
                EpisodeCollector(plain, pac_policy, max_len=30, batch_size=4)
    check_batch(batch, 4, 30)
    assert batch.seeds[:3].tolist() == [5, 6, 7]


def test_a_policy_error_reaches_the_trainer() -> None:
    def broken(obs: np.ndarray, env_ids: np.ndarray) -> np.ndarray:
        raise RuntimeError("policy exploded")

    with (
        ServerProcess(unique_url("unix"), env="pac", num_envs=2) as server,
        transport.connect(server.url, autoreset="next_step") as client,
        EpisodeCollector(client, broken, max_len=10, batch_size=2) as collector,
        pytest.raises(RuntimeError, match="policy exploded"),
    ):
        collector.request_episodes(timeout=60)


def test_every_job_seeded_by_its_index_on_one_env_servers() -> None:
    """Over 1-env servers (a MultiClient of three, mixed languages and backends) each env is
    reset alone for its job: job j starts from seed + j, whichever env ran it."""
    from transport.envs.pac import PacEnv

    with (
        ServerProcess(unique_url("unix"), env="pac") as one,
        ServerProcess(unique_url("shm"), env="pac", lang="node") as two,
        ServerProcess(unique_url("zmq+tcp"), env="pac") as three,
        transport.connect_many([one.url, two.url, three.url], autoreset="next_step") as multi,
    ):
        batch = request_episodes(multi, 7, pac_policy, max_len=20, seed=40)
        with transport.connect(one.url, autoreset="next_step") as solo:
            alone = request_episodes(solo, 7, pac_policy, max_len=20, seed=40)
    check_batch(batch, 7, 20)
    assert batch.seeds.tolist() == [40 + j for j in batch.job_ids.tolist()]
    for row, seed in enumerate(batch.seeds.tolist()):
        first = np.asarray(PacEnv().reset(seed)["observation"], dtype=np.float32)
        np.testing.assert_array_equal(batch.observations[row, 0], first)
    # one env running every job in turn: the same episodes (job j is a function of seed + j)
    assert alone.tobytes() == batch.tobytes()


def test_a_policy_output_the_action_field_cannot_hold_is_refused() -> None:
    """The collector sends what the policy chose through the client's one action rule: floats
    for a Discrete field are an ActionError, never truncated into another action (before: 1.7
    was stepped as action 1)."""

    def policy(obs: np.ndarray, env_ids: np.ndarray) -> np.ndarray:
        return np.full(len(env_ids), 1.7)

    with (
        ServerProcess(unique_url("unix"), env="pac", num_envs=2) as server,
        transport.connect(server.url, autoreset="next_step") as client,
        EpisodeCollector(client, policy, max_len=10, batch_size=2, seed=1) as collector,
    ):
        with pytest.raises(ActionError, match="would be truncated"):
            collector.request_episodes(timeout=60)
