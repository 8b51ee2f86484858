"""The Node server's worker threads (`serve.js URL --workers K`, node_bridge/src/workers.ts).

Seeded pac games under a seeded random legal policy, 8 envs per connection: the Node server with
2 worker threads gives byte-identical traces to the Node server without workers and to the
Python server with 2 worker processes, in every auto-reset mode.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import subprocess

import numpy as np
import pytest

import transport.api as api

from .servers import NODE_SERVER, ROOT, ServerProcess, require_lang, unique_unix_url

NUM_ENVS = 8
GAMES = 100
MAX_STEPS = 2000


class NodeServer(ServerProcess):
    """`node serve.js URL --env pac ...` run directly (transport-serve --lang node refuses
    --workers)."""

    def __init__(self, url: str, *, num_envs: int, workers: int, seed: int | None = None) -> None:
        require_lang("node")
        node = shutil.which("node")
        assert node is not None
        command = [node, str(NODE_SERVER), url, "--env", "pac", "--num-envs", str(num_envs)]
        if workers:
            command += ["--workers", str(workers)]
        if seed is not None:
            command += ["--seed", str(seed)]
        self.requested_url = url
        self.proc = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.url = self._wait_ready(20.0)


def legal(result: object, policy: random.Random) -> list[int]:
    masks = result.action_mask  # type: ignore[attr-defined]
    return [policy.choice(np.flatnonzero(masks[i]).tolist()) for i in range(NUM_ENVS)]


def play(url: str, mode: str) -> tuple[str, int]:
    """GAMES episodes (counted over the 8 envs); the digest of every result and final result."""
    digest = hashlib.sha256()
    games = steps = 0
    with api.connect(url, timeout=30, autoreset=mode) as client:
        policy = random.Random(11)
        if mode == "disabled":
            round_ = 0
            while games < GAMES:  # reset all, step until one env ends its game, again
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


@pytest.mark.parametrize("mode", ["disabled", "next_step", "same_step"])
def test_node_worker_threads_give_byte_identical_pac_traces(mode: str) -> None:
    require_lang("node")
    with NodeServer(unique_unix_url(), num_envs=NUM_ENVS, workers=2) as server:
        threads = play(server.url, mode)
    with NodeServer(unique_unix_url(), num_envs=NUM_ENVS, workers=0) as server:
        in_process = play(server.url, mode)
    with ServerProcess(
        unique_unix_url(), env="pac", num_envs=NUM_ENVS, extra=["--workers", "2"]
    ) as server:
        python = play(server.url, mode)
    assert threads[1] > 50
    assert threads == in_process
    assert threads == python


def test_uneven_split_and_more_workers_than_envs() -> None:
    require_lang("node")
    with NodeServer(unique_unix_url(), num_envs=NUM_ENVS, workers=3) as server:
        three = play(server.url, "next_step")
    with NodeServer(unique_unix_url(), num_envs=NUM_ENVS, workers=0) as server:
        reference = play(server.url, "next_step")
    assert three == reference
    with NodeServer(unique_unix_url(), num_envs=2, workers=5, seed=4) as server:
        with api.connect(server.url, timeout=30) as client:
            result = client.reset()
            assert result.record.shape == (2,)
            client.step([int(np.flatnonzero(result.action_mask[i])[0]) for i in range(2)])


def test_workers_with_shm_is_refused() -> None:
    require_lang("node")
    node = shutil.which("node")
    assert node is not None
    done = subprocess.run(
        [node, str(NODE_SERVER), "shm://test-nw-refused?num_envs=2", "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert "--workers is not supported with shm://" in done.stderr
