"""A Node vector env (one JS object stepping all N envs, issue 24 item 1) served by the Node
server to the Python client over unix:// and shm://: its trajectories equal, byte for byte,
those of the same envs as N one-env objects on a Node server, in every auto-reset mode, with
seeds (env i: seed + i), per-env seeds, finals, masks and refusals."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

import transport.api as api
from transport.errors import RemoteError

from .servers import ServerProcess, unique_unix_url

NUM_ENVS = 4
MODULE = "node_bridge/dist/envs/vector_echo.js"
VECTOR = f"{MODULE}:EpisodicVectorEchoEnv"
SINGLE = f"{MODULE}:EpisodicEchoEnv"
MASKED = 91  # the action the episodic echo envs mask out


def url_of(backend: str) -> str:
    if backend == "shm":
        return f"shm://test-vec-{uuid.uuid4().hex[:12]}?num_envs={NUM_ENVS}"
    return unique_unix_url()


@pytest.fixture(scope="module", params=["unix", "shm"])
def servers(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(vector env server URL, one-env-objects server URL), both Node, one backend."""
    backend = str(request.param)
    with (
        ServerProcess(url_of(backend), env=VECTOR, lang="node", num_envs=NUM_ENVS) as vector,
        ServerProcess(url_of(backend), env=SINGLE, lang="node", num_envs=NUM_ENVS) as single,
    ):
        yield vector.url, single.url


def fields(view: object) -> bytes:
    """Every field's bytes (an shm record dtype has the slot's offsets: not .tobytes())."""
    return b"".join(np.ascontiguousarray(view[name]).tobytes() for name in view)  # type: ignore[index, attr-defined]


def trace(url: str, mode: str, steps: int = 80) -> list[bytes]:
    """Results, finals and refusals of a seeded random walk (allowed actions from the mask)."""
    out: list[bytes] = []
    rng = random.Random(5)
    with api.connect(url, timeout=20, autoreset=mode) as client:
        result = client.reset(seed=11)
        out.append(fields(result))
        for k in range(steps):
            if mode == "disabled" and np.asarray(result.done).any():
                seeds = [
                    rng.randrange(1 << 20) if rng.random() < 0.5 else None for _ in range(NUM_ENVS)
                ]
                result = client.reset(seed=seeds if k % 2 else rng.randrange(1 << 20))
                out.append(fields(result))
                continue
            masks = np.asarray(result.action_mask)
            actions = [rng.choice(np.flatnonzero(masks[i]).tolist()) for i in range(NUM_ENVS)]
            if k % 25 == 7:
                actions[k % NUM_ENVS] = MASKED  # refused by both, nothing steps
                with pytest.raises(RemoteError) as refused:
                    client.step(actions)
                out.append(f"{refused.value.code} {refused.value}".encode())
                continue
            result = client.step(actions)
            out.append(fields(result))
            out += [bytes([i]) + fields(final) for i, final in client.finals]
    return out


@pytest.mark.parametrize("mode", ["disabled", "next_step", "same_step"])
def test_vector_env_trajectories_equal_one_env_objects(servers: tuple[str, str], mode: str) -> None:
    vector_url, single_url = servers
    got, expected = trace(vector_url, mode), trace(single_url, mode)
    assert len(got) == len(expected)
    for k, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a == b, f"entry {k} differs"
    if mode == "same_step":  # episodes ended: their final results were compared too
        assert any(len(entry) == 1 + len(got[0]) // NUM_ENVS for entry in got)


def test_seeds_are_seed_plus_i_and_the_mask_is_the_envs(servers: tuple[str, str]) -> None:
    vector_url, _ = servers
    with api.connect(vector_url, timeout=20) as client:
        result = client.reset(seed=1000)
        assert np.asarray(result.observation)[:, 2].tolist() == [1000, 1001, 1002, 1003]
        result = client.reset(seed=[7, None, 9, None])
        assert np.asarray(result.observation)[:, 2].tolist() == [7, -1, 9, -1]
        assert not np.asarray(result.action_mask)[:, MASKED].any()
        stepped = client.step([3, 4, 5, 6])
        assert np.asarray(stepped.observation)[:, :2].tolist() == [[3, 1], [4, 1], [5, 1], [6, 1]]
        assert np.asarray(stepped.reward).tolist() == [0.75, 1.0, 1.25, 1.5]
