"""The Node server's worker threads (`transport-serve URL --lang node --workers K`,
node_bridge/src/workers.ts).

Seeded pac games under a seeded random legal policy, 8 envs per connection: the Node server with
worker threads gives byte-identical traces to the Node server without workers and to the Python
server with 2 worker processes, in every auto-reset mode, over unix:// and over shm:// (where
each lease gets its own pool and the records are copied into the slots).
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import transport.api as api
from transport.backends.shm.region import SlotCommand

from .servers import ServerProcess, require_lang, unique_unix_url

NUM_ENVS = 8
GAMES = 32
"""Games per auto-reset trace, counted over the 8 envs: about 4 per env (a game lasts ~70
steps: ~300 steps a trace), so every env on either side of the worker split ends and restarts
several times."""
DISABLED_GAMES = 10
"""Without auto-reset: rounds of a seeded reset of all 8 envs, then steps until one ends (~50
steps a round: ~550 steps over about 10 rounds of 8 seeded resets)."""
MAX_STEPS = 2000


def pac_server(
    url: str, *, lang: str = "node", num_envs: int = NUM_ENVS, workers: int, seed: int | None = None
) -> ServerProcess:
    """`transport-serve URL --env pac --lang LANG --num-envs N --workers K`."""
    require_lang(lang)
    extra = ["--workers", str(workers)] if workers else []
    return ServerProcess(url, env="pac", lang=lang, num_envs=num_envs, seed=seed, extra=extra)


def shm_url() -> str:
    return f"shm://test-nw-{uuid.uuid4().hex[:10]}?num_envs={NUM_ENVS}"


def legal(result: object, policy: random.Random) -> list[int]:
    masks = result.action_mask  # type: ignore[attr-defined]
    return [policy.choice(np.flatnonzero(masks[i]).tolist()) for i in range(NUM_ENVS)]


def play(url: str, mode: str) -> tuple[str, int]:
    """GAMES episodes (DISABLED_GAMES without auto-reset), counted over the 8 envs; the digest
    of every result and final result."""
    digest = hashlib.sha256()
    games = steps = 0
    with api.connect(url, timeout=30, autoreset=mode) as client:
        policy = random.Random(11)
        if mode == "disabled":
            round_ = 0
            while games < DISABLED_GAMES:  # reset all, step until one env ends, again
                result = client.reset(seed=1000 + round_ * NUM_ENVS)
                digest.update(result.record.tobytes())
                for _ in range(MAX_STEPS):
                    result = client.step(legal(result, policy))
                    digest.update(result.record.tobytes())
                    steps += 1
                    if result.done.any():
                        games += int(result.done.sum())
                        break
                else:
                    pytest.fail(f"no game ended within {MAX_STEPS} steps")
                round_ += 1
        else:
            result = client.reset(seed=1000)
            digest.update(result.record.tobytes())
            while games < GAMES:
                result = client.step(legal(result, policy))
                digest.update(result.record.tobytes())
                steps += 1
                if mode == "next_step":
                    games += int(result.done.sum())
                else:
                    for index, final in client.finals:
                        digest.update(bytes([index]) + final.record.tobytes())
                        games += 1
                assert steps < 50 * MAX_STEPS
            # a seeded reset after a stream of steps: every env restarts
            digest.update(client.reset(seed=77).record.tobytes())
    return digest.hexdigest(), steps


Trio = Callable[[str], tuple[ServerProcess, ServerProcess, ServerProcess]]


@pytest.fixture(scope="module")
def trio() -> Iterator[Trio]:
    """Per scheme, started once for the module: the Node server with 2 worker threads, the Node
    server without workers and the Python server with 2 worker processes. Each mode's game is a
    session of its own (over shm a lease of its own: a fresh pool), so a server serves the three
    modes one after another, and every session starts with seeded resets."""
    started: dict[str, tuple[ServerProcess, ServerProcess, ServerProcess]] = {}
    with contextlib.ExitStack() as stack:

        def get(scheme: str) -> tuple[ServerProcess, ServerProcess, ServerProcess]:
            if scheme not in started:
                url = unique_unix_url if scheme == "unix" else shm_url
                started[scheme] = (
                    stack.enter_context(pac_server(url(), workers=2)),
                    stack.enter_context(pac_server(url(), workers=0)),
                    stack.enter_context(pac_server(url(), lang="python", workers=2)),
                )
            return started[scheme]

        yield get


@pytest.mark.parametrize("mode", ["disabled", "next_step", "same_step"])
def test_node_worker_threads_give_byte_identical_pac_traces(mode: str, trio: Trio) -> None:
    threads, in_process, python = (play(server.url, mode) for server in trio("unix"))
    assert threads[1] > 50
    assert threads == in_process
    assert threads == python


@pytest.mark.parametrize("mode", ["disabled", "next_step", "same_step"])
def test_node_worker_threads_over_shm(mode: str, trio: Trio) -> None:
    threads, in_process, python = (play(server.url, mode) for server in trio("shm"))
    assert threads[1] > 50
    assert threads == in_process
    assert threads == python


def test_shm_worker_pool_per_lease_and_subset_refused() -> None:
    """A second lease gets fresh envs (its own pool); a one-env request is BAD_BATCH."""
    with pac_server(shm_url(), workers=3, seed=5) as server:
        with api.connect(server.url, timeout=30) as client:
            first = client.reset().record.copy()
            client.step([int(np.flatnonzero(m)[0]) for m in client.reset().action_mask])
        with api.connect(server.url, timeout=30) as client:
            again = client.reset().record.copy()
            assert again.tobytes() == first.tobytes()  # the --seed S + i of a fresh lease
            # a mixed request (slot 0 RESET, the others STEP) is answered slot by slot
            raw: Any = client.channel
            raw._commands[:] = SlotCommand.STEP
            raw._commands[0] = SlotCommand.RESET
            raw._last_cmd = -1
            rc = raw._roundtrip(raw._ctx, raw._timeout_ns)
            assert rc > 0
            with pytest.raises(Exception, match="a worker pool steps and resets every env"):
                raw._raise(rc)
            assert client.reset().record.tobytes() != b""  # still usable


def test_uneven_split_and_more_workers_than_envs() -> None:
    with pac_server(unique_unix_url(), workers=3) as server:
        three = play(server.url, "next_step")
    with pac_server(unique_unix_url(), workers=0) as server:
        reference = play(server.url, "next_step")
    assert three == reference
    with pac_server(unique_unix_url(), num_envs=2, workers=5, seed=4) as server:
        with api.connect(server.url, timeout=30) as client:
            result = client.reset()
            assert result.record.shape == (2,)
            client.step([int(np.flatnonzero(result.action_mask[i])[0]) for i in range(2)])
