"""Vectorised env-steps/s: transport.gym.RemoteVectorEnv on every backend, next to gymnasium's
AsyncVectorEnv(shared_memory=True) and SB3's SubprocVecEnv on an equivalent local env.

Run (one run, every row side by side; short on purpose):
  pytest benchmarks/test_vector_bench.py --benchmark-enable -s

Rows, each at N = 1, 8, 32 envs:
  remote-<backend>   RemoteVectorEnv(url, N) against `transport-serve URL --env echo --num-envs N`
                     (Python server, next_step auto-reset), backends unix, http, zmq+ipc,
                     zmq+tcp, shm
  gymnasium-async    gymnasium.vector.AsyncVectorEnv(shared_memory=True) of N trivial envs
  sb3-subproc        stable_baselines3 SubprocVecEnv of N trivial envs
The trivial env has the same spaces (Box(612,) float32, Discrete(92)) and an echo-like step (it
writes the action into the observation), so every row pays for transport, not for simulation.
env-steps/s = N / mean seconds per batched step.
"""

from __future__ import annotations

import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.servers import ServerProcess, free_port

SIZES = [1, 8, 32]
BACKENDS = ["unix", "http", "zmq+ipc", "zmq+tcp", "shm"]
OBS_N, ACT_N = 612, 92
RESULTS: dict[str, float] = {}


def rounds_for(n: int) -> int:
    return {1: 2000, 8: 600, 32: 200}[n]


def measure(benchmark: Any, run: Callable[[], object], n: int, key: str) -> None:
    rounds = rounds_for(n)
    for _ in range(max(10, rounds // 10)):
        run()
    benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=0)
    rate = n / benchmark.stats.stats.mean
    benchmark.extra_info["env_steps_per_s"] = rate
    benchmark.extra_info["num_envs"] = n
    RESULTS[key] = rate


def url_for(backend: str, n: int) -> str:
    name = f"transport-bench-{uuid.uuid4().hex[:10]}"
    if backend == "unix":
        return f"unix://{tempfile.gettempdir()}/{name}.sock"
    if backend == "http":
        return f"http://127.0.0.1:{free_port()}"
    if backend == "zmq+ipc":
        return f"zmq+ipc://{tempfile.gettempdir()}/{name}"
    if backend == "zmq+tcp":
        return f"zmq+tcp://127.0.0.1:{free_port()}"
    return f"shm://{name}?num_envs={n}"


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.benchmark(group="vector env: env-steps/s")
def test_remote_vector_env(benchmark: Any, backend: str, n: int) -> None:
    from transport.gym import RemoteVectorEnv

    with ServerProcess(url_for(backend, n), env="echo", num_envs=n) as server:
        env = RemoteVectorEnv(server.url, n)
        try:
            env.reset(seed=0)
            actions = np.arange(n) % ACT_N
            measure(benchmark, lambda: env.step(actions), n, f"remote-{backend}/{n}")
        finally:
            env.close()


class TrivialEnv:
    """gymnasium.Env with the pac spaces and an echo-like step (built lazily: picklable)."""

    def __new__(cls) -> Any:
        import gymnasium as gym

        class Trivial(gym.Env):  # type: ignore[misc,unused-ignore]
            def __init__(self) -> None:
                self.observation_space = gym.spaces.Box(-np.inf, np.inf, (OBS_N,), np.float32)
                self.action_space = gym.spaces.Discrete(ACT_N)
                self.obs = np.zeros(OBS_N, dtype=np.float32)

            def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
                super().reset(seed=seed)
                self.obs[:] = 0
                return self.obs, {}

            def step(self, action: Any) -> Any:
                self.obs[0] = int(action)
                return self.obs, int(action) / 4, False, False, {}

        return Trivial()


def make_trivial() -> Any:
    return TrivialEnv()


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.benchmark(group="vector env: env-steps/s")
def test_gymnasium_async_vector_env(benchmark: Any, n: int) -> None:
    gym = pytest.importorskip("gymnasium")
    envs = gym.vector.AsyncVectorEnv([make_trivial] * n, shared_memory=True)
    try:
        envs.reset(seed=0)
        actions = np.arange(n) % ACT_N
        measure(benchmark, lambda: envs.step(actions), n, f"gymnasium-async/{n}")
    finally:
        envs.close()


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.benchmark(group="vector env: env-steps/s")
def test_sb3_subproc_vec_env(benchmark: Any, n: int) -> None:
    vec_env = pytest.importorskip("stable_baselines3.common.vec_env")
    envs = vec_env.SubprocVecEnv([make_trivial] * n)
    try:
        envs.reset()
        actions = np.arange(n) % ACT_N
        measure(benchmark, lambda: envs.step(actions), n, f"sb3-subproc/{n}")
    finally:
        envs.close()


def test_table(benchmark: Any) -> None:
    """The rows above as one table (env-steps/s), printed and kept in extra_info."""
    rows = ["remote-" + b for b in BACKENDS] + ["gymnasium-async", "sb3-subproc"]
    lines = ["| row | " + " | ".join(f"N={n}" for n in SIZES) + " |"]
    lines.append("|---|" + "---:|" * len(SIZES))
    for row in rows:
        cells = [RESULTS.get(f"{row}/{n}") for n in SIZES]
        lines.append(
            f"| {row} | " + " | ".join("-" if c is None else f"{c:,.0f}" for c in cells) + " |"
        )
    table = "\n".join(lines)
    print("\n" + table)
    benchmark.extra_info.update(RESULTS)
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
